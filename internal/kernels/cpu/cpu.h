// C kernels of the cpu backend. Every entry point takes `simd`: nonzero
// selects the AVX2+FMA+F16C implementation (only honoured when the CPU has
// those features), zero the portable scalar one. No function keeps a pointer
// it was given after it returns.
#ifndef BATON_CPU_H
#define BATON_CPU_H

#include <stddef.h>
#include <stdint.h>

// Weight dtypes; the numbering matches kernels.DType.
enum {
  BK_F32 = 0,
  BK_F16 = 1,
  BK_Q8_0 = 2,
  BK_BF16 = 3,
  BK_Q4_0 = 4,
  BK_Q4_1 = 5,
  BK_Q5_0 = 6,
  BK_Q5_1 = 7,
  BK_Q4_K = 8,
  BK_Q5_K = 9,
  BK_Q6_K = 10,
  BK_Q3_K = 11,
  BK_Q2_K = 12,
};

// Storage of one row of cols elements.
int64_t bk_row_bytes(int dtype, int64_t cols);

// The ggml block formats (quant.c), layouts as in kernels/quant.go.
int64_t bk_quant_row_bytes(int dtype, int64_t cols);
// bk_quant_dequant_row: exactly kernels.Matrix.Row.
void bk_quant_dequant_row(float *dst, const uint8_t *row, int dtype, int64_t cols);
// The same with AVX2 (x86-64 builds with SIMD only; same results).
void bk_quant_dequant_row_avx2(float *dst, const uint8_t *row, int dtype, int64_t cols);

// bk_quant_x quantises n rows of x (cols each, a multiple of block) to 8
// bits, as the integer dot products of the block formats take them: qs
// (n*cols int8), d (one scale per block of `block` elements: n*cols/block)
// and s (the sum of the quants of each 32 elements: n*cols/32). block is
// bk_quant_x_block of the weight dtype.
int bk_quant_x_block(int dtype);
void bk_quant_x(int simd, int8_t *qs, float *d, int32_t *s, const float *x, int64_t n,
                int64_t cols, int64_t block);

// bk_qdot computes out[i*rows + r] for r0 <= r < r1 and i < n from x
// quantised by bk_quant_x, for the ggml block formats other than Q8_0:
// integer dot products per block of 32, scaled in float.
void bk_qdot(int simd, float *out, const int8_t *qs, const float *d, const int32_t *s, int64_t n,
             const uint8_t *w, int dtype, int64_t rows, int64_t cols, int64_t r0, int64_t r1);

// bk_qdot_k_avx512 is bk_qdot for Q4_K, Q5_K and Q6_K with AVX-512BW
// (qdot512.c); it returns 0, doing nothing, for other dtypes. Callers check
// bk_have_avx512 first.
int bk_qdot_k_avx512(float *out, const int8_t *qs, const float *d, const int32_t *s, int64_t n,
                     const uint8_t *w, int dt, int64_t rows, int64_t cols, int64_t r0, int64_t r1);

// bk_init builds lookup tables; call once before anything else. It returns
// 1 when the CPU supports the SIMD path (AVX2, FMA and F16C).
int bk_init(void);
// bk_have_avx512 is 1 when bk_init found AVX-512F, BW and VL.
int bk_have_avx512(void);

// bk_have_vnni is 1 when bk_have_avx512 is and the CPU has AVX512-VNNI.
int bk_have_vnni(void);

// bk_qgemm: the product of n x rows with weights in a ggml block format
// as integer dot products, with AVX512-VNNI (qgemm512.c; callers check
// bk_have_vnni). bk_qgemm_takes says for which dtypes and widths (Q2_K to
// Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1; cols a multiple of 256). x is
// quantised to 8 bits per xblock elements (bk_quant_x_block of the dtype)
// by bk_qgemm_pack_x (rows [i0, i1) of x, into bk_qgemm_x_bytes(n, cols)
// bytes for n rows). It writes out[i*rows + r] for r0 <= r < r1 and i < n, and
// returns 0, doing nothing, where bk_qgemm_takes does not.
int bk_qgemm_takes(int dtype, int64_t cols);
int64_t bk_qgemm_x_bytes(int64_t n, int64_t cols);
void bk_qgemm_pack_x(uint8_t *xr, const float *x, int64_t cols, int64_t xblock, int64_t i0,
                     int64_t i1);
int bk_qgemm(float *out, const uint8_t *xr, int64_t n, const uint8_t *w, int dtype, int64_t rows,
             int64_t cols, int64_t r0, int64_t r1);

// OpenBLAS: thread count and a description of the build.
void bk_blas_set_threads(int n);
const char *bk_blas_config(void);
const char *bk_blas_corename(void);

// bk_sgemm computes out[i*rows + r] = x[i,:]·w[r,:] for i < n and
// r0 <= r < r1 with OpenBLAS (w is rows x cols float32, row-major).
void bk_sgemm(float *out, const float *x, int64_t n, const float *w,
              int64_t rows, int64_t cols, int64_t r0, int64_t r1);

// bk_deq_sgemm is bk_sgemm for weights of any dtype: rows are dequantised
// a few dozen at a time (each once per call) and multiplied with all n
// rows of x by OpenBLAS.
void bk_deq_sgemm(int simd, float *out, const float *x, int64_t n, const uint8_t *w, int dtype,
                  int64_t rows, int64_t cols, int64_t r0, int64_t r1);

// bk_matmul is the same product with the backend's own kernels, for any
// dtype (w is raw row data, dtype.RowBytes(cols) bytes a row).
void bk_matmul(int simd, float *out, const float *x, int64_t n,
               const uint8_t *w, int dtype, int64_t rows, int64_t cols,
               int64_t r0, int64_t r1);

// bk_pack_x lays x (n rows of cols) out for bk_gemm: panels of 16 rows,
// panel p being cols groups of 16 floats (column k of rows 16p..16p+15,
// zero past row n). It writes panels [p0, p1) of (n+15)/16.
void bk_pack_x(int simd, float *xp, const float *x, int64_t n, int64_t cols, int64_t p0, int64_t p1);
// The same with 16x16 transposes in AVX-512 registers (avx512.c); it
// returns the columns it packed (a multiple of 16), the caller packs the rest.
int64_t bk_pack_x_avx512(float *xp, const float *x, int64_t n, int64_t cols, int64_t p0,
                         int64_t p1);

// bk_gemm is bk_matmul's product for many rows (n >= 2) on x packed by bk_pack_x, with
// the SIMD kernels (only call it when bk_init returned 1). Each weight row
// of [r0, r1) is read (and dequantised) once per block of x rows that fits
// in L2, for all rows of the block.
// simd >= 2 allows the AVX-512 kernel where the CPU has AVX-512F/BW/VL.
void bk_gemm(int simd, float *out, const float *xp, int64_t n, const uint8_t *w, int dtype,
             int64_t rows, int64_t cols, int64_t r0, int64_t r1);

// bk_dequant_rows dequantises rows ids[0..nids) of w into dst (cols each).
void bk_dequant_rows(int simd, float *dst, const uint8_t *w, int dtype,
                     int64_t cols, const int32_t *ids, int64_t nids);

// bk_fma_peak runs iters iterations of 12 independent FMA chains in vector
// registers (AVX-512 when simd >= 2 and the CPU has it, else AVX2) and
// returns the float operations one iteration does (0 without SIMD); the
// chains' sum goes to *sink so the work is kept.
int bk_fma_peak(int simd, int64_t iters, double *sink);
double bk_fma_peak_avx512(int64_t iters);

// bk_f32_to_f16 rounds n floats to IEEE half exactly as kernels.F32ToF16.
void bk_f32_to_f16(int simd, uint16_t *dst, const float *src, int64_t n);

// bk_rmsnorm normalises rows [i0, i1) of x (d each).
void bk_rmsnorm(int simd, float *out, const float *x, const float *w,
                int64_t d, float eps, int64_t i0, int64_t i1);

// bk_rope rotates tokens [t0, t1) of x (heads*hd each) in place. freq has
// dim/2 entries (already divided by the factors); angle = pos*scale*freq.
void bk_rope(int simd, float *x, const int32_t *pos, int64_t heads,
             int64_t hd, int64_t dim, int neox, double scale,
             const double *freq, int64_t t0, int64_t t1);

void bk_swiglu(int simd, float *out, const float *gate, const float *up,
               int64_t n);
void bk_add(int simd, float *out, const float *a, const float *b, int64_t n);

// Attention geometry shared by every work item of one call.
typedef struct {
  int64_t page_floats; // elements per page
  int64_t page_size;   // slots per page
  int64_t row_floats;  // kv_heads*head_dim
  int64_t layer;
  int64_t head_dim;
  int64_t heads; // query heads
  float scale;
  int kv_dtype; // BK_F32, BK_F16 or BK_BF16 (the Go DType values)
} bk_attn_geom;

// Fields of one sequence in the seqs array (BK_SEQ_FIELDS int64 each).
enum { BK_SEQ_PAGEOFF, BK_SEQ_QSTART, BK_SEQ_QLEN, BK_SEQ_KVLEN, BK_SEQ_FIELDS };
// Fields of one work item (BK_ITEM_FIELDS int32 each): sequence index, KV
// head, first query row (relative to the sequence), query rows, first query
// head, query heads. All query heads of an item share the KV head.
enum { BK_IT_SEQ, BK_IT_KVH, BK_IT_ROW0, BK_IT_NROWS, BK_IT_H0, BK_IT_NH, BK_ITEM_FIELDS };
// Most (row, head) pairs in one item.
#define BK_ATTN_MAX_MEMBERS 16

// bk_attention runs items [it0, it1). Returns 0, or -1 if out of memory.
int bk_attention(int simd, float *out, const float *q, const void *kv,
                 const int32_t *pages, const int64_t *seqs,
                 const int32_t *items, int64_t it0, int64_t it1,
                 const bk_attn_geom *g);

// bk_attention_avx512 is bk_attention with AVX-512 (attn512.c), for
// head_dim % 16 == 0 on CPUs with AVX-512F/BW/VL; not for Go.
int bk_attention_avx512(float *out, const float *q, const void *kv, const int32_t *pages,
                        const int64_t *seqs, const int32_t *items, int64_t it0, int64_t it1,
                        const bk_attn_geom *g);

// Shared between the kernel files (not for Go): the AVX2 row dequantiser
// and the AVX-512 gemm.
void bk_deq_row_avx2(float *dst, const uint8_t *row, int dtype, int64_t cols);
void bk_gemm_avx512(float *out, const float *xp, int64_t n, const uint8_t *w, int dtype,
                    int64_t rows, int64_t cols, int64_t r0, int64_t r1);
float *bk_scratch(size_t floats);
// bk_gemm_rows points wr[0..gw) at gw weight rows as floats, starting at w
// (rb bytes a row): the rows themselves for f32, else rows dequantised into
// deq (cols floats each); rows from nw on repeat the first (their results
// are dropped). bk_gemm_put writes rows [i0, i1) of a result tile (tile[j *
// ldc + i - i0] for weight row j < nw) to out (rows floats a row).
void bk_gemm_rows(const float **wr, int gw, int nw, const uint8_t *w, int64_t rb, int dtype,
                  int64_t cols, float *deq);
void bk_gemm_put(float *out, int64_t rows, const float *tile, int64_t ldc, int nw, int64_t i0,
                 int64_t i1);
// bk_gemv_avx512 is bk_matmul for n == 1 with AVX-512 for f32, f16, bf16
// and q8_0 weights; it returns 0 (and does nothing) for other dtypes.
int bk_gemv_avx512(float *out, const float *x, const uint8_t *w, int dtype, int64_t cols,
                   int64_t r0, int64_t r1);

#endif
