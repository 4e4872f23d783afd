// baton.cu: the one translation unit of the CUDA kernels (make kernels
// compiles it into kernels.fatbin). The kernel names are the
// BK_KERNELS list below; the Go backend looks each one up by name.
#include "common.cuh"
#include "gemv.cuh"
#include "elementwise.cuh"
#include "kv.cuh"
#include "attention.cuh"
#include "attn_mma.cuh"
#include "moe.cuh"
#include "sample.cuh"

// BK_KERNELS(X) applies X to every kernel (the fake driver of the Go
// tests registers them with it).
#define BK_KERNELS(X)       \
  X(bk_gemv_f32)            \
  X(bk_gemv_f16)            \
  X(bk_gemv_bf16)           \
  X(bk_gemv_q8_0)           \
  X(bk_dequant_rows)        \
  X(bk_f32_to_f16)          \
  X(bk_f32_to_bf16)         \
  X(bk_rmsnorm)             \
  X(bk_add_rmsnorm)         \
  X(bk_rope)                \
  X(bk_swiglu)              \
  X(bk_add)                 \
  X(bk_gather_rows)         \
  X(bk_store_kv)            \
  X(bk_rope_store_kv)       \
  X(bk_page_pack)           \
  X(bk_page_unpack)         \
  X(bk_page_sum)            \
  X(bk_attn_f32_m4)         \
  X(bk_attn_f16_m4)         \
  X(bk_attn_bf16_m4)        \
  X(bk_attn_f32_m8)         \
  X(bk_attn_f16_m8)         \
  X(bk_attn_bf16_m8)        \
  X(bk_attn_combine)        \
  X(bk_moe_gather)          \
  X(bk_moe_gemv)            \
  X(bk_moe_scatter)         \
  X(bk_gemv_q4_0)           \
  X(bk_gemv_q4_1)           \
  X(bk_gemv_q5_0)           \
  X(bk_gemv_q5_1)           \
  X(bk_gemv_q4_k)           \
  X(bk_gemv_q5_k)           \
  X(bk_gemv_q6_k)           \
  X(bk_gemv_q3_k)           \
  X(bk_gemv_q2_k)           \
  X(bk_sample)              \
  X(bk_attn_mma_f16_hd64)   \
  X(bk_attn_mma_bf16_hd64)  \
  X(bk_attn_mma_f16_hd128)  \
  X(bk_attn_mma_bf16_hd128) \
  X(bk_attn_mma_f16_hd256)  \
  X(bk_attn_mma_bf16_hd256) \
  X(bk_dequant_rows_f16)    \
  X(bk_attn_e4m3_m4)        \
  X(bk_attn_e4m3_m8)        \
  X(bk_attn_mma_e4m3_hd64)  \
  X(bk_attn_mma_e4m3_hd128) \
  X(bk_attn_mma_e4m3_hd256)
