// Kernels of the cpu backend; see cpu.h. Each op has a portable scalar
// implementation and, on x86-64, an AVX2+FMA+F16C one compiled with a
// target attribute, so the binary runs on any x86-64 and picks at run time.
#define _GNU_SOURCE
#include "attnspan.h"
#include "cpu.h"
#include "vexp.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

// OpenBLAS extensions; declared again in case the cblas.h found belongs to
// another BLAS (the library linked is always -lopenblas).
void openblas_set_num_threads(int num_threads);
char *openblas_get_config(void);
char *openblas_get_corename(void);

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#define BK_X86 1
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#endif

int g_have_simd;
int g_have_avx512;
int g_have_vnni;
float g_f16[65536]; // f16 bits -> float

static inline float bits_f32(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

// Exactly kernels.F16ToF32.
static float h2f_slow(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0 && man == 0) return bits_f32(sign);
  if (exp == 0) {
    uint32_t e = 127 - 15 + 1;
    while (!(man & 0x400)) {
      man <<= 1;
      e--;
    }
    man &= 0x3ff;
    return bits_f32(sign | e << 23 | man << 13);
  }
  if (exp == 0x1f) return bits_f32(sign | 0xffu << 23 | man << 13);
  return bits_f32(sign | (exp + 127 - 15) << 23 | man << 13);
}

static inline float h2f(uint16_t h) { return g_f16[h]; }
static inline uint16_t ld16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
static inline float ldf(const uint8_t *p) {
  float v;
  memcpy(&v, p, 4);
  return v;
}

int bk_init(void) {
  for (uint32_t i = 0; i < 65536; i++) g_f16[i] = h2f_slow((uint16_t)i);
#ifdef BK_X86
  __builtin_cpu_init();
  g_have_simd = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("f16c");
  g_have_avx512 = g_have_simd && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  g_have_vnni = g_have_avx512 && __builtin_cpu_supports("avx512vnni");
#endif
  return g_have_simd;
}

int bk_have_avx512(void) { return g_have_avx512; }
int bk_have_vnni(void) { return g_have_vnni; }

#define USE_SIMD(s) ((s) && g_have_simd)
#ifndef BK_X86
#define UNUSED_SIMD(s) (void)(s)
#else
#define UNUSED_SIMD(s)
#endif

int64_t bk_row_bytes(int dtype, int64_t cols) {
  switch (dtype) {
  case BK_F32:
    return 4 * cols;
  case BK_F16:
  case BK_BF16:
    return 2 * cols;
  case BK_Q8_0:
    return cols / 32 * 34;
  }
  return bk_quant_row_bytes(dtype, cols);
}
#define row_bytes bk_row_bytes

/* ---------------------------------------------------------------- BLAS */

void bk_blas_set_threads(int n) { openblas_set_num_threads(n); }
const char *bk_blas_config(void) { return openblas_get_config(); }
const char *bk_blas_corename(void) { return openblas_get_corename(); }

void bk_sgemm(float *out, const float *x, int64_t n, const float *w, int64_t rows,
              int64_t cols, int64_t r0, int64_t r1) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)(r1 - r0), (int)cols, 1.0f,
              x, (int)cols, w + r0 * cols, (int)cols, 0.0f, out + r0, (int)rows);
}

// Per-thread scratch that grows and is kept: the gemm runs thousands of
// times per second, and a malloc of a few hundred KiB is an mmap.
static __thread float *tl_scratch;
static __thread size_t tl_scratch_len;

static float *scratch(size_t floats) {
  if (tl_scratch_len < floats) {
    free(tl_scratch);
    tl_scratch = aligned_alloc(64, (floats * 4 + 63) / 64 * 64);
    if (!tl_scratch) abort();
    tl_scratch_len = floats;
  }
  return tl_scratch;
}

float *bk_scratch(size_t floats) { return scratch(floats); }

// Rows of a non-f32 weight dequantised at a time for sgemm: 48 rows of up
// to 2048 floats stay in L2 while sgemm sweeps all rows of x past them.
#define DQ_ROWS 48

void bk_deq_sgemm(int simd, float *out, const float *x, int64_t n, const uint8_t *w, int dtype,
                  int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  if (r1 <= r0 || n <= 0) return;
  float *buf = scratch((size_t)(DQ_ROWS * cols));
  int32_t ids[DQ_ROWS];
  for (int64_t r = r0; r < r1; r += DQ_ROWS) {
    int64_t nr = r1 - r < DQ_ROWS ? r1 - r : DQ_ROWS;
    for (int64_t i = 0; i < nr; i++) ids[i] = (int32_t)(r + i);
    bk_dequant_rows(simd, buf, w, dtype, cols, ids, nr);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)n, (int)nr, (int)cols, 1.0f, x,
                (int)cols, buf, (int)cols, 0.0f, out + r, (int)rows);
  }
}

/* ------------------------------------------------------- dequantisation */

static void deq_row_scalar(float *dst, const uint8_t *row, int dtype, int64_t cols) {
  switch (dtype) {
  case BK_F32:
    memcpy(dst, row, 4 * cols);
    break;
  case BK_F16:
    for (int64_t i = 0; i < cols; i++) dst[i] = h2f(ld16(row + 2 * i));
    break;
  case BK_BF16:
    for (int64_t i = 0; i < cols; i++) dst[i] = bits_f32((uint32_t)ld16(row + 2 * i) << 16);
    break;
  case BK_Q8_0:
    for (int64_t b = 0; b < cols / 32; b++) {
      const uint8_t *q = row + b * 34;
      float d = h2f(ld16(q));
      for (int j = 0; j < 32; j++) dst[b * 32 + j] = d * (float)(int8_t)q[2 + j];
    }
    break;
  default:
    bk_quant_dequant_row(dst, row, dtype, cols);
  }
}

#ifdef BK_X86
AVX2_INLINE __m256 ld8_f16(const uint8_t *p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
AVX2_INLINE __m256 ld8_bf16(const uint8_t *p) {
  __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
AVX2_INLINE __m256 ld8_q8(const uint8_t *p) {
  __m128i v = _mm_loadl_epi64((const __m128i *)p);
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

AVX2 void bk_deq_row_avx2(float *dst, const uint8_t *row, int dtype, int64_t cols) {
  int64_t i = 0;
  switch (dtype) {
  case BK_F32:
    memcpy(dst, row, 4 * cols);
    return;
  case BK_F16:
    for (; i + 8 <= cols; i += 8) _mm256_storeu_ps(dst + i, ld8_f16(row + 2 * i));
    for (; i < cols; i++) dst[i] = h2f(ld16(row + 2 * i));
    return;
  case BK_BF16:
    for (; i + 8 <= cols; i += 8) _mm256_storeu_ps(dst + i, ld8_bf16(row + 2 * i));
    for (; i < cols; i++) dst[i] = bits_f32((uint32_t)ld16(row + 2 * i) << 16);
    return;
  case BK_Q8_0:
    for (int64_t b = 0; b < cols / 32; b++) {
      const uint8_t *q = row + b * 34;
      __m256 d = _mm256_set1_ps(h2f(ld16(q)));
      for (int j = 0; j < 4; j++)
        _mm256_storeu_ps(dst + b * 32 + 8 * j, _mm256_mul_ps(d, ld8_q8(q + 2 + 8 * j)));
    }
    return;
  default:
    bk_quant_dequant_row_avx2(dst, row, dtype, cols);
  }
}
#define deq_row_avx2 bk_deq_row_avx2
#endif

void bk_dequant_rows(int simd, float *dst, const uint8_t *w, int dtype, int64_t cols,
                     const int32_t *ids, int64_t nids) {
  UNUSED_SIMD(simd);
  int64_t rb = row_bytes(dtype, cols);
  for (int64_t i = 0; i < nids; i++) {
    const uint8_t *row = w + (int64_t)ids[i] * rb;
#ifdef BK_X86
    if (USE_SIMD(simd)) {
      deq_row_avx2(dst + i * cols, row, dtype, cols);
      continue;
    }
#endif
    deq_row_scalar(dst + i * cols, row, dtype, cols);
  }
}

/* --------------------------------------------------------------- MatMul */

// The scalar fallback, and the SIMD path for a few x rows, take weight rows
// MR at a time ("a panel"): non-f32 panels are dequantised into a float
// buffer and multiplied with every x row of a block that stays in cache,
// NR x rows per micro-kernel call (dot products, summed across lanes at
// the end). Long rows are cut into KC-column slices so that a panel and NR
// x rows stay in L1.
#define XBLOCK_BYTES (192 * 1024)
#define MR 4
#define NR 3
#define KC 512      // column slice (a multiple of 256: whole blocks of every format)
#define KC_MAX 1024 // rows up to this long are not sliced

static int64_t x_block_rows(int64_t n, int64_t cols) {
  int64_t nb = XBLOCK_BYTES / (4 * cols);
  nb -= nb % NR;
  if (nb < NR) nb = NR;
  return nb < n ? nb : n;
}

static inline float dot_scalar(const float *a, const float *b, int64_t n) {
  // Eight independent partial sums: vectorisable without reassociation,
  // and a smaller rounding error than one running sum.
  float s[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
  float t = 0;
  for (; i < n; i++) t += a[i] * b[i];
  return ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])) + t;
}

static void matmul_scalar(float *out, const float *x, int64_t n, const uint8_t *w, int dtype,
                          int64_t rows, int64_t cols, int64_t r0, int64_t r1, float *buf) {
  int64_t rb = row_bytes(dtype, cols);
  int64_t nb = x_block_rows(n, cols);
  for (int64_t i0 = 0; i0 < n; i0 += nb) {
    int64_t i1 = i0 + nb < n ? i0 + nb : n;
    for (int64_t r = r0; r < r1; r++) {
      deq_row_scalar(buf, w + r * rb, dtype, cols);
      for (int64_t i = i0; i < i1; i++) out[i * rows + r] = dot_scalar(buf, x + i * cols, cols);
    }
  }
}

#ifdef BK_X86
AVX2_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Four sums in one vector: lane i is the sum of v[i].
AVX2_INLINE __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
  __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
  __m256 t = _mm256_hadd_ps(ab, cd);
  return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

// Eight sums in one vector: lane i is the sum of v[i].
AVX2_INLINE __m256 hsum8x8(__m256 v0, __m256 v1, __m256 v2, __m256 v3, __m256 v4, __m256 v5,
                           __m256 v6, __m256 v7) {
  __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v0, v1), _mm256_hadd_ps(v2, v3));
  __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v4, v5), _mm256_hadd_ps(v6, v7));
  return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

// Micro-kernel: the MR x NR dot products of 4 float rows w0..w3 and 3 x
// rows; out[j*ldo + i] = wi·xj. Rows past the end are passed as duplicates
// and their results dropped by the caller via nw/nx.
AVX2 static void mk_f32(const float *w, int64_t ldw, int nw, const float *x, int64_t ldx, int nx,
                        int64_t cols, float *out, int64_t ldo, int accumulate) {
  const float *w0 = w, *w1 = w + (nw > 1 ? ldw : 0), *w2 = w + (nw > 2 ? 2 * ldw : 0),
              *w3 = w + (nw > 3 ? 3 * ldw : 0);
  const float *x0 = x, *x1 = x + (nx > 1 ? ldx : 0), *x2 = x + (nx > 2 ? 2 * ldx : 0);
  __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00,
         a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
  int64_t k = 0;
  for (; k + 8 <= cols; k += 8) {
    __m256 y0 = _mm256_loadu_ps(x0 + k), y1 = _mm256_loadu_ps(x1 + k),
           y2 = _mm256_loadu_ps(x2 + k);
    __m256 v = _mm256_loadu_ps(w0 + k);
    a00 = _mm256_fmadd_ps(v, y0, a00);
    a01 = _mm256_fmadd_ps(v, y1, a01);
    a02 = _mm256_fmadd_ps(v, y2, a02);
    v = _mm256_loadu_ps(w1 + k);
    a10 = _mm256_fmadd_ps(v, y0, a10);
    a11 = _mm256_fmadd_ps(v, y1, a11);
    a12 = _mm256_fmadd_ps(v, y2, a12);
    v = _mm256_loadu_ps(w2 + k);
    a20 = _mm256_fmadd_ps(v, y0, a20);
    a21 = _mm256_fmadd_ps(v, y1, a21);
    a22 = _mm256_fmadd_ps(v, y2, a22);
    v = _mm256_loadu_ps(w3 + k);
    a30 = _mm256_fmadd_ps(v, y0, a30);
    a31 = _mm256_fmadd_ps(v, y1, a31);
    a32 = _mm256_fmadd_ps(v, y2, a32);
  }
  float r[3][4];
  _mm_storeu_ps(r[0], hsum4x8(a00, a10, a20, a30));
  _mm_storeu_ps(r[1], hsum4x8(a01, a11, a21, a31));
  _mm_storeu_ps(r[2], hsum4x8(a02, a12, a22, a32));
  for (; k < cols; k++) {
    const float *wr[4] = {w0, w1, w2, w3}, *xr[3] = {x0, x1, x2};
    for (int j = 0; j < 3; j++)
      for (int i = 0; i < 4; i++) r[j][i] += wr[i][k] * xr[j][k];
  }
  if (accumulate) {
    for (int j = 0; j < nx; j++)
      for (int i = 0; i < nw; i++) out[j * ldo + i] += r[j][i];
  } else {
    for (int j = 0; j < nx; j++)
      for (int i = 0; i < nw; i++) out[j * ldo + i] = r[j][i];
  }
}

#define LD_F32(p) _mm256_loadu_ps((const float *)(p))
#define LD_F16(p) ld8_f16(p)
#define LD_BF16(p) ld8_bf16(p)

// Single-row dot kernels for decode (n == 1): one weight row streamed
// sequentially with four accumulators, prefetching ROW1_PF bytes ahead
// (see ZPF in avx512.c). Streaming rows one after another
// (one sequential stream) measured 1.3-1.4x faster than interleaving four
// rows once the matrix does not fit in cache.
#define ROW1_PF 4096
#define ROW1_BODY(LOAD, STEP)                                                          \
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                           \
  int64_t k = 0;                                                                        \
  for (; k + 32 <= cols; k += 32) {                                                     \
    _mm_prefetch((const char *)(w + STEP * k) + ROW1_PF, _MM_HINT_T0);                  \
    a0 = _mm256_fmadd_ps(LOAD(w + STEP * k), _mm256_loadu_ps(x + k), a0);               \
    a1 = _mm256_fmadd_ps(LOAD(w + STEP * (k + 8)), _mm256_loadu_ps(x + k + 8), a1);     \
    a2 = _mm256_fmadd_ps(LOAD(w + STEP * (k + 16)), _mm256_loadu_ps(x + k + 16), a2);   \
    a3 = _mm256_fmadd_ps(LOAD(w + STEP * (k + 24)), _mm256_loadu_ps(x + k + 24), a3);   \
  }                                                                                     \
  for (; k + 8 <= cols; k += 8)                                                         \
    a0 = _mm256_fmadd_ps(LOAD(w + STEP * k), _mm256_loadu_ps(x + k), a0);               \
  float r = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));

AVX2 static float row1_f32(const uint8_t *w, const float *x, int64_t cols) {
  ROW1_BODY(LD_F32, 4)
  for (; k < cols; k++) r += ldf(w + 4 * k) * x[k];
  return r;
}

AVX2 static float row1_f16(const uint8_t *w, const float *x, int64_t cols) {
  ROW1_BODY(LD_F16, 2)
  for (; k < cols; k++) r += h2f(ld16(w + 2 * k)) * x[k];
  return r;
}

AVX2 static float row1_bf16(const uint8_t *w, const float *x, int64_t cols) {
  ROW1_BODY(LD_BF16, 2)
  for (; k < cols; k++) r += bits_f32((uint32_t)ld16(w + 2 * k) << 16) * x[k];
  return r;
}

// Q8_0: per block, sum q·x in float, then scale by d once.
AVX2 static float row1_q8(const uint8_t *w, const float *x, int64_t cols) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t nb = cols / 32, b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t *q = w + 34 * b;
    const float *xb = x + 32 * b;
    _mm_prefetch((const char *)q + ROW1_PF, _MM_HINT_T0);
    _mm_prefetch((const char *)q + ROW1_PF + 64, _MM_HINT_T0);
    __m256 t = _mm256_mul_ps(ld8_q8(q + 2), _mm256_loadu_ps(xb));
    __m256 u = _mm256_mul_ps(ld8_q8(q + 10), _mm256_loadu_ps(xb + 8));
    t = _mm256_fmadd_ps(ld8_q8(q + 18), _mm256_loadu_ps(xb + 16), t);
    u = _mm256_fmadd_ps(ld8_q8(q + 26), _mm256_loadu_ps(xb + 24), u);
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(ld16(q))), _mm256_add_ps(t, u), a0);
    t = _mm256_mul_ps(ld8_q8(q + 36), _mm256_loadu_ps(xb + 32));
    u = _mm256_mul_ps(ld8_q8(q + 44), _mm256_loadu_ps(xb + 40));
    t = _mm256_fmadd_ps(ld8_q8(q + 52), _mm256_loadu_ps(xb + 48), t);
    u = _mm256_fmadd_ps(ld8_q8(q + 60), _mm256_loadu_ps(xb + 56), u);
    a1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(ld16(q + 34))), _mm256_add_ps(t, u), a1);
  }
  for (; b < nb; b++) {
    const uint8_t *q = w + 34 * b;
    const float *xb = x + 32 * b;
    __m256 t = _mm256_mul_ps(ld8_q8(q + 2), _mm256_loadu_ps(xb));
    __m256 u = _mm256_mul_ps(ld8_q8(q + 10), _mm256_loadu_ps(xb + 8));
    t = _mm256_fmadd_ps(ld8_q8(q + 18), _mm256_loadu_ps(xb + 16), t);
    u = _mm256_fmadd_ps(ld8_q8(q + 26), _mm256_loadu_ps(xb + 24), u);
    a0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(ld16(q))), _mm256_add_ps(t, u), a0);
  }
  return hsum8(_mm256_add_ps(a0, a1));
}

AVX2 static void gemv_avx2(float *out, const float *x, const uint8_t *w, int dtype, int64_t cols,
                           int64_t r0, int64_t r1) {
  int64_t rb = row_bytes(dtype, cols);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *wr = w + r * rb;
    switch (dtype) {
    case BK_F32: out[r] = row1_f32(wr, x, cols); break;
    case BK_F16: out[r] = row1_f16(wr, x, cols); break;
    case BK_BF16: out[r] = row1_bf16(wr, x, cols); break;
    case BK_Q8_0: out[r] = row1_q8(wr, x, cols); break;
    }
  }
}

// Products of a few x rows (2 <= n < the gemm's threshold): the 4x3
// dot-product micro-kernel needs 7 loads per 12 FMAs where the gemm's,
// with one x vector of 8 rows live, needs 7 per 6.
AVX2 static void dotmm_avx2(float *out, const float *x, int64_t n, const uint8_t *w, int dtype,
                            int64_t rows, int64_t cols, int64_t r0, int64_t r1, float *buf) {
  int64_t rb = row_bytes(dtype, cols);
  int64_t kc = cols <= KC_MAX ? cols : KC;
  int64_t nb = x_block_rows(n, kc < cols ? 2 * kc : cols);
  for (int64_t i0 = 0; i0 < n; i0 += nb) {
    int64_t i1 = i0 + nb < n ? i0 + nb : n;
    for (int64_t r = r0; r < r1; r += MR) {
      int nw = r1 - r < MR ? (int)(r1 - r) : MR;
      for (int64_t k0 = 0; k0 < cols; k0 += kc) {
        int64_t kl = cols - k0 < kc ? cols - k0 : kc;
        int64_t koff = row_bytes(dtype, k0); // k0 is a multiple of 32
        const float *panel = buf;
        int64_t ldw = kl;
        if (dtype == BK_F32) {
          panel = (const float *)(w + r * rb + koff);
          ldw = cols;
        } else {
          for (int i = 0; i < nw; i++) deq_row_avx2(buf + i * kl, w + (r + i) * rb + koff, dtype, kl);
        }
        for (int64_t i = i0; i < i1; i += NR) {
          int nx = i1 - i < NR ? (int)(i1 - i) : NR;
          mk_f32(panel, ldw, nw, x + i * cols + k0, cols, nx, kl, out + i * rows + r, rows, k0 > 0);
        }
      }
    }
  }
}

// Many-row products (see bk_gemm). The micro-kernel keeps a 16 x-row by 6
// weight-row block of sums in 12 registers: per column it loads 16 x
// values (two vectors of the packed panel) and broadcasts 6 weight values,
// 12 FMAs for 8 loads, so it runs near the FMA ports' rate while each
// weight value is read once per panel from L1. Sums are taken over GK
// columns at a time and added into a small tile in memory, which keeps
// the panel slice and the weight slice in L1 and the rounding error of a
// float32 sum low (partial sums of at most GK terms).
#define GW 6    // weight rows per micro-tile
#define GK 256  // columns per slice
// Budget for the panels of x that stay in L2 while a range of weight rows
// streams past them; more rows than this re-stream the weights.
#define GX_BYTES (256 * 1024)

// pf_tile asks L1 for the line of each of the next tile's six rows that
// sits pfd floats past this tile's column k (pfd 0: no next tile to ask
// for). The hardware prefetcher follows one stream into the next tile, not
// six: without this, a tile of f32 weights streamed from memory started
// with six cold rows, and a 32-row decode step's products ran at 150
// GFLOP/s on two cores where the same loop on weights in L2 ran at the FMA
// peak (a standalone loop over 536 MB in huge pages: 129-151 -> 152-173
// GFLOP/s with it).
AVX2_INLINE void pf_tile(const float *const *w, int64_t k, int64_t pfd) {
  for (int j = 0; j < GW; j++) _mm_prefetch((const char *)(w[j] + k + pfd), _MM_HINT_T0);
}

AVX2 static void mk16(const float *xp, const float *const *wr, int64_t k0, int64_t kl, float *c,
                      int64_t ldc, int64_t pfd) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float *w0 = wr[0] + k0, *w1 = wr[1] + k0, *w2 = wr[2] + k0, *w3 = wr[3] + k0,
              *w4 = wr[4] + k0, *w5 = wr[5] + k0;
  for (int64_t kb = 0; kb < kl; kb += 16) {
   int64_t ke = kb + 16 < kl ? kb + 16 : kl;
   if (pfd) pf_tile(wr, k0 + kb, pfd);
   for (int64_t k = kb; k < ke; k++) {
    __m256 x0 = _mm256_loadu_ps(xp + 16 * k), x1 = _mm256_loadu_ps(xp + 16 * k + 8), b;
    b = _mm256_broadcast_ss(w0 + k);
    c00 = _mm256_fmadd_ps(b, x0, c00);
    c01 = _mm256_fmadd_ps(b, x1, c01);
    b = _mm256_broadcast_ss(w1 + k);
    c10 = _mm256_fmadd_ps(b, x0, c10);
    c11 = _mm256_fmadd_ps(b, x1, c11);
    b = _mm256_broadcast_ss(w2 + k);
    c20 = _mm256_fmadd_ps(b, x0, c20);
    c21 = _mm256_fmadd_ps(b, x1, c21);
    b = _mm256_broadcast_ss(w3 + k);
    c30 = _mm256_fmadd_ps(b, x0, c30);
    c31 = _mm256_fmadd_ps(b, x1, c31);
    b = _mm256_broadcast_ss(w4 + k);
    c40 = _mm256_fmadd_ps(b, x0, c40);
    c41 = _mm256_fmadd_ps(b, x1, c41);
    b = _mm256_broadcast_ss(w5 + k);
    c50 = _mm256_fmadd_ps(b, x0, c50);
    c51 = _mm256_fmadd_ps(b, x1, c51);
   }
  }
#define ACC(j, lo, hi)                                                                        \
  _mm256_storeu_ps(c + j * ldc, _mm256_add_ps(_mm256_loadu_ps(c + j * ldc), lo));             \
  _mm256_storeu_ps(c + j * ldc + 8, _mm256_add_ps(_mm256_loadu_ps(c + j * ldc + 8), hi));
  ACC(0, c00, c01) ACC(1, c10, c11) ACC(2, c20, c21) ACC(3, c30, c31) ACC(4, c40, c41)
  ACC(5, c50, c51)
#undef ACC
}

// The same for a panel with at most 8 live rows (half the work).
AVX2 static void mk8(const float *xp, const float *const *wr, int64_t k0, int64_t kl, float *c,
                     int64_t ldc, int64_t pfd) {
  __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0;
  const float *w0 = wr[0] + k0, *w1 = wr[1] + k0, *w2 = wr[2] + k0, *w3 = wr[3] + k0,
              *w4 = wr[4] + k0, *w5 = wr[5] + k0;
  for (int64_t kb = 0; kb < kl; kb += 16) {
    int64_t ke = kb + 16 < kl ? kb + 16 : kl;
    if (pfd) pf_tile(wr, k0 + kb, pfd);
    for (int64_t k = kb; k < ke; k++) {
      __m256 x0 = _mm256_loadu_ps(xp + 16 * k);
      c0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w0 + k), x0, c0);
      c1 = _mm256_fmadd_ps(_mm256_broadcast_ss(w1 + k), x0, c1);
      c2 = _mm256_fmadd_ps(_mm256_broadcast_ss(w2 + k), x0, c2);
      c3 = _mm256_fmadd_ps(_mm256_broadcast_ss(w3 + k), x0, c3);
      c4 = _mm256_fmadd_ps(_mm256_broadcast_ss(w4 + k), x0, c4);
      c5 = _mm256_fmadd_ps(_mm256_broadcast_ss(w5 + k), x0, c5);
    }
  }
  __m256 cs[GW] = {c0, c1, c2, c3, c4, c5};
  for (int j = 0; j < GW; j++)
    _mm256_storeu_ps(c + j * ldc, _mm256_add_ps(_mm256_loadu_ps(c + j * ldc), cs[j]));
}

// The gemms' shared steps (see cpu.h).
AVX2 void bk_gemm_rows(const float **wr, int gw, int nw, const uint8_t *w, int64_t rb, int dtype,
                       int64_t cols, float *deq) {
  for (int j = 0; j < gw; j++) {
    int jj = j < nw ? j : 0; // past the end: repeat row 0, result dropped
    if (dtype == BK_F32) {
      wr[j] = (const float *)(w + jj * rb);
    } else {
      if (j < nw) deq_row_avx2(deq + j * cols, w + j * rb, dtype, cols);
      wr[j] = deq + jj * cols;
    }
  }
}

// Row by row of out: with a power-of-two number of rows, the rows of out
// map to one cache set, and writing them a column at a time (nw passes)
// evicted each line between its writes.
void bk_gemm_put(float *out, int64_t rows, const float *tile, int64_t ldc, int nw, int64_t i0,
                 int64_t i1) {
  for (int64_t i = i0; i < i1; i++)
    for (int j = 0; j < nw; j++) out[i * rows + j] = tile[j * ldc + i - i0];
}

// Non-f32 weights are dequantised GD_BYTES of float32 rows at a time, once
// for every block of x, which then read them from cache: dequantising
// each six rows afresh for every block of 32 x rows (as the AVX-512 gemm
// does in L1, where its blocks of x are larger) cost an F16 product a
// quarter of its time on one core.
#define GD_BYTES (1024 * 1024)

AVX2 static void gemm_avx2(float *out, const float *xp, int64_t n, const uint8_t *w, int dtype,
                           int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  int64_t rb = row_bytes(dtype, cols);
  int64_t npan = (n + 15) / 16;
  int64_t pb = GX_BYTES / (64 * cols); // panels per block of x
  if (pb < 1) pb = 1;
  if (pb > npan) pb = npan;
  int64_t ldc = 16 * pb;
  int64_t rc = r1 - r0; // weight rows per dequantised chunk
  if (dtype != BK_F32) {
    rc = GD_BYTES / (4 * cols) / GW * GW;
    if (rc < GW) rc = GW;
  }
  float *tile = scratch((size_t)(GW * ldc + (dtype == BK_F32 ? 0 : rc * cols)));
  float *deq = tile + GW * ldc;
  for (int64_t c0 = r0; c0 < r1; c0 += rc) {
    int64_t c1 = c0 + rc < r1 ? c0 + rc : r1;
    if (dtype != BK_F32)
      for (int64_t r = c0; r < c1; r++) deq_row_avx2(deq + (r - c0) * cols, w + r * rb, dtype, cols);
    for (int64_t p0 = 0; p0 < npan; p0 += pb) {
      int64_t p1 = p0 + pb < npan ? p0 + pb : npan;
      for (int64_t r = c0; r < c1; r += GW) {
        int nw = c1 - r < GW ? (int)(c1 - r) : GW;
        // The dequantised chunk is f32 rows of cols floats.
        const float *wr[GW];
        const uint8_t *w0 = dtype == BK_F32 ? w + r * rb : (const uint8_t *)(deq + (r - c0) * cols);
        bk_gemm_rows(wr, GW, nw, w0, dtype == BK_F32 ? rb : 4 * cols, BK_F32, cols, NULL);
        memset(tile, 0, sizeof(float) * GW * ldc);
        // f32 rows are read in place: ask for the next tile's (its rows
        // are GW rows on, when it is a full one of this range).
        int64_t pfd = dtype == BK_F32 && r + 2 * GW <= c1 ? GW * (rb / 4) : 0;
        for (int64_t k0 = 0; k0 < cols; k0 += GK) {
          int64_t kl = cols - k0 < GK ? cols - k0 : GK;
          for (int64_t p = p0; p < p1; p++) {
            const float *xs = xp + (p * cols + k0) * 16;
            float *c = tile + (p - p0) * 16;
            if (n - 16 * p > 8)
              mk16(xs, wr, k0, kl, c, ldc, pfd);
            else
              mk8(xs, wr, k0, kl, c, ldc, pfd);
          }
        }
        int64_t i1 = 16 * p1 < n ? 16 * p1 : n;
        bk_gemm_put(out + r, rows, tile, ldc, nw, 16 * p0, i1);
      }
    }
  }
}
#endif

void bk_pack_x(int simd, float *xp, const float *x, int64_t n, int64_t cols, int64_t p0,
               int64_t p1) {
  int64_t k0 = 0;
#ifdef BK_X86
  if (simd >= 2 && g_have_avx512) k0 = bk_pack_x_avx512(xp, x, n, cols, p0, p1);
#else
  (void)simd;
#endif
  for (int64_t p = p0; p < p1; p++) {
    float *d = xp + p * cols * 16;
    int64_t live = n - 16 * p < 16 ? n - 16 * p : 16;
    const float *src[16];
    for (int64_t l = 0; l < 16; l++) src[l] = x + (16 * p + (l < live ? l : 0)) * cols;
    for (int64_t k = k0; k < cols; k++) {
      for (int64_t l = 0; l < live; l++) d[16 * k + l] = src[l][k];
      for (int64_t l = live; l < 16; l++) d[16 * k + l] = 0;
    }
  }
}

void bk_gemm(int simd, float *out, const float *xp, int64_t n, const uint8_t *w, int dtype,
             int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  if (r1 <= r0 || n <= 0) return;
#ifdef BK_X86
  if (simd >= 2 && g_have_avx512) {
    bk_gemm_avx512(out, xp, n, w, dtype, rows, cols, r0, r1);
    return;
  }
  if (g_have_simd) {
    gemm_avx2(out, xp, n, w, dtype, rows, cols, r0, r1);
    return;
  }
#endif
  abort(); // callers check bk_init's answer first
}

void bk_matmul(int simd, float *out, const float *x, int64_t n, const uint8_t *w, int dtype,
               int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  UNUSED_SIMD(simd);
  if (r1 <= r0 || n <= 0) return;
#ifdef BK_X86
  if (USE_SIMD(simd)) {
    if (n == 1) {
      if (simd >= 2 && g_have_avx512 && bk_gemv_avx512(out, x, w, dtype, cols, r0, r1)) return;
      gemv_avx2(out, x, w, dtype, cols, r0, r1);
      return;
    }
    float *buf = malloc(sizeof(float) * MR * (cols <= KC_MAX ? cols : KC));
    if (!buf) abort();
    dotmm_avx2(out, x, n, w, dtype, rows, cols, r0, r1, buf);
    free(buf);
    return;
  }
#endif
  float *buf = malloc(sizeof(float) * cols);
  if (!buf) abort();
  matmul_scalar(out, x, n, w, dtype, rows, cols, r0, r1, buf);
  free(buf);
}

/* -------------------------------------------------------------- FMA peak */

#ifdef BK_X86
AVX2 static double fma_peak_avx2(int64_t iters) {
  __m256 a[12], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int i = 0; i < 12; i++) a[i] = _mm256_set1_ps((float)i);
  for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) a[i] = _mm256_fmadd_ps(a[i], m, c);
  __m256 s = a[0];
  for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, a[i]);
  return hsum8(s);
}
#endif

int bk_fma_peak(int simd, int64_t iters, double *sink) {
  UNUSED_SIMD(simd);
#ifdef BK_X86
  if (simd >= 2 && g_have_avx512) {
    *sink = bk_fma_peak_avx512(iters);
    return 12 * 16 * 2;
  }
  if (USE_SIMD(simd)) {
    *sink = fma_peak_avx2(iters);
    return 12 * 8 * 2;
  }
#endif
  (void)iters;
  *sink = 0;
  return 0;
}

/* --------------------------------------------------------------- RMSNorm */

// out = float(x*scale) * w with scale computed in double, as the reference.
static void rmsnorm_scalar(float *out, const float *x, const float *w, int64_t d, float eps,
                       int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++) {
    const float *xi = x + i * d;
    double s[4] = {0};
    int64_t j = 0;
    for (; j + 4 <= d; j += 4)
      for (int k = 0; k < 4; k++) s[k] += (double)xi[j + k] * xi[j + k];
    for (; j < d; j++) s[0] += (double)xi[j] * xi[j];
    double ss = (s[0] + s[1]) + (s[2] + s[3]);
    double scale = 1.0 / sqrt(ss / (double)d + (double)eps);
    for (j = 0; j < d; j++) out[i * d + j] = (float)((double)xi[j] * scale) * w[j];
  }
}

#ifdef BK_X86
AVX2 static void rmsnorm_avx2(float *out, const float *x, const float *w, int64_t d, float eps,
                              int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; i++) {
    const float *xi = x + i * d;
    float *oi = out + i * d;
    __m256d s0 = _mm256_setzero_pd(), s1 = s0;
    int64_t j = 0;
    for (; j + 8 <= d; j += 8) {
      __m256 v = _mm256_loadu_ps(xi + j);
      __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)),
              hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
      s0 = _mm256_fmadd_pd(lo, lo, s0);
      s1 = _mm256_fmadd_pd(hi, hi, s1);
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));
    double ss = (t[0] + t[1]) + (t[2] + t[3]);
    for (; j < d; j++) ss += (double)xi[j] * xi[j];
    double scale = 1.0 / sqrt(ss / (double)d + (double)eps);
    __m256d sc = _mm256_set1_pd(scale);
    for (j = 0; j + 8 <= d; j += 8) {
      __m256 v = _mm256_loadu_ps(xi + j);
      __m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)), sc));
      __m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), sc));
      __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
      _mm256_storeu_ps(oi + j, _mm256_mul_ps(y, _mm256_loadu_ps(w + j)));
    }
    for (; j < d; j++) oi[j] = (float)((double)xi[j] * scale) * w[j];
  }
}
#endif

void bk_rmsnorm(int simd, float *out, const float *x, const float *w, int64_t d, float eps,
                int64_t i0, int64_t i1) {
  UNUSED_SIMD(simd);
#ifdef BK_X86
  if (USE_SIMD(simd)) {
    rmsnorm_avx2(out, x, w, d, eps, i0, i1);
    return;
  }
#endif
  rmsnorm_scalar(out, x, w, d, eps, i0, i1);
}

/* ------------------------------------------------------------------ RoPE */

// The rotation is done in double, as in the reference; angles come from
// per-dimension frequencies computed (in Go, with the reference's formula)
// once per call, and sin/cos are computed once per token for all heads.
#define ROPE_BODY                                                                    \
  int64_t half = dim / 2;                                                            \
  double *cs = malloc(sizeof(double) * 2 * (half > 0 ? half : 1));                   \
  if (!cs) abort();                                                                  \
  double *sn = cs + half;                                                            \
  for (int64_t t = t0; t < t1; t++) {                                                \
    for (int64_t i = 0; i < half; i++) {                                             \
      double ang = (double)pos[t] * scale * freq[i];                                 \
      sn[i] = sin(ang);                                                              \
      cs[i] = cos(ang);                                                              \
    }                                                                                \
    for (int64_t h = 0; h < heads; h++) {                                            \
      float *v = x + (t * heads + h) * hd;                                           \
      if (neox) {                                                                    \
        float *a = v, *b = v + half;                                                 \
        for (int64_t i = 0; i < half; i++) {                                         \
          double x0 = a[i], x1 = b[i];                                               \
          a[i] = (float)(x0 * cs[i] - x1 * sn[i]);                                   \
          b[i] = (float)(x0 * sn[i] + x1 * cs[i]);                                   \
        }                                                                            \
      } else {                                                                       \
        for (int64_t i = 0; i < half; i++) {                                         \
          double x0 = v[2 * i], x1 = v[2 * i + 1];                                   \
          v[2 * i] = (float)(x0 * cs[i] - x1 * sn[i]);                               \
          v[2 * i + 1] = (float)(x0 * sn[i] + x1 * cs[i]);                           \
        }                                                                            \
      }                                                                              \
    }                                                                                \
  }                                                                                  \
  free(cs);

static void rope_scalar(float *x, const int32_t *pos, int64_t heads, int64_t hd, int64_t dim,
                        int neox, double scale, const double *freq, int64_t t0, int64_t t1) {
  ROPE_BODY
}

#ifdef BK_X86
// Same source, auto-vectorised for AVX2. FMA is deliberately not enabled
// here, so no multiply-add gets contracted and the arithmetic stays that of
// the reference.
__attribute__((target("avx2,f16c"))) static void
rope_avx2(float *x, const int32_t *pos, int64_t heads, int64_t hd, int64_t dim, int neox,
          double scale, const double *freq, int64_t t0, int64_t t1) {
  ROPE_BODY
}
#endif

void bk_rope(int simd, float *x, const int32_t *pos, int64_t heads, int64_t hd, int64_t dim,
             int neox, double scale, const double *freq, int64_t t0, int64_t t1) {
  UNUSED_SIMD(simd);
#ifdef BK_X86
  if (USE_SIMD(simd)) {
    rope_avx2(x, pos, heads, hd, dim, neox, scale, freq, t0, t1);
    return;
  }
#endif
  rope_scalar(x, pos, heads, hd, dim, neox, scale, freq, t0, t1);
}

/* --------------------------------------------------------- SwiGLU, Add */

#ifdef BK_X86
BK_VEXP(exp8, AVX2_INLINE, __m256, 256, _mm256, _mm256_round_ps)

AVX2 static void swiglu_avx2(float *out, const float *g, const float *u, int64_t n) {
  int64_t i = 0;
  __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(g + i);
    __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, x))));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; i++) out[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
}

AVX2 static void add_avx2(float *out, const float *a, const float *b, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  for (; i < n; i++) out[i] = a[i] + b[i];
}
#endif

void bk_swiglu(int simd, float *out, const float *g, const float *u, int64_t n) {
  UNUSED_SIMD(simd);
#ifdef BK_X86
  if (USE_SIMD(simd)) {
    swiglu_avx2(out, g, u, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) out[i] = (float)((double)g[i] / (1.0 + exp(-(double)g[i]))) * u[i];
}

void bk_add(int simd, float *out, const float *a, const float *b, int64_t n) {
  UNUSED_SIMD(simd);
#ifdef BK_X86
  if (USE_SIMD(simd)) {
    add_avx2(out, a, b, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ------------------------------------------------------------- Attention */

// One work item is up to BK_ATTN_MAX_MEMBERS (query row, query head) pairs
// of one sequence that share a KV head. Positions are walked in chunks of
// CHUNK; each chunk's K and V rows are read from memory once and reused
// from cache by every member, which keeps an online softmax (running max,
// running sum, rescaled accumulator) per member. A head's K (or V) rows
// sit a KV row apart (3 KiB for 12 heads of 64), a stride that maps them
// onto a few L1 sets: 32 positions stay in L1 for all members where 64
// did not (one thread, 16 rows x 512 positions of causal prefill: 9.3 ->
// 17.2 GFLOP/s; decode within noise).
#define CHUNK 32

typedef struct {
  float *qs;  // members x hd: q*scale
  float *acc; // members x hd
  float mx[BK_ATTN_MAX_MEMBERS], l[BK_ATTN_MAX_MEMBERS];
  int64_t last[BK_ATTN_MAX_MEMBERS];
  float *outp[BK_ATTN_MAX_MEMBERS];
  // Elements from a chunk row to the member's head: 0, or for a run of
  // heads (see bk_attention) the head's place in the KV row.
  int64_t koff[BK_ATTN_MAX_MEMBERS];
  // The next chunk's K and V rows (nk, nv; ncnt of them, rb bytes a head)
  // that the kernels prefetch as they go, each member its own head's.
  const char *nk[CHUNK], *nv[CHUNK];
  int64_t ncnt, rb;
  float sc[CHUNK + 8];
  // Rows of the chunk: float32, or on the AVX2 path the stored F16/BF16
  // rows themselves (widened as they are loaded).
  const void *kp[CHUNK + 8], *vp[CHUNK + 8];
} attn_scratch;

static void chunk_scalar(attn_scratch *s, int m, int64_t hd, int64_t cnt) {
  const float *q = s->qs + m * hd;
  float *acc = s->acc + m * hd;
  float cmax = -INFINITY;
  for (int64_t j = 0; j < cnt; j++) {
    float d = dot_scalar(q, s->kp[j], hd);
    s->sc[j] = d;
    if (d > cmax) cmax = d;
  }
  float nm = s->mx[m] > cmax ? s->mx[m] : cmax;
  if (nm != s->mx[m]) {
    float f = expf(s->mx[m] - nm);
    s->l[m] *= f;
    for (int64_t d = 0; d < hd; d++) acc[d] *= f;
    s->mx[m] = nm;
  }
  float sum = 0;
  for (int64_t j = 0; j < cnt; j++) {
    float p = expf(s->sc[j] - nm);
    sum += p;
    const float *v = (const float *)s->vp[j];
    for (int64_t d = 0; d < hd; d++) acc[d] += p * v[d];
  }
  s->l[m] += sum;
}

#ifdef BK_X86
// Requires hd % 8 == 0. KT is the stored element type and LD8(p) loads
// eight of them as float32, so F16/BF16 KV is widened in registers.
#define DEF_CHUNK_AVX2(NAME, KT, LD8) \
AVX2 static void NAME(attn_scratch *s, int m, int64_t hd, int64_t cnt) { \
  const float *q = s->qs + m * hd; \
  const int64_t ko = s->koff[m]; \
  float *acc = s->acc + m * hd; \
  /* Scores, eight positions at a time. */ \
  for (int64_t j0 = 0; j0 < cnt; j0 += 8) { \
    const KT *k[8]; \
    for (int t = 0; t < 8; t++) k[t] = (const KT *)s->kp[j0 + t < cnt ? j0 + t : cnt - 1] + ko; \
    for (int64_t t = j0; t < j0 + 8 && t < s->ncnt; t++) \
      bk_prefetch(s->nk[t] + ko * (int64_t)sizeof(KT), s->rb); \
    __m256 v0 = _mm256_setzero_ps(), v1 = v0, v2 = v0, v3 = v0, v4 = v0, v5 = v0, v6 = v0, \
           v7 = v0; \
    for (int64_t d = 0; d < hd; d += 8) { \
      __m256 qv = _mm256_loadu_ps(q + d); \
      v0 = _mm256_fmadd_ps(qv, LD8(k[0] + d), v0); \
      v1 = _mm256_fmadd_ps(qv, LD8(k[1] + d), v1); \
      v2 = _mm256_fmadd_ps(qv, LD8(k[2] + d), v2); \
      v3 = _mm256_fmadd_ps(qv, LD8(k[3] + d), v3); \
      v4 = _mm256_fmadd_ps(qv, LD8(k[4] + d), v4); \
      v5 = _mm256_fmadd_ps(qv, LD8(k[5] + d), v5); \
      v6 = _mm256_fmadd_ps(qv, LD8(k[6] + d), v6); \
      v7 = _mm256_fmadd_ps(qv, LD8(k[7] + d), v7); \
    } \
    _mm256_storeu_ps(s->sc + j0, hsum8x8(v0, v1, v2, v3, v4, v5, v6, v7)); \
  } \
  float cmax = -INFINITY; \
  for (int64_t j = 0; j < cnt; j++) \
    if (s->sc[j] > cmax) cmax = s->sc[j]; \
  float nm = s->mx[m] > cmax ? s->mx[m] : cmax; \
  if (nm != s->mx[m]) { \
    float f = expf(s->mx[m] - nm); \
    s->l[m] *= f; \
    __m256 fv = _mm256_set1_ps(f); \
    for (int64_t d = 0; d < hd; d += 8) \
      _mm256_storeu_ps(acc + d, _mm256_mul_ps(fv, _mm256_loadu_ps(acc + d))); \
    s->mx[m] = nm; \
  } \
  __m256 nmv = _mm256_set1_ps(nm); \
  for (int64_t j = 0; j < cnt; j += 8) \
    _mm256_storeu_ps(s->sc + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(s->sc + j), nmv))); \
  float sum = 0; \
  for (int64_t j = 0; j < cnt; j++) sum += s->sc[j]; \
  s->l[m] += sum; \
  /* acc += Σ p_j v_j, 32 dims at a time held in registers. */ \
  for (int64_t t = 0; t < s->ncnt; t++) \
    bk_prefetch(s->nv[t] + ko * (int64_t)sizeof(KT), s->rb); \
  int64_t d = 0; \
  for (; d + 32 <= hd; d += 32) { \
    __m256 a0 = _mm256_loadu_ps(acc + d), a1 = _mm256_loadu_ps(acc + d + 8), \
           a2 = _mm256_loadu_ps(acc + d + 16), a3 = _mm256_loadu_ps(acc + d + 24); \
    for (int64_t j = 0; j < cnt; j++) { \
      __m256 p = _mm256_broadcast_ss(s->sc + j); \
      const KT *v = (const KT *)s->vp[j] + ko + d; \
      a0 = _mm256_fmadd_ps(p, LD8(v), a0); \
      a1 = _mm256_fmadd_ps(p, LD8(v + 8), a1); \
      a2 = _mm256_fmadd_ps(p, LD8(v + 16), a2); \
      a3 = _mm256_fmadd_ps(p, LD8(v + 24), a3); \
    } \
    _mm256_storeu_ps(acc + d, a0); \
    _mm256_storeu_ps(acc + d + 8, a1); \
    _mm256_storeu_ps(acc + d + 16, a2); \
    _mm256_storeu_ps(acc + d + 24, a3); \
  } \
  for (; d < hd; d += 8) { \
    __m256 a0 = _mm256_loadu_ps(acc + d); \
    for (int64_t j = 0; j < cnt; j++) \
      a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(s->sc + j), LD8((const KT *)s->vp[j] + ko + d), a0); \
    _mm256_storeu_ps(acc + d, a0); \
  } \
}

AVX2_INLINE __m256 ld8f(const float *p) { return _mm256_loadu_ps(p); }
AVX2_INLINE __m256 ld8h(const uint16_t *p) { return ld8_f16((const uint8_t *)p); }
AVX2_INLINE __m256 ld8b(const uint16_t *p) { return ld8_bf16((const uint8_t *)p); }
DEF_CHUNK_AVX2(chunk_avx2, float, ld8f)
DEF_CHUNK_AVX2(chunk_avx2_f16, uint16_t, ld8h)
DEF_CHUNK_AVX2(chunk_avx2_bf16, uint16_t, ld8b)
#endif

#ifdef BK_X86
AVX2 static int64_t cvt_row_avx2(float *dst, const uint16_t *src, int64_t n, int dtype) {
  int64_t i = 0;
  if (dtype == BK_F16)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8_f16((const uint8_t *)(src + i)));
  else
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, ld8_bf16((const uint8_t *)(src + i)));
  return i;
}
#endif

// Exactly kernels.F32ToF16 (round to nearest even, NaN to sign|0x7e00).
static uint16_t f2h(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  uint16_t sign = (uint16_t)(b >> 16) & 0x8000;
  int32_t exp = (int32_t)(b >> 23) & 0xff;
  uint32_t man = b & 0x7fffff;
  if (exp == 0xff) return sign | (man ? 0x7e00 : 0x7c00);
  int32_t e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - e), half = 1u << (shift - 1);
    uint32_t r = man >> shift, rem = man & ((1u << shift) - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t r = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return sign | (uint16_t)r;
}

#ifdef BK_X86
// F16C rounds to nearest even like f2h; only NaNs differ (it keeps their
// payload), so groups of 8 holding one go through f2h.
AVX2 static int64_t f2h_avx2(uint16_t *dst, const float *src, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(src + i);
    if (_mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q))) {
      for (int j = 0; j < 8; j++) dst[i + j] = f2h(src[i + j]);
      continue;
    }
    _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}
#endif

void bk_f32_to_f16(int simd, uint16_t *dst, const float *src, int64_t n) {
  UNUSED_SIMD(simd);
  int64_t i = 0;
#ifdef BK_X86
  if (USE_SIMD(simd)) i = f2h_avx2(dst, src, n);
#endif
  for (; i < n; i++) dst[i] = f2h(src[i]);
}

// cvt_row widens n stored KV elements (F16 or BF16) to float32.
static void cvt_row(int simd, float *dst, const uint16_t *src, int64_t n, int dtype) {
  UNUSED_SIMD(simd);
  int64_t i = 0;
#ifdef BK_X86
  if (USE_SIMD(simd)) i = cvt_row_avx2(dst, src, n, dtype);
#endif
  if (dtype == BK_F16)
    for (; i < n; i++) dst[i] = h2f(src[i]);
  else
    for (; i < n; i++) dst[i] = bits_f32((uint32_t)src[i] << 16);
}

int bk_attention(int simd, float *out, const float *q, const void *kv, const int32_t *pages,
                 const int64_t *seqs, const int32_t *items, int64_t it0, int64_t it1,
                 const bk_attn_geom *g) {
  UNUSED_SIMD(simd);
  const int64_t hd = g->head_dim, ps = g->page_size, rf = g->row_floats;
#ifdef BK_X86
  if (simd >= 2 && g_have_avx512 && hd % 16 == 0)
    return bk_attention_avx512(out, q, kv, pages, seqs, items, it0, it1, g);
  int vec = USE_SIMD(simd) && hd % 8 == 0;
#else
  const int vec = 0;
#endif
  // A pool of F16 or BF16 is widened as it is loaded on the AVX2 path;
  // the scalar path widens a chunk at a time into kw/vw, once per item
  // and chunk, and every member then reads float32 as for F32.
  const int half = g->kv_dtype != BK_F32;
  attn_scratch s;
  s.qs = malloc(sizeof(float) * (2 * BK_ATTN_MAX_MEMBERS + 2 * CHUNK) * hd);
  if (!s.qs) return -1;
  s.acc = s.qs + BK_ATTN_MAX_MEMBERS * hd;
  float *kw = s.acc + BK_ATTN_MAX_MEMBERS * hd, *vw = kw + CHUNK * hd;
  const int64_t es = half ? 2 : 4;
  const char *kvb = kv;
  s.rb = hd * es;
  bk_span next = {0};
  if (it0 < it1) next = bk_item_span(seqs, pages, items + it0 * BK_ITEM_FIELDS, g);
  for (int64_t it = it0, run = 1; it < it1; it += run) {
    const int32_t *item = items + it * BK_ITEM_FIELDS;
    const int64_t *seq = seqs + item[BK_IT_SEQ] * BK_SEQ_FIELDS;
    int64_t qstart = seq[BK_SEQ_QSTART], qlen = seq[BK_SEQ_QLEN], kvlen = seq[BK_SEQ_KVLEN];
    // A run of heads (bk_head_run) is worked as one item.
    run = vec ? bk_head_run(items, it, it1) : 1;
    int members = run > 1 ? (int)run : item[BK_IT_NROWS] * item[BK_IT_NH];
    for (int m = 0; m < members; m++) {
      int64_t r, h;
      bk_member(items, it, run, m, &r, &h);
      int64_t row = qstart + r;
      const float *qm = q + (row * g->heads + h) * hd;
      for (int64_t d = 0; d < hd; d++) {
        s.qs[m * hd + d] = qm[d] * g->scale;
        s.acc[m * hd + d] = 0;
      }
      s.mx[m] = -INFINITY;
      s.l[m] = 0;
      s.last[m] = kvlen - qlen + r;
      s.outp[m] = out + (row * g->heads + h) * hd;
      s.koff[m] = run > 1 ? m * hd : 0;
    }
    const bk_span cur = next;
    const int64_t maxlast = cur.maxlast, width = run * hd; // elements of a KV row read
    if (it + run < it1) next = bk_item_span(seqs, pages, items + (it + run) * BK_ITEM_FIELDS, g);
    if (it == it0) bk_prefetch_rows(kvb, es, &cur, 0, CHUNK - 1, width, g);
    // With several members (prefill rows, GQA groups) the chunk's K and V
    // rows are first copied (widened) into contiguous scratch: in place
    // they sit a KV row apart, a stride that maps them onto a few L1 sets,
    // and every member after the first missed L1 on them (one thread, 16
    // rows x 512 positions of causal prefill: 2-3x faster). One member
    // reads each row once, so it reads them in place, as does a run of
    // heads.
    const int pack = run == 1 && members >= 4;
    for (int64_t c0 = 0; c0 <= maxlast; c0 += CHUNK) {
      int64_t c1 = c0 + CHUNK <= maxlast + 1 ? c0 + CHUNK : maxlast + 1;
      // The next chunk, or the next item's first, is on its way while
      // this one is worked on. With rows read in place, each member's
      // kernel prefetches its head's part of the next chunk as it works
      // (K rows eight at a time among the scores, V rows before the
      // weighted sums): a whole chunk's rows asked for at once (all heads
      // of a run) overflow the core's outstanding misses, and that alone
      // left decode attention latency-bound. Decode of 32 sequences
      // x 130-260 positions, 12 layers of an F16 pool, 2 threads, AVX2,
      // two interleaved rounds (BenchmarkAttention): 13.5 and 9.9 -> 27.4
      // and 18.5 GB/s; a 32-row decode step of the 134M model at 512
      // positions (BenchmarkDecodeKVDType, f16): 98-130 -> 74-107 ms.
      s.ncnt = bk_ahead(s.nk, s.nv, kvb, es, &cur, it + run < it1 ? &next : NULL, c1, CHUNK,
                        vec && !pack, width, g);
      for (int64_t p = c0; p < c1; p++) {
        int64_t off = bk_row_off(&cur, p, g);
        if (pack) {
          float *kd = kw + (p - c0) * hd, *vd = vw + (p - c0) * hd;
          if (half) {
            cvt_row(simd, kd, (const uint16_t *)kv + off, hd, g->kv_dtype);
            cvt_row(simd, vd, (const uint16_t *)kv + off + ps * rf, hd, g->kv_dtype);
          } else {
            memcpy(kd, (const float *)kv + off, sizeof(float) * hd);
            memcpy(vd, (const float *)kv + off + ps * rf, sizeof(float) * hd);
          }
          s.kp[p - c0] = kd;
          s.vp[p - c0] = vd;
          continue;
        }
        if (!half) {
          const float *k = (const float *)kv + off;
          s.kp[p - c0] = k;
          s.vp[p - c0] = k + ps * rf;
          continue;
        }
#ifdef BK_X86
        if (vec) {
          const uint16_t *k = (const uint16_t *)kv + off;
          s.kp[p - c0] = k;
          s.vp[p - c0] = k + ps * rf;
          continue;
        }
#endif
        const uint16_t *k = (const uint16_t *)kv + off;
        float *kd = kw + (p - c0) * hd, *vd = vw + (p - c0) * hd;
        cvt_row(simd, kd, k, hd, g->kv_dtype);
        cvt_row(simd, vd, k + ps * rf, hd, g->kv_dtype);
        s.kp[p - c0] = kd;
        s.vp[p - c0] = vd;
      }
      const int64_t ncnt = s.ncnt;
      for (int m = 0; m < members; m++) {
        int64_t e = s.last[m] + 1 < c1 ? s.last[m] + 1 : c1;
        if (e <= c0) continue;
        // Members of one KV head share the rows: the first prefetches them.
        s.ncnt = run > 1 || m == 0 ? ncnt : 0;
#ifdef BK_X86
        if (vec) {
          if (pack)
            chunk_avx2(&s, m, hd, e - c0);
          else if (g->kv_dtype == BK_F16)
            chunk_avx2_f16(&s, m, hd, e - c0);
          else if (g->kv_dtype == BK_BF16)
            chunk_avx2_bf16(&s, m, hd, e - c0);
          else
            chunk_avx2(&s, m, hd, e - c0);
          continue;
        }
#endif
        chunk_scalar(&s, m, hd, e - c0);
      }
    }
    for (int m = 0; m < members; m++) {
      float inv = 1.0f / s.l[m];
      for (int64_t d = 0; d < hd; d++) s.outp[m][d] = s.acc[m * hd + d] * inv;
    }
  }
  free(s.qs);
  return 0;
}
