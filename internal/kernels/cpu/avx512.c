// The AVX-512 gemm (see bk_gemm): the AVX2 one's micro-tile with a 16-wide
// register per x panel column, so each FMA does twice the work, and a
// blocking of its own (bk_gemm_avx512).
// Compiled with a target attribute like the AVX2 code and chosen at run
// time.
#include "cpu.h"

#include <string.h>

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,prfchw")))
#define AVX512_INLINE                                                                         \
  static inline __attribute__((always_inline,                                                \
                               target("avx512f,avx512bw,avx512vl,avx2,fma,f16c,prfchw")))

// Weight rows per micro-tile and up to 3 panels (16 x rows each) per
// micro-kernel call: 3 x 8 sums in 24 of the 32 registers; per column 3
// loads of x and 8 broadcasts feed 24 FMAs. Each broadcast is used for
// every panel right away, so it holds one register, and the 8 row
// pointers, 3 panel pointers and the counter fit the integer registers
// (12 rows spilled both).
#define ZW 8

#define ROWS8                                                                                 \
  const float *w0 = wr[0] + k0, *w1 = wr[1] + k0, *w2 = wr[2] + k0, *w3 = wr[3] + k0,        \
              *w4 = wr[4] + k0, *w5 = wr[5] + k0, *w6 = wr[6] + k0, *w7 = wr[7] + k0;

#define ZERO8(P)                                                                              \
  __m512 P##0 = _mm512_setzero_ps(), P##1 = P##0, P##2 = P##0, P##3 = P##0, P##4 = P##0,     \
         P##5 = P##0, P##6 = P##0, P##7 = P##0;

#define ACC1(c, v) _mm512_storeu_ps(c, _mm512_add_ps(_mm512_loadu_ps(c), v))
#define ACC8(P, c)                                                                            \
  ACC1(c, P##0);                                                                              \
  ACC1(c + ldc, P##1);                                                                        \
  ACC1(c + 2 * ldc, P##2);                                                                    \
  ACC1(c + 3 * ldc, P##3);                                                                    \
  ACC1(c + 4 * ldc, P##4);                                                                    \
  ACC1(c + 5 * ldc, P##5);                                                                    \
  ACC1(c + 6 * ldc, P##6);                                                                    \
  ACC1(c + 7 * ldc, P##7);

#define ROW3(j)                                                                               \
  b = _mm512_set1_ps(w##j[k]);                                                                \
  a##j = _mm512_fmadd_ps(b, x0, a##j);                                                        \
  c##j = _mm512_fmadd_ps(b, x1, c##j);                                                        \
  d##j = _mm512_fmadd_ps(b, x2, d##j);
#define ROW2(j)                                                                               \
  b = _mm512_set1_ps(w##j[k]);                                                                \
  a##j = _mm512_fmadd_ps(b, x0, a##j);                                                        \
  c##j = _mm512_fmadd_ps(b, x1, c##j);
#define ROW1(j) a##j = _mm512_fmadd_ps(_mm512_set1_ps(w##j[k]), x0, a##j);

// Three panels by 8 weight rows over columns [k0, k0+kl).
AVX512 static void zk3(const float *xa, int64_t pstride, const float *const *wr, int64_t k0,
                       int64_t kl, float *c, int64_t ldc) {
  ZERO8(a) ZERO8(c) ZERO8(d) ROWS8
  const float *xb = xa + pstride, *xc = xb + pstride;
  for (int64_t k = 0; k < kl; k++) {
    __m512 x0 = _mm512_loadu_ps(xa + 16 * k), x1 = _mm512_loadu_ps(xb + 16 * k),
           x2 = _mm512_loadu_ps(xc + 16 * k), b;
    ROW3(0) ROW3(1) ROW3(2) ROW3(3) ROW3(4) ROW3(5) ROW3(6) ROW3(7)
  }
  ACC8(a, c) ACC8(c, c + 16) ACC8(d, c + 32)
}

AVX512 static void zk2(const float *xa, int64_t pstride, const float *const *wr, int64_t k0,
                       int64_t kl, float *c, int64_t ldc) {
  ZERO8(a) ZERO8(c) ROWS8
  const float *xb = xa + pstride;
  for (int64_t k = 0; k < kl; k++) {
    __m512 x0 = _mm512_loadu_ps(xa + 16 * k), x1 = _mm512_loadu_ps(xb + 16 * k), b;
    ROW2(0) ROW2(1) ROW2(2) ROW2(3) ROW2(4) ROW2(5) ROW2(6) ROW2(7)
  }
  ACC8(a, c) ACC8(c, c + 16)
}

AVX512 static void zk1(const float *xa, const float *const *wr, int64_t k0, int64_t kl, float *c,
                       int64_t ldc) {
  ZERO8(a) ROWS8
  for (int64_t k = 0; k < kl; k++) {
    __m512 x0 = _mm512_loadu_ps(xa + 16 * k);
    ROW1(0) ROW1(1) ROW1(2) ROW1(3) ROW1(4) ROW1(5) ROW1(6) ROW1(7)
  }
  ACC8(a, c)
}

// The x panels of a block stay in L2 (ZXB bytes) while every weight row
// of the range streams past them, 8 at a time, so each weight is read from
// memory (and dequantised) once per block of panels. When the panels'
// whole rows do not fit, the product is blocked in k as well: a block then
// holds a slice of kc columns of every panel (kc a multiple of the block
// formats' 256-element super-block), and the weight rows are read a slice
// at a time (blocks in n and k of about equal size). Sums go to cbuf, a
// (rows x panels) tile of at most ZCB bytes, once per ZK columns: a slice
// of 8 weight rows stays in L1 while it meets every panel.
#define ZK 128
#define ZXB (384 * 1024)
// Up to this much, all panels' slices form one block, so each weight is
// dequantised once per product: 512 rows in 256-column slices take 512
// KiB (weights from memory, 2 threads, 512 rows: Q4_K 2048x5632 224-262
// -> 254-292 GFLOP/s, F16 5632x2048 247-274 -> 274-320).
#define ZXB_ONE (640 * 1024)
#define ZCB (256 * 1024)

// bk_gemm_put for tiles of 16 weight rows (two micro-tiles), 16 result
// rows at a time: each 8x16 half is transposed in registers and each
// result row's 16 floats (one cache line, where rows is a multiple of 16)
// are four 16-byte stores in a row. Model widths make rows a power of two,
// so the result rows fall on one cache set: a put per 8 weight rows wrote
// half of each line and the line was evicted before the next put wrote the
// other half (the put was 10% of the gemm's time in a 134M prefill).
// u[m] = weight rows 0-3 of column 4k+m in 128-bit lane k, u[m+4] rows
// 4-7, for the 8 tile rows t, t + ldc, ... (16 columns each).
AVX512_INLINE void transpose8(const float *t, int64_t ldc, __m512 u[8]) {
  __m512 r[8];
  for (int j = 0; j < 8; j++) r[j] = _mm512_loadu_ps(t + j * ldc);
  for (int j = 0; j < 8; j += 2) {
    __m512 lo = _mm512_unpacklo_ps(r[j], r[j + 1]), hi = _mm512_unpackhi_ps(r[j], r[j + 1]);
    r[j] = lo, r[j + 1] = hi;
  }
  for (int h = 0; h < 8; h += 4) {
    u[h] = _mm512_shuffle_ps(r[h], r[h + 2], 0x44);
    u[h + 1] = _mm512_shuffle_ps(r[h], r[h + 2], 0xEE);
    u[h + 2] = _mm512_shuffle_ps(r[h + 1], r[h + 3], 0x44);
    u[h + 3] = _mm512_shuffle_ps(r[h + 1], r[h + 3], 0xEE);
  }
}
// Result row i + 4k + m from lane k of a (weight rows 0-7) and, for a
// pair of tiles, b (rows 8-15). The lane is an immediate, hence a macro.
#define PUT_ROW(k, m)                                                                          \
  do {                                                                                         \
    float *o_ = out + (i + 4 * (k) + (m)) * rows;                                              \
    _mm_storeu_ps(o_, _mm512_extractf32x4_ps(a[m], k));                                        \
    _mm_storeu_ps(o_ + 4, _mm512_extractf32x4_ps(a[(m) + 4], k));                              \
    if (two) {                                                                                 \
      _mm_storeu_ps(o_ + 8, _mm512_extractf32x4_ps(b[m], k));                                  \
      _mm_storeu_ps(o_ + 12, _mm512_extractf32x4_ps(b[(m) + 4], k));                           \
    }                                                                                          \
  } while (0)

AVX512 static void gemm_put512(float *out, int64_t rows, const float *tile, int64_t ldc, int nw,
                               int64_t i0, int64_t i1) {
  int64_t i = i0;
  int two = nw == 2 * ZW;
  if (nw == ZW || two) {
    for (; i + 16 <= i1; i += 16) {
      const float *t = tile + (i - i0);
      __m512 a[8], b[8];
      transpose8(t, ldc, a);
      if (two) transpose8(t + ZW * ldc, ldc, b);
      for (int m = 0; m < 4; m++) {
        PUT_ROW(0, m);
        PUT_ROW(1, m);
        PUT_ROW(2, m);
        PUT_ROW(3, m);
      }
    }
  }
  if (i < i1) bk_gemm_put(out, rows, tile + (i - i0), ldc, nw, i, i1);
}
#undef PUT_ROW

// Sixteen F16 or BF16 elements at p widened to float32 (the gemm's weight
// slices, the gemv's rows).
AVX512 static inline __m512 z_f16(const uint8_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
AVX512 static inline __m512 z_bf16(const uint8_t *p) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// bk_gemm_rows with F16 and BF16 rows widened 16 at a time (the AVX2
// dequantiser takes 8): a prefill's conversion of each weight slice was
// 4% of a 1.1B F16 model's 512-token prefill.
AVX512 static void gemm_rows512(const float **wr, int nw, const uint8_t *w, int64_t rb, int dtype,
                                int64_t cols, float *deq) {
  if ((dtype != BK_F16 && dtype != BK_BF16) || cols % 16 != 0) {
    bk_gemm_rows(wr, ZW, nw, w, rb, dtype, cols, deq);
    return;
  }
  for (int j = 0; j < ZW; j++) {
    wr[j] = deq + (j < nw ? j : 0) * cols; // past the end: repeat row 0, result dropped
    if (j >= nw) continue;
    const uint8_t *row = w + j * rb;
    float *d = deq + j * cols;
    for (int64_t k = 0; k < cols; k += 16)
      _mm512_storeu_ps(d + k, dtype == BK_F16 ? z_f16(row + 2 * k) : z_bf16(row + 2 * k));
  }
}

AVX512 void bk_gemm_avx512(float *out, const float *xp, int64_t n, const uint8_t *w, int dtype,
                           int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  int64_t rb = bk_row_bytes(dtype, cols);
  int64_t npan = (n + 15) / 16;
  int64_t kc = cols, pb = npan;
  if (npan * cols * 64 > ZXB) {
    kc = ZXB / (npan * 64) / 256 * 256;
    if (kc < 256) kc = 256;
    if (kc > cols) kc = cols;
    int64_t nkb = (cols + kc - 1) / kc; // slices of about equal size
    kc = ((cols + nkb - 1) / nkb + 255) / 256 * 256;
    int64_t pmax = ZXB / (64 * kc);
    if (npan * 64 * kc <= ZXB_ONE) pmax = npan;
    if (pmax < 3) pmax = 3;
    int64_t nblk = (npan + pmax - 1) / pmax;
    pb = (npan + nblk - 1) / nblk; // blocks of about equal size
  }
  int64_t ldc = 16 * pb;
  int64_t rbk = ZCB / (4 * ldc) / (2 * ZW) * (2 * ZW); // weight rows per cbuf, pairs of tiles
  if (rbk < 2 * ZW) rbk = 2 * ZW;
  float *cbuf = bk_scratch((size_t)(rbk * ldc + (dtype == BK_F32 ? 0 : ZW * kc)));
  float *deq = cbuf + rbk * ldc;
  for (int64_t p0 = 0; p0 < npan; p0 += pb) {
    int64_t p1 = p0 + pb < npan ? p0 + pb : npan;
    int64_t i1 = 16 * p1 < n ? 16 * p1 : n;
    for (int64_t rr = r0; rr < r1; rr += rbk) {
      int64_t rr1 = rr + rbk < r1 ? rr + rbk : r1;
      for (int64_t kb = 0; kb < cols; kb += kc) {
        int64_t kbl = cols - kb < kc ? cols - kb : kc;
        int64_t koff = bk_row_bytes(dtype, kb), sb = bk_row_bytes(dtype, kbl);
        for (int64_t r = rr; r < rr1; r += ZW) {
          int nw = rr1 - r < ZW ? (int)(rr1 - r) : ZW;
          const float *wr[ZW];
          gemm_rows512(wr, nw, w + r * rb + koff, rb, dtype, kbl, deq);
          float *c = cbuf + (r - rr) * ldc;
          // A tile is zeroed before its first slice and written out after
          // its last, while it is in L1: done for the whole cbuf at once,
          // the weights streamed in between had evicted it, and the put
          // (6% of a 32-row decode step of the 134M F32 model) waited on
          // memory.
          if (kb == 0) memset(c, 0, sizeof(float) * (size_t)(ZW * ldc));
          // The next 8 rows' slice is prefetched a part per ZK columns:
          // left to the hardware, their first reads stalled on memory
          // (a weight slice is a few KiB at a new place in every row).
          const uint8_t *nx = r + ZW < rr1 ? w + (r + ZW) * rb + koff : NULL;
          for (int64_t k0 = 0; k0 < kbl; k0 += ZK) {
            int64_t kl = kbl - k0 < ZK ? kbl - k0 : ZK;
            const float *xs = xp + kb * 16 + k0 * 16;
            if (nx) {
              int64_t b0 = sb * k0 / kbl, b1 = sb * (k0 + kl) / kbl;
              for (int j = 0; j < ZW; j++)
                for (int64_t o = b0; o < b1; o += 64)
                  _mm_prefetch((const char *)nx + j * rb + o, _MM_HINT_T0);
            }
            int64_t p = p0;
            for (; p + 3 <= p1; p += 3)
              zk3(xs + p * cols * 16, cols * 16, wr, k0, kl, c + (p - p0) * 16, ldc);
            if (p + 2 <= p1) {
              zk2(xs + p * cols * 16, cols * 16, wr, k0, kl, c + (p - p0) * 16, ldc);
              p += 2;
            }
            if (p < p1) zk1(xs + p * cols * 16, wr, k0, kl, c + (p - p0) * 16, ldc);
          }
          // Put in pairs of micro-tiles (see gemm_put512).
          int64_t g = (r - rr) / ZW;
          if (kb + kbl >= cols && g % 2 == 0)
            for (int64_t i = 16 * p0; i < i1; i++)
              _mm_prefetch((const char *)(out + r + i * rows), _MM_HINT_ET0);
          if (kb + kbl >= cols && (g % 2 == 1 || r + ZW >= rr1)) {
            int64_t rs = g % 2 == 1 ? r - ZW : r;
            gemm_put512(out + rs, rows, cbuf + (rs - rr) * ldc, ldc, (int)(r + nw - rs), 16 * p0,
                        i1);
          }
        }
      }
    }
  }
}

// x rows to panels (bk_pack_x) 16 columns at a time: 16 rows' 64-byte
// pieces are loaded whole and transposed in registers. Copied an element
// at a time, the 16 rows (a power-of-two stride apart, as model widths
// are) fell on one L1 set and evicted each other's lines between reads.
AVX512 int64_t bk_pack_x_avx512(float *xp, const float *x, int64_t n, int64_t cols, int64_t p0,
                                int64_t p1) {
  int64_t kend = cols / 16 * 16;
  for (int64_t p = p0; p < p1; p++) {
    float *d = xp + p * cols * 16;
    int64_t live = n - 16 * p < 16 ? n - 16 * p : 16;
    for (int64_t k0 = 0; k0 < kend; k0 += 16) {
      __m512 r[16], a[16], b[16];
      for (int l = 0; l < 16; l++)
        r[l] = l < live ? _mm512_loadu_ps(x + (16 * p + l) * cols + k0) : _mm512_setzero_ps();
      for (int i = 0; i < 8; i++) {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
      }
      // b[4j+e]: in 128-bit lane L, rows 4j..4j+3 of column 4L+e.
      for (int j = 0; j < 4; j++) {
        __m512d t0 = _mm512_castps_pd(a[4 * j]), t1 = _mm512_castps_pd(a[4 * j + 1]),
                t2 = _mm512_castps_pd(a[4 * j + 2]), t3 = _mm512_castps_pd(a[4 * j + 3]);
        b[4 * j] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
        b[4 * j + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
        b[4 * j + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
        b[4 * j + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
      }
      // Then a 4x4 transpose of 128-bit lanes for each e.
      for (int e = 0; e < 4; e++) {
        __m512 c0 = _mm512_shuffle_f32x4(b[e], b[4 + e], 0x44);
        __m512 c1 = _mm512_shuffle_f32x4(b[e], b[4 + e], 0xEE);
        __m512 c2 = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], 0x44);
        __m512 c3 = _mm512_shuffle_f32x4(b[8 + e], b[12 + e], 0xEE);
        _mm512_storeu_ps(d + 16 * (k0 + e), _mm512_shuffle_f32x4(c0, c2, 0x88));
        _mm512_storeu_ps(d + 16 * (k0 + 4 + e), _mm512_shuffle_f32x4(c0, c2, 0xDD));
        _mm512_storeu_ps(d + 16 * (k0 + 8 + e), _mm512_shuffle_f32x4(c1, c3, 0x88));
        _mm512_storeu_ps(d + 16 * (k0 + 12 + e), _mm512_shuffle_f32x4(c1, c3, 0xDD));
      }
    }
  }
  return kend;
}

// Decode (n == 1) with 16-wide vectors: one weight row streamed at a time
// with four accumulators, as the AVX2 gemv. Weights are prefetched ZPF
// bytes ahead: a decode step streams them from memory, and the converts
// and FMAs between loads leave too few misses in flight otherwise.
#define ZPF 4096
AVX512 static inline __m512 z_f32(const uint8_t *p) { return _mm512_loadu_ps((const float *)p); }
AVX512 static inline __m512 z_q8(const uint8_t *p) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

#define ZROW(NAME, LOAD, STEP, TAIL)                                                          \
  AVX512 static float NAME(const uint8_t *w, const float *x, int64_t cols) {                  \
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                               \
    int64_t k = 0;                                                                            \
    for (; k + 64 <= cols; k += 64) {                                                         \
      _mm_prefetch((const char *)(w + STEP * k) + ZPF, _MM_HINT_T0);                           \
      _mm_prefetch((const char *)(w + STEP * k) + ZPF + 64, _MM_HINT_T0);                      \
      a0 = _mm512_fmadd_ps(LOAD(w + STEP * k), _mm512_loadu_ps(x + k), a0);                   \
      a1 = _mm512_fmadd_ps(LOAD(w + STEP * (k + 16)), _mm512_loadu_ps(x + k + 16), a1);       \
      a2 = _mm512_fmadd_ps(LOAD(w + STEP * (k + 32)), _mm512_loadu_ps(x + k + 32), a2);       \
      a3 = _mm512_fmadd_ps(LOAD(w + STEP * (k + 48)), _mm512_loadu_ps(x + k + 48), a3);       \
    }                                                                                         \
    for (; k + 16 <= cols; k += 16)                                                           \
      a0 = _mm512_fmadd_ps(LOAD(w + STEP * k), _mm512_loadu_ps(x + k), a0);                   \
    float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3))); \
    for (; k < cols; k++) r += TAIL;                                                          \
    return r;                                                                                 \
  }

static inline float z_ldf(const uint8_t *p) {
  float v;
  memcpy(&v, p, 4);
  return v;
}
static inline float z_bf(const uint8_t *p) {
  uint32_t b = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 24;
  float v;
  memcpy(&v, &b, 4);
  return v;
}
extern float g_f16[65536];
static inline float z_h(const uint8_t *p) { return g_f16[p[0] | p[1] << 8]; }

ZROW(zrow_f32, z_f32, 4, z_ldf(w + 4 * k) * x[k])
ZROW(zrow_f16, z_f16, 2, z_h(w + 2 * k) * x[k])
ZROW(zrow_bf16, z_bf16, 2, z_bf(w + 2 * k) * x[k])

// Q8_0: per block of 32, q·x in float, scaled by d once.
AVX512 static float zrow_q8(const uint8_t *w, const float *x, int64_t cols) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t nb = cols / 32, b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t *q = w + 34 * b;
    const float *xb = x + 32 * b;
    _mm_prefetch((const char *)q + ZPF, _MM_HINT_T0);
    _mm_prefetch((const char *)q + ZPF + 64, _MM_HINT_T0);
    __m512 t = _mm512_mul_ps(z_q8(q + 2), _mm512_loadu_ps(xb));
    t = _mm512_fmadd_ps(z_q8(q + 18), _mm512_loadu_ps(xb + 16), t);
    a0 = _mm512_fmadd_ps(_mm512_set1_ps(z_h(q)), t, a0);
    __m512 u = _mm512_mul_ps(z_q8(q + 36), _mm512_loadu_ps(xb + 32));
    u = _mm512_fmadd_ps(z_q8(q + 52), _mm512_loadu_ps(xb + 48), u);
    a1 = _mm512_fmadd_ps(_mm512_set1_ps(z_h(q + 34)), u, a1);
  }
  for (; b < nb; b++) {
    const uint8_t *q = w + 34 * b;
    const float *xb = x + 32 * b;
    __m512 t = _mm512_mul_ps(z_q8(q + 2), _mm512_loadu_ps(xb));
    t = _mm512_fmadd_ps(z_q8(q + 18), _mm512_loadu_ps(xb + 16), t);
    a0 = _mm512_fmadd_ps(_mm512_set1_ps(z_h(q)), t, a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

int bk_gemv_avx512(float *out, const float *x, const uint8_t *w, int dtype, int64_t cols,
                   int64_t r0, int64_t r1) {
  float (*row)(const uint8_t *, const float *, int64_t);
  switch (dtype) {
  case BK_F32: row = zrow_f32; break;
  case BK_F16: row = zrow_f16; break;
  case BK_BF16: row = zrow_bf16; break;
  case BK_Q8_0: row = zrow_q8; break;
  default: return 0;
  }
  int64_t rb = bk_row_bytes(dtype, cols);
  for (int64_t r = r0; r < r1; r++) out[r] = row(w + r * rb, x, cols);
  return 1;
}

// 12 independent FMA chains on registers, for the machine's FMA peak.
AVX512 static double fma_peak_512(int64_t iters) {
  __m512 a[12], m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  for (int64_t it = 0; it < iters; it++)
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], m, c);
  __m512 s = a[0];
  for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}
#endif

#if !(defined(__x86_64__) && !defined(BK_NO_SIMD))
int64_t bk_pack_x_avx512(float *xp, const float *x, int64_t n, int64_t cols, int64_t p0,
                         int64_t p1) {
  (void)xp, (void)x, (void)n, (void)cols, (void)p0, (void)p1;
  return 0;
}
#endif

double bk_fma_peak_avx512(int64_t iters) {
#if defined(__x86_64__) && !defined(BK_NO_SIMD)
  return fma_peak_512(iters);
#else
  (void)iters;
  return 0;
#endif
}

