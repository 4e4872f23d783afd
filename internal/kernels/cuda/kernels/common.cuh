// common.cuh: definitions shared by every baton kernel.
//
// The kernels follow internal/kernels/ref exactly (the plain-Go definition);
// each file says where its arithmetic differs (float32 accumulation order,
// tensor-core inputs) and the Go tests state the tolerances.
//
// Built two ways:
//   - by nvcc (make kernels) into kernels.fatbin, for sm_80, sm_90 and
//     compute_90 PTX;
//   - with BK_EMU defined, by the host C++ compiler, into the CPU emulation
//     the fake driver of the Go tests runs (internal/kernels/cuda/testdata/
//     fakecuda): bk_emu.h then supplies threadIdx, __syncthreads, warp
//     shuffles and the rest, so the same source is tested without a GPU.
//
// Rules the emulation relies on (they are also good CUDA): no CUDA headers
// beyond what nvcc includes implicitly; every __syncthreads is reached by
// all threads of a block that have not returned; every warp collective
// (bk_warp_sum, bk_warp_max) by all 32 lanes of the warp; dynamic shared
// memory is declared with BK_DYN_SMEM.
#pragma once

#ifdef BK_EMU
#include "bk_emu.h"
#else
#include <stdint.h>
#define BK_DYN_SMEM(T, name) extern __shared__ T name[]
#endif

// Weight dtypes: the values of kernels.DType.
#define BK_F32 0
#define BK_F16 1
#define BK_Q8_0 2
#define BK_BF16 3
#define BK_Q4_0 4
#define BK_Q4_1 5
#define BK_Q5_0 6
#define BK_Q5_1 7
#define BK_Q4_K 8
#define BK_Q5_K 9
#define BK_Q6_K 10
#define BK_Q3_K 11
#define BK_Q2_K 12
// KV-only dtype (kernels.F8E4M3): never a weight's, so never given to
// bk_qk or bk_qbytes.
#define BK_E4M3 13

// Elements per block (kernels.DType.BlockSize: 1 for the float types).
__host__ __device__ constexpr int bk_qk(int dt) {
  return dt == BK_Q8_0 || dt == BK_Q4_0 || dt == BK_Q4_1 || dt == BK_Q5_0 || dt == BK_Q5_1 ? 32
         : dt >= BK_Q4_K                                                                ? 256
                                                                                        : 1;
}

// Bytes per block.
__host__ __device__ constexpr int bk_qbytes(int dt) {
  return dt == BK_F32                    ? 4
         : dt == BK_F16 || dt == BK_BF16 ? 2
         : dt == BK_Q8_0                 ? 34
         : dt == BK_Q4_0                 ? 18
         : dt == BK_Q4_1                 ? 20
         : dt == BK_Q5_0                 ? 22
         : dt == BK_Q5_1                 ? 24
         : dt == BK_Q4_K                 ? 144
         : dt == BK_Q5_K                 ? 176
         : dt == BK_Q6_K                 ? 210
         : dt == BK_Q3_K                 ? 110
                                         : 84;  // BK_Q2_K
}

__host__ __device__ constexpr bool bk_is_quant(int dt) { return bk_qk(dt) > 1; }

#define BK_NEG_INF (__uint_as_float(0xff800000u))

__device__ __forceinline__ int64_t bk_min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t bk_max64(int64_t a, int64_t b) { return a > b ? a : b; }

// bk_row_bytes is kernels.DType.RowBytes.
__device__ __forceinline__ int64_t bk_row_bytes(int dt, int64_t cols) { return cols / bk_qk(dt) * bk_qbytes(dt); }

// IEEE half to float: exact for every finite value, infinities and NaN
// (kernels.F16ToF32; a NaN's payload may differ, it stays a NaN).
__device__ __forceinline__ float bk_h2f(uint32_t h) {
#ifdef BK_EMU
  return bk_emu_h2f((uint16_t)h);
#else
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
  return f;
#endif
}

// bfloat16 to float: the top half of the float's bits.
__device__ __forceinline__ float bk_bf2f(uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }

// fp8 e4m3 to float (kernels.E4M3ToF32): exact; S.1111.111 is NaN. The
// code's bits in a half's place are the value over 2^8 (biases 7 and 15),
// subnormals included.
__device__ __forceinline__ float bk_e4m32f(uint32_t u) {
  if ((u & 0x7fu) == 0x7fu) return __uint_as_float(0x7fffffffu);
  return bk_h2f(((u & 0x80u) << 8) | ((u & 0x7fu) << 7)) * 256.f;
}

// float to fp8 e4m3, round to nearest even, saturating at ±448; NaN stays
// NaN (kernels.F32ToE4M3, the hardware's satfinite conversion).
__device__ __forceinline__ uint8_t bk_f2e4m3(float f) {
  const uint32_t b = __float_as_uint(f), a = b & 0x7fffffffu;
  const uint8_t sign = (uint8_t)((b >> 24) & 0x80u);
  if (a > 0x7f800000u) return sign | 0x7f;
  if (a >= 0x43e00000u) return sign | 0x7e;  // 448
  if (a < 0x3c800000u) return sign | (uint8_t)rintf(__uint_as_float(a) * 512.f);  // subnormal: steps of 2^-9
  uint32_t r = ((a >> 23) - 127 + 7) << 3 | ((a >> 20) & 7);
  const uint32_t rem = a & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1))) r++;
  return sign | (uint8_t)r;
}

// float to IEEE half, round to nearest even (kernels.F32ToF16).
__device__ __forceinline__ uint16_t bk_f2h(float f) {
#ifdef BK_EMU
  return bk_emu_f2h(f);
#else
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#endif
}

// float to bfloat16, round to nearest even (needs sm_80).
__device__ __forceinline__ uint16_t bk_f2bf(float f) {
#ifdef BK_EMU
  return bk_emu_f2bf(f);
#else
  unsigned short h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#endif
}

// bk_half_out is the rounded copy a kernel (a norm, SwiGLU, prompt
// attention) also writes of its float32 output when the product after it
// multiplies in a half type (half_kind 1: f16, 2: bf16, 0: none): the same
// rounding as bk_f32_to_f16/bf16, without a launch and a read of the
// output for it.
__device__ __forceinline__ void bk_half_out(uint16_t* half, int64_t kind, int64_t i, float v) {
  if (kind == 1) {
    half[i] = bk_f2h(v);
  } else if (kind == 2) {
    half[i] = bk_f2bf(v);
  }
}

// Warp collectives: every lane of the warp must call them.
__device__ __forceinline__ float bk_warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ double bk_warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float bk_warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// The block formats' decoders and bk_dequant_elem.
#include "quant.cuh"
