// An int8 gemm for the ggml block formats (Q2_K..Q6_K and the 32-element
// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) with AVX-512 VNNI, for
// products of many x rows (prefill). x is quantised to 8 bits as for the
// integer dot products of decode (a scale per 256 elements for the K
// formats, per 32 for the others), and each weight row is unpacked once
// per product to unsigned 8-bit quants; vpdpbusd then does 64
// multiply-adds an instruction where the float gemm's FMA does 16.
//
// Both sides of a 256-element block are laid out so that 32-bit lane L of
// the four 64-byte chunks holds elements 16L..16L+15 (chunk i elements
// 16L+4i..16L+4i+3): the four vpdpbusd of a block leave in lane L the
// integer dot product of 16 elements, which all share one scale and one
// minimum in every format (a Q4_K/Q5_K sub-block or a 32-element block is
// lanes 2j and 2j+1, a Q6_K sub-block one lane L). One float multiply-add
// per block applies the scales, and one more the minimums against the x
// sums of the lane, so a weight row needs no other per-format code once
// unpacked:
//
//	value = SC[L]·q - MN[L]   (q the unsigned quant)
//	Q4_K, Q5_K: SC = d·scale[L/2], MN = dmin·min[L/2]
//	Q6_K:       SC = d·scale[L],   MN = 32·d·scale[L]
//	Q3_K:       SC = d·scale[L],   MN = 4·d·scale[L]    (q = q3 + 4·hbit)
//	Q2_K:       SC = d·scale[L],   MN = dmin·min[L]
//	Q8_0:       SC = d[L/2],       MN = 128·d[L/2]  (q = the int8 + 128)
//	Q4_0, Q5_0: SC = d[L/2],       MN = 8·d, 16·d
//	Q4_1, Q5_1: SC = d[L/2],       MN = -m[L/2]
#include "cpu.h"
#include "kquants512.h"
#include "kscales.h"

#include <float.h>
#include <math.h>
#include <string.h>

// One 256-element block of either side: 256 quants in the lane layout,
// then 16 floats (weights: SC; x: the lane sums times the lane's x
// scale), then 16 more (weights: MN; x: the lane's x scale).
#define QG_REC 384

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#define QG __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define QG_INLINE                                                                              \
  static inline __attribute__((always_inline,                                                  \
                               target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))

extern float g_f16[65536];
static inline float qg_h(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return g_f16[v];
}

// Four chunks in element order (chunk m: elements 64m..64m+63) to the
// lane layout: chunk i lane L takes natural dword 4L+i, which lies in
// chunk L/4 at lane 4(L%4)+i.
QG_INLINE void qg_lanes(uint8_t *dst, const __m512i nat[4]) {
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    const __m512i idx = _mm512_set_epi32(28 + i, 24 + i, 20 + i, 16 + i, 12 + i, 8 + i, 4 + i, i,
                                         28 + i, 24 + i, 20 + i, 16 + i, 12 + i, 8 + i, 4 + i, i);
    __m512i lo = _mm512_permutex2var_epi32(nat[0], idx, nat[1]);
    __m512i hi = _mm512_permutex2var_epi32(nat[2], idx, nat[3]);
    _mm512_storeu_si512((void *)(dst + 64 * i), _mm512_mask_blend_epi32(0xFF00, lo, hi));
  }
}

// Bytes of a weight row per 256 elements.
static int64_t qg_bytes(int dt) {
  switch (dt) {
  case BK_Q4_K: return 144;
  case BK_Q5_K: return 176;
  case BK_Q6_K: return 210;
  case BK_Q3_K: return 110;
  case BK_Q2_K: return 84;
  case BK_Q8_0: return 8 * 34;
  case BK_Q4_0: return 8 * 18;
  case BK_Q4_1: return 8 * 20;
  case BK_Q5_0: return 8 * 22;
  case BK_Q5_1: return 8 * 24;
  }
  return 0;
}

// 32 quants of a Q4_0/Q4_1/Q5_0/Q5_1 block, unsigned: element e < 16 the
// low nibble of qs[e], e >= 16 the high nibble of qs[e-16], and bit e of
// qh as the fifth.
QG_INLINE __m256i qg_nib32(const uint8_t *qs, uint32_t qh) {
  const __m128i m4 = _mm_set1_epi8(15);
  __m128i v = _mm_loadu_si128((const __m128i *)qs);
  __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(v, m4)),
                                      _mm_and_si128(_mm_srli_epi16(v, 4), m4), 1);
  return _mm256_or_si256(q, _mm256_maskz_set1_epi8((__mmask32)qh, 16));
}

// Eight 32-element blocks of a weight row to a record.
QG_INLINE void qg_unpack32(uint8_t *rec, const uint8_t *B, int dt) {
  __m512i nat[4];
  float *sc = (float *)(rec + 256), *mn = sc + 16;
  const int64_t bytes = qg_bytes(dt) / 8;
  __m256i q[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; j++) {
    const uint8_t *b = B + j * bytes;
    const float d = qg_h(b);
    float m;
    uint32_t qh = 0;
    switch (dt) {
    case BK_Q8_0:
      q[j] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), _mm256_set1_epi8((char)0x80));
      m = 128 * d;
      break;
    case BK_Q4_0: q[j] = qg_nib32(b + 2, 0), m = 8 * d; break;
    case BK_Q4_1: q[j] = qg_nib32(b + 4, 0), m = -qg_h(b + 2); break;
    case BK_Q5_0:
      memcpy(&qh, b + 2, 4);
      q[j] = qg_nib32(b + 6, qh), m = 16 * d;
      break;
    default: // Q5_1
      memcpy(&qh, b + 4, 4);
      q[j] = qg_nib32(b + 8, qh), m = -qg_h(b + 2);
      break;
    }
    sc[2 * j] = sc[2 * j + 1] = d;
    mn[2 * j] = mn[2 * j + 1] = m;
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; c++)
    nat[c] = _mm512_inserti64x4(_mm512_castsi256_si512(q[2 * c]), q[2 * c + 1], 1);
  qg_lanes(rec, nat);
}

// A Q2_K or Q3_K super-block: 2-bit quants (bits 2k..2k+1 of 32 bytes
// give elements 32k..32k+31 of each 128), and for Q3_K a third bit from
// hmask; 16 scales of 16 elements.
QG_INLINE void qg_unpack23(uint8_t *rec, const uint8_t *B, int dt) {
  __m512i nat[4];
  float *sc = (float *)(rec + 256), *mn = sc + 16;
  const int three = dt == BK_Q3_K;
  const uint8_t *qs = B + (three ? 32 : 16);
  const __m512i m3 = _mm512_set1_epi8(3), one = _mm512_set1_epi8(1);
  // Per 16-bit lane: the low half's bytes shift by 2k, the high half's
  // by 2k+2 (k = 2(m%2)), and the hmask bits by h4+k and h4+k+1.
  const __m512i step = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(1), 1);
  __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)B));
#pragma GCC unroll 4
  for (int m = 0; m < 4; m++) {
    const int h = m / 2, k = 2 * (m % 2);
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
    __m512i q = _mm512_and_si512(
        _mm512_srlv_epi16(v, _mm512_add_epi16(_mm512_set1_epi16((short)(2 * k)), _mm512_slli_epi16(step, 1))), m3);
    if (three) {
      __m512i hb = _mm512_and_si512(
          _mm512_srlv_epi16(hm, _mm512_add_epi16(_mm512_set1_epi16((short)(4 * h + k)), step)), one);
      q = _mm512_or_si512(q, _mm512_slli_epi16(hb, 2)); // q3 + 4·bit: 0..7, 4 too many
    }
    nat[m] = q;
  }
  if (three) {
    const float d = qg_h(B + 108);
    const uint8_t *s = B + 96;
    for (int g = 0; g < 16; g++) {
      sc[g] = d * (float)k3_scale(s, g);
      mn[g] = 4 * sc[g];
    }
  } else {
    const float d = qg_h(B + 80), dmin = qg_h(B + 82);
    for (int g = 0; g < 16; g++) {
      sc[g] = d * (float)(B[g] & 15);
      mn[g] = dmin * (float)(B[g] >> 4);
    }
  }
  qg_lanes(rec, nat);
}

// One super-block of a weight row to a record.
QG_INLINE void qg_unpack(uint8_t *rec, const uint8_t *B, int dt) {
  if (dt == BK_Q2_K || dt == BK_Q3_K) {
    qg_unpack23(rec, B, dt);
    return;
  }
  if (dt != BK_Q4_K && dt != BK_Q5_K && dt != BK_Q6_K) {
    qg_unpack32(rec, B, dt);
    return;
  }
  __m512i nat[4];
  float *sc = (float *)(rec + 256), *mn = sc + 16;
  if (dt == BK_Q6_K) {
#pragma GCC unroll 4
    for (int m = 0; m < 4; m++) nat[m] = k6_chunk(B, m / 2, m % 2);
    const float d = qg_h(B + 208);
    __m512 s = _mm512_mul_ps(
        _mm512_set1_ps(d),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(B + 192)))));
    _mm512_storeu_ps(sc, s);
    _mm512_storeu_ps(mn, _mm512_mul_ps(s, _mm512_set1_ps(32)));
  } else {
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) nat[g] = k45_group(B, dt == BK_Q5_K, g);
    uint32_t u[4];
    k4_scales(B, u); // bytes 0..7: the 8 scales, 8..15: the 8 mins
    uint8_t b[16];
    memcpy(b, u, 16);
    // Lane L takes sub-block L/2.
    const __m512i pair = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512i s8 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)b));
    __m512i scl = _mm512_permutexvar_epi32(pair, s8);
    __m512i mnl = _mm512_permutexvar_epi32(_mm512_add_epi32(pair, _mm512_set1_epi32(8)), s8);
    _mm512_storeu_ps(sc, _mm512_mul_ps(_mm512_set1_ps(qg_h(B)), _mm512_cvtepi32_ps(scl)));
    _mm512_storeu_ps(mn, _mm512_mul_ps(_mm512_set1_ps(qg_h(B + 2)), _mm512_cvtepi32_ps(mnl)));
  }
  qg_lanes(rec, nat);
}

// Sums of four vectors to one float each (lanes 0..3).
QG_INLINE __m128 qg_sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit lanes: a, b, c, d (four partial sums each).
  __m512 v = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
  v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0x4E));
  v = _mm512_add_ps(v, _mm512_shuffle_ps(v, v, 0xB1));
  return _mm512_castps512_ps128(
      _mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), v));
}

// R weight rows by C x rows over blocks [0, nblk) of the records at wr
// and xr (wstride and xstride bytes from one row's records to the
// next's), written to out[c*rows + r].
QG_INLINE void qg_tile(const int R, const int C, const uint8_t *wr, int64_t wstride,
                       const uint8_t *xr, int64_t xstride, int64_t nblk, float *out, int64_t rows) {
  __m512 a[3][4];
#pragma GCC unroll 3
  for (int r = 0; r < R; r++)
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) a[r][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblk; b++) {
    const uint8_t *wb = wr + b * QG_REC, *xb = xr + b * QG_REC;
    __m512i s[3][4];
#pragma GCC unroll 3
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
      for (int c = 0; c < C; c++) s[r][c] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
      __m512i w[3];
#pragma GCC unroll 3
      for (int r = 0; r < R; r++) w[r] = _mm512_loadu_si512((const void *)(wb + r * wstride + 64 * i));
#pragma GCC unroll 4
      for (int c = 0; c < C; c++) {
        __m512i x = _mm512_loadu_si512((const void *)(xb + c * xstride + 64 * i));
#pragma GCC unroll 3
        for (int r = 0; r < R; r++) s[r][c] = _mm512_dpbusd_epi32(s[r][c], w[r], x);
      }
    }
#pragma GCC unroll 3
    for (int r = 0; r < R; r++) {
      const float *wf = (const float *)(wb + r * wstride + 256);
      __m512 sc = _mm512_loadu_ps(wf), mn = _mm512_loadu_ps(wf + 16);
#pragma GCC unroll 4
      for (int c = 0; c < C; c++) {
        const float *xf = (const float *)(xb + c * xstride + 256);
        __m512 t = _mm512_mul_ps(sc, _mm512_loadu_ps(xf + 16));
        a[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r][c]), t, a[r][c]);
        a[r][c] = _mm512_fnmadd_ps(mn, _mm512_loadu_ps(xf), a[r][c]);
      }
    }
  }
  const __m512 z = _mm512_setzero_ps();
#pragma GCC unroll 3
  for (int r = 0; r < R; r++) {
    float v[4];
    _mm_storeu_ps(v, qg_sum4(a[r][0], C > 1 ? a[r][1] : z, C > 2 ? a[r][2] : z, C > 3 ? a[r][3] : z));
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) out[c * rows + r] = v[c];
  }
}

#define QG_C(R, C)                                                                               \
  case C:                                                                                        \
    qg_tile(R, C, wr, wstride, xr, xstride, nblk, out, rows);                                     \
    break;
#define QG_R(R)                                                                                  \
  case R:                                                                                        \
    switch (nc) { QG_C(R, 1) QG_C(R, 2) QG_C(R, 3) QG_C(R, 4) }                                   \
    break;

QG static void qg_tile_any(int nr, int nc, const uint8_t *wr, int64_t wstride, const uint8_t *xr,
                           int64_t xstride, int64_t nblk, float *out, int64_t rows) {
  switch (nr) { QG_R(1) QG_R(2) QG_R(3) }
}

QG static void qg_unpack_rows(uint8_t *dst, const uint8_t *w, int64_t rb, int dt, int64_t nr,
                              int64_t nsb) {
  const int64_t bytes = qg_bytes(dt);
  for (int64_t r = 0; r < nr; r++)
    for (int64_t b = 0; b < nsb; b++) qg_unpack(dst + (r * nsb + b) * QG_REC, w + r * rb + b * bytes, dt);
}

// x rows to records: bk_quant_x's scales (one per xblock elements, 32 or
// 256) and rounding, so both integer paths agree, then the lane layout,
// and the lane sums by vpdpbusd with ones.
QG void bk_qgemm_pack_x(uint8_t *xr, const float *x, int64_t cols, int64_t xblock, int64_t i0,
                        int64_t i1) {
  const int64_t nsb = cols / 256;
  const __m512i lim = _mm512_set1_epi32(127), nlim = _mm512_set1_epi32(-127);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t i = i0; i < i1; i++) {
    for (int64_t b = 0; b < nsb; b++) {
      const float *xb = x + i * cols + 256 * b;
      uint8_t *rec = xr + (i * nsb + b) * QG_REC;
      // dd[l]: the scale of the 16 elements 16l..16l+15 (lane l).
      // A NaN or infinity makes its scale NaN (see bk_quant_x).
      float dd[16], id[16];
      float amax[16];
      int bad[16];
      for (int l = 0; l < 16; l++) {
        __m512 a = _mm512_abs_ps(_mm512_loadu_ps(xb + 16 * l));
        bad[l] = _mm512_cmp_ps_mask(a, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ) != 0;
        amax[l] = _mm512_reduce_max_ps(a);
      }
      const int per = xblock == 256 ? 16 : 2; // lanes per scale
      for (int l0 = 0; l0 < 16; l0 += per) {
        float m = 0;
        int b = 0;
        for (int l = l0; l < l0 + per; l++) m = amax[l] > m ? amax[l] : m, b |= bad[l];
        const float d = m / 127;
        for (int l = l0; l < l0 + per; l++) dd[l] = b ? NAN : d, id[l] = !b && d != 0 ? 1 / d : 0;
      }
      __m512i nat[4];
      for (int c = 0; c < 4; c++) {
        __m128i part[4];
        for (int j = 0; j < 4; j++) {
          __m512 v = _mm512_mul_ps(_mm512_loadu_ps(xb + 64 * c + 16 * j), _mm512_set1_ps(id[4 * c + j]));
          __m512i q = _mm512_cvtps_epi32(v);
          part[j] = _mm512_cvtepi32_epi8(_mm512_max_epi32(_mm512_min_epi32(q, lim), nlim));
        }
        __m512i v = _mm512_castsi128_si512(part[0]);
        v = _mm512_inserti32x4(v, part[1], 1);
        v = _mm512_inserti32x4(v, part[2], 2);
        nat[c] = _mm512_inserti32x4(v, part[3], 3);
      }
      qg_lanes(rec, nat);
      __m512i sum = _mm512_setzero_si512();
      for (int c = 0; c < 4; c++)
        sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512((const void *)(rec + 64 * c)));
      float *f = (float *)(rec + 256);
      __m512 vd = _mm512_loadu_ps(dd);
      _mm512_storeu_ps(f, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), vd));
      _mm512_storeu_ps(f + 16, vd);
    }
  }
}
#endif

int64_t bk_qgemm_x_bytes(int64_t n, int64_t cols) { return n * (cols / 256) * QG_REC; }

int bk_qgemm_takes(int dtype, int64_t cols) {
  switch (dtype) {
  case BK_Q4_K: case BK_Q5_K: case BK_Q6_K: case BK_Q3_K: case BK_Q2_K: case BK_Q8_0:
  case BK_Q4_0: case BK_Q4_1: case BK_Q5_0: case BK_Q5_1:
    return cols > 0 && cols % 256 == 0;
  }
  return 0;
}

// Weight rows are unpacked once per product, a group of them at a time
// (QG_WB bytes of records, in L2); every x row then meets the group 4 rows
// and 3 weight rows at a time over all columns, so the tile's sums stay in
// registers to the end. An x row's records (1.5 bytes an element) come
// from L3 once per group and stay in L1 while the group's rows pass.
#define QG_WB (320 * 1024)

int bk_qgemm(float *out, const uint8_t *xr, int64_t n, const uint8_t *w, int dtype, int64_t rows,
             int64_t cols, int64_t r0, int64_t r1) {
#if defined(__x86_64__) && !defined(BK_NO_SIMD)
  if (!bk_qgemm_takes(dtype, cols)) return 0;
  const int64_t nsb = cols / 256, rb = bk_row_bytes(dtype, cols), stride = nsb * QG_REC;
  int64_t rw = QG_WB / stride / 3 * 3;
  if (rw < 3) rw = 3;
  uint8_t *wbuf = (uint8_t *)bk_scratch((size_t)(rw * stride / 4));
  for (int64_t r = r0; r < r1; r += rw) {
    int nr = r1 - r < rw ? (int)(r1 - r) : (int)rw;
    qg_unpack_rows(wbuf, w + r * rb, rb, dtype, nr, nsb);
    for (int64_t c = 0; c < n; c += 4) {
      int nc = n - c < 4 ? (int)(n - c) : 4;
      for (int j = 0; j < nr; j += 3)
        qg_tile_any(nr - j < 3 ? nr - j : 3, nc, wbuf + j * stride, stride, xr + c * stride, stride,
                    nsb, out + c * rows + r + j, rows);
    }
  }
  return 1;
#else
  (void)out, (void)xr, (void)n, (void)w, (void)dtype, (void)rows, (void)cols, (void)r0, (void)r1;
  return 0;
#endif
}

#if !(defined(__x86_64__) && !defined(BK_NO_SIMD))
void bk_qgemm_pack_x(uint8_t *xr, const float *x, int64_t cols, int64_t xblock, int64_t i0,
                     int64_t i1) {
  (void)xr, (void)x, (void)cols, (void)xblock, (void)i0, (void)i1;
}
#endif
