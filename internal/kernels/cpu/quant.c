// The ggml block formats (Q4_0 .. Q6_K) for the cpu backend: dequantisation
// and integer dot products against activations quantised to 8 bits in
// blocks of 32. Layouts are described in kernels/quant.go.
//
// Every format is handled through one view of a 32-element sub-block, its
// "integer form": element e is dw * sc[e/16] * q[e] (+ mw[e/16] for the
// formats with a minimum), q a signed 8-bit integer and sc two small
// integer scales (1 and 1 where a format has none). Only Q2_K has a
// minimum per 16 elements; the others repeat theirs in both halves. A dot product with quantised
// activations x = xd * xq is then, per sub-block, an exact integer sum
// Σ sc·q·xq scaled by dw·xd, plus mw·xd·Σxq. Activations share one scale
// per block of the weight format (32 elements, or 256 for the K formats,
// whose dw is one per 256 too): the SIMD kernels then add a whole K
// super-block's integer sums before the one conversion to float.
#define _GNU_SOURCE
#include "cpu.h"
#include "kscales.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#define QX86 1
#define QAVX2 __attribute__((target("avx2,fma,f16c")))
#define QAVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))
#endif

extern float g_f16[65536];
extern int g_have_simd, g_have_avx512;

static inline float hf(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return g_f16[v];
}

typedef struct {
  int block, bytes, has_min;
} layout;

static layout lay(int dt) {
  switch (dt) {
  case BK_Q8_0: return (layout){32, 34, 0};
  case BK_Q4_0: return (layout){32, 18, 0};
  case BK_Q4_1: return (layout){32, 20, 1};
  case BK_Q5_0: return (layout){32, 22, 0};
  case BK_Q5_1: return (layout){32, 24, 1};
  case BK_Q4_K: return (layout){256, 144, 1};
  case BK_Q5_K: return (layout){256, 176, 1};
  case BK_Q6_K: return (layout){256, 210, 0};
  case BK_Q3_K: return (layout){256, 110, 0};
  case BK_Q2_K: return (layout){256, 84, 1};
  }
  return (layout){1, 0, 0};
}

int64_t bk_quant_row_bytes(int dt, int64_t cols) {
  layout l = lay(dt);
  return cols / l.block * l.bytes;
}

// Scale and min j (0..7) of a Q4_K/Q5_K super-block's 12 packed bytes.
static inline void scale_min_k(const uint8_t *s, int j, int *sc, int *m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

typedef struct {
  int8_t q[32];
  int sc[2];
  float dw, mw[2];
} qsub;

// Sub-block s (of cols/32) of a row, in integer form.
static void decode_sub(int dt, const uint8_t *row, int64_t s, qsub *o) {
  layout l = lay(dt);
  o->sc[0] = o->sc[1] = 1;
  o->mw[0] = o->mw[1] = 0;
  if (l.block == 32) {
    const uint8_t *b = row + s * l.bytes;
    const uint8_t *qs;
    uint32_t qh = 0;
    int off = 0;
    o->dw = hf(b);
    if (dt == BK_Q8_0) {
      memcpy(o->q, b + 2, 32);
      return;
    }
    switch (dt) {
    case BK_Q4_0: qs = b + 2; off = 8; break;
    case BK_Q4_1: o->mw[0] = hf(b + 2); qs = b + 4; break;
    case BK_Q5_0: memcpy(&qh, b + 2, 4); qs = b + 6; off = 16; break;
    default: o->mw[0] = hf(b + 2); memcpy(&qh, b + 4, 4); qs = b + 8; break;
    }
    o->mw[1] = o->mw[0];
    for (int j = 0; j < 16; j++) {
      o->q[j] = (int8_t)((int)((qs[j] & 15) | ((qh >> j) & 1) << 4) - off);
      o->q[j + 16] = (int8_t)((int)((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - off);
    }
    return;
  }
  const uint8_t *B = row + (s / 8) * l.bytes;
  int j = (int)(s % 8);
  if (dt == BK_Q3_K) {
    int h = j / 4, k = j % 4;
    const uint8_t *hm = B, *qs = B + 32 + 32 * h, *sc = B + 96;
    o->dw = hf(B + 108);
    for (int t = 0; t < 2; t++) {
      o->sc[t] = k3_scale(sc, 8 * h + 2 * k + t);
    }
    for (int e = 0; e < 32; e++)
      o->q[e] = (int8_t)(((qs[e] >> (2 * k)) & 3) - (((hm[e] >> (4 * h + k)) & 1) ? 0 : 4));
    return;
  }
  if (dt == BK_Q2_K) {
    int h = j / 4, k = j % 4;
    const uint8_t *sc = B, *qs = B + 16 + 32 * h;
    o->dw = hf(B + 80);
    float dmin = hf(B + 82);
    for (int t = 0; t < 2; t++) {
      int g = 8 * h + 2 * k + t;
      o->sc[t] = sc[g] & 15;
      o->mw[t] = -(dmin * (float)(sc[g] >> 4));
    }
    for (int e = 0; e < 32; e++) o->q[e] = (int8_t)((qs[e] >> (2 * k)) & 3);
    return;
  }
  if (dt == BK_Q6_K) {
    int h = j / 4, k = j % 4;
    const uint8_t *ql = B + 64 * h + 32 * (k % 2), *qh = B + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(B + 192 + 8 * h);
    o->dw = hf(B + 208);
    o->sc[0] = sc[2 * k];
    o->sc[1] = sc[2 * k + 1];
    for (int e = 0; e < 32; e++) {
      int nib = k < 2 ? ql[e] & 15 : ql[e] >> 4;
      o->q[e] = (int8_t)((nib | ((qh[e] >> (2 * k)) & 3) << 4) - 32);
    }
    return;
  }
  int sc, m;
  scale_min_k(B + 4, j, &sc, &m);
  o->dw = hf(B);
  o->mw[0] = o->mw[1] = -(hf(B + 2) * (float)m);
  o->sc[0] = o->sc[1] = sc;
  const uint8_t *qs = B + (dt == BK_Q4_K ? 16 : 48) + 32 * (j / 2);
  for (int e = 0; e < 32; e++) {
    int v = j % 2 == 0 ? qs[e] & 15 : qs[e] >> 4;
    if (dt == BK_Q5_K) v |= ((B[16 + e] >> j) & 1) << 4;
    o->q[e] = (int8_t)v;
  }
}

void bk_quant_dequant_row(float *dst, const uint8_t *row, int dt, int64_t cols) {
  int has_min = lay(dt).has_min;
  qsub o;
  for (int64_t s = 0; s < cols / 32; s++) {
    decode_sub(dt, row, s, &o);
    float *y = dst + 32 * s;
    for (int e = 0; e < 32; e++) {
      // The reference's order of operations, so results are identical:
      // (d·sc)·q, then the minimum added (never a +0 that would turn -0
      // into +0).
      float v = (o.dw * (float)o.sc[e / 16]) * (float)o.q[e];
      y[e] = has_min ? v + o.mw[e / 16] : v;
    }
  }
}

int bk_quant_x_block(int dt) { return lay(dt).block == 256 ? 256 : 32; }

// One group of `block` elements (a multiple of 32): its scale, quants and
// sums of 32.
static void quant_group(int8_t *qs, float *d, int32_t *s, const float *xg, int64_t block) {
  float amax = 0;
  int bad = 0;
  for (int64_t j = 0; j < block; j++) {
    float a = fabsf(xg[j]);
    bad |= !(a <= FLT_MAX);
    amax = fmaxf(amax, a);
  }
  // A NaN or infinity in x makes the block's scale NaN, so every
  // product with it is NaN as in float (fmaxf alone would drop a NaN,
  // and a read of poisoned KV would come out as finite logits).
  float dd = bad ? NAN : amax / 127, id = !bad && dd != 0 ? 1 / dd : 0;
  *d = dd;
  for (int64_t b = 0; b < block / 32; b++) {
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) {
      float t = xg[32 * b + j] * id;
      int v = t == t ? (int)lrintf(t) : 0;
      v = v > 127 ? 127 : v < -127 ? -127 : v;
      qs[32 * b + j] = (int8_t)v;
      sum += v;
    }
    s[b] = sum;
  }
}

#ifdef QX86
// quant_group with 8 lanes, bit for bit the same: the same maximum, the
// same scale and product, and cvtps rounds to nearest even as lrintf does
// in the default rounding mode. A group with a NaN or an infinity (or an
// infinite 1/scale) goes to quant_group. A decode step quantises one x
// row per product, on one thread while the other waits: the scalar loop
// (lrintf a call per element) took 3.4 ms of a 30 ms 1.1B Q4_K_M step.
// Three interleaved rounds in process: 21.7-23.1 -> 20.2-21.6 ms a step.
QAVX2 static void quant_group_avx2(int8_t *qs, float *d, int32_t *s, const float *xg,
                                   int64_t block) {
  const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 big = _mm256_set1_ps(FLT_MAX);
  __m256 am = _mm256_setzero_ps();
  int bad = 0;
  for (int64_t j = 0; j < block; j += 8) {
    __m256 a = _mm256_and_ps(_mm256_loadu_ps(xg + j), absm);
    bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, big, _CMP_NLE_UQ)); // NaN or above FLT_MAX
    am = _mm256_max_ps(am, a);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  float amax = _mm_cvtss_f32(m4);
  float dd = amax / 127, id = dd != 0 ? 1 / dd : 0;
  // An infinite id (a block of tiny subnormals) makes products infinite or
  // NaN, which cvtps and lrintf convert differently.
  if (bad || !(id <= FLT_MAX)) {
    quant_group(qs, d, s, xg, block);
    return;
  }
  *d = dd;
  const __m256 idv = _mm256_set1_ps(id);
  const __m256i hi = _mm256_set1_epi32(127), lo = _mm256_set1_epi32(-127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < block / 32; b++) {
    __m256i v[4];
    for (int k = 0; k < 4; k++) {
      __m256i t = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 32 * b + 8 * k), idv));
      v[k] = _mm256_max_epi32(_mm256_min_epi32(t, hi), lo);
    }
    __m256i sum = _mm256_add_epi32(_mm256_add_epi32(v[0], v[1]), _mm256_add_epi32(v[2], v[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    s[b] = _mm_cvtsi128_si32(s4);
    // Narrowing packs within 128-bit lanes; the permute puts the 32 bytes
    // back in element order.
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256((__m256i *)(qs + 32 * b), _mm256_permutevar8x32_epi32(p, order));
  }
}
#endif

void bk_quant_x(int simd, int8_t *qs, float *d, int32_t *s, const float *x, int64_t n,
                int64_t cols, int64_t block) {
  int64_t nb = cols / 32, nd = cols / block;
  for (int64_t i = 0; i < n; i++)
    for (int64_t g = 0; g < nd; g++) {
      int8_t *qg = qs + i * cols + block * g;
      float *dg = d + i * nd + g;
      int32_t *sg = s + i * nb + g * block / 32;
      const float *xg = x + i * cols + block * g;
#ifdef QX86
      if (simd >= 1 && g_have_simd) {
        quant_group_avx2(qg, dg, sg, xg, block);
        continue;
      }
#else
      (void)simd;
#endif
      quant_group(qg, dg, sg, xg, block);
    }
}

static void qdot_scalar(float *out, const int8_t *qs, const float *d, const int32_t *s, int64_t n,
                        const uint8_t *w, int dt, int64_t rows, int64_t cols, int64_t r0,
                        int64_t r1) {
  int64_t rb = bk_quant_row_bytes(dt, cols), nb = cols / 32;
  int64_t per = bk_quant_x_block(dt) / 32, nd = nb / per; // sub-blocks per x scale
  float acc[n > 0 ? n : 1];
  qsub o;
  for (int64_t r = r0; r < r1; r++) {
    for (int64_t i = 0; i < n; i++) acc[i] = 0;
    for (int64_t b = 0; b < nb; b++) {
      decode_sub(dt, w + r * rb, b, &o);
      for (int64_t i = 0; i < n; i++) {
        const int8_t *xq = qs + i * cols + 32 * b;
        int32_t s0 = 0, s1 = 0;
        for (int e = 0; e < 16; e++) s0 += o.q[e] * xq[e];
        for (int e = 16; e < 32; e++) s1 += o.q[e] * xq[e];
        float xd = d[i * nd + b / per];
        float m;
        if (o.mw[0] == o.mw[1]) {
          m = o.mw[0] * xd * (float)s[i * nb + b];
        } else {
          int32_t h0 = 0, h1 = 0;
          for (int e = 0; e < 16; e++) h0 += xq[e], h1 += xq[e + 16];
          m = o.mw[0] * xd * (float)h0 + o.mw[1] * xd * (float)h1;
        }
        acc[i] += o.dw * xd * (float)(s0 * o.sc[0] + s1 * o.sc[1]) + m;
      }
    }
    for (int64_t i = 0; i < n; i++) out[i * rows + r] = acc[i];
  }
}

#ifdef QX86
// A sub-block in integer form as vectors: 32 int8 quants and the 16 int16
// scales of the pairs maddubs forms (pairs 0..7 cover elements 0..15).
typedef struct {
  __m256i q, sc;
  float dw, mw[2];
} vsub;

QAVX2_INLINE __m256i nibbles(const uint8_t *p) {
  __m128i v = _mm_loadu_si128((const __m128i *)p);
  __m128i m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// 32 bits to 32 bytes: byte j is 0x10 where bit j is set.
QAVX2_INLINE __m256i high_bits(uint32_t qh) {
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                        2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

QAVX2_INLINE void vdecode(int dt, const uint8_t *row, int64_t s, vsub *o) {
  const __m256i m4 = _mm256_set1_epi8(15);
  switch (dt) {
  case BK_Q8_0: {
    const uint8_t *b = row + s * 34;
    o->dw = hf(b);
    o->mw[0] = o->mw[1] = 0;
    o->q = _mm256_loadu_si256((const __m256i *)(b + 2));
    o->sc = _mm256_set1_epi16(1);
    return;
  }
  case BK_Q4_0: {
    const uint8_t *b = row + s * 18;
    o->dw = hf(b);
    o->mw[0] = o->mw[1] = 0;
    o->q = _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
    o->sc = _mm256_set1_epi16(1);
    return;
  }
  case BK_Q4_1: {
    const uint8_t *b = row + s * 20;
    o->dw = hf(b);
    o->mw[0] = o->mw[1] = hf(b + 2);
    o->q = nibbles(b + 4);
    o->sc = _mm256_set1_epi16(1);
    return;
  }
  case BK_Q5_0:
  case BK_Q5_1: {
    int one = dt == BK_Q5_1;
    const uint8_t *b = row + s * (one ? 24 : 22);
    uint32_t qh;
    memcpy(&qh, b + 2 + 2 * one, 4);
    o->dw = hf(b);
    o->mw[0] = o->mw[1] = one ? hf(b + 2) : 0;
    __m256i q = _mm256_or_si256(nibbles(b + 6 + 2 * one), high_bits(qh));
    o->q = one ? q : _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    o->sc = _mm256_set1_epi16(1);
    return;
  }
  case BK_Q4_K:
  case BK_Q5_K: {
    int five = dt == BK_Q5_K;
    const uint8_t *B = row + (s / 8) * (five ? 176 : 144);
    int j = (int)(s % 8), sc, m;
    scale_min_k(B + 4, j, &sc, &m);
    o->dw = hf(B);
    o->mw[0] = o->mw[1] = -(hf(B + 2) * (float)m);
    o->sc = _mm256_set1_epi16((short)sc);
    __m256i v = _mm256_loadu_si256((const __m256i *)(B + (five ? 48 : 16) + 32 * (j / 2)));
    __m256i q = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(v, 4) : v, m4);
    if (five) {
      __m256i h = _mm256_loadu_si256((const __m256i *)(B + 16));
      h = _mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(j)), _mm256_set1_epi8(1));
      q = _mm256_or_si256(q, _mm256_slli_epi16(h, 4));
    }
    o->q = q;
    return;
  }
  case BK_Q3_K:
  case BK_Q2_K: {
    // The rarest formats here: decoded by the scalar code, multiplied with
    // the vector code.
    qsub q;
    decode_sub(dt, row, s, &q);
    o->q = _mm256_loadu_si256((const __m256i *)q.q);
    o->sc = _mm256_set_m128i(_mm_set1_epi16((short)q.sc[1]), _mm_set1_epi16((short)q.sc[0]));
    o->dw = q.dw;
    o->mw[0] = q.mw[0];
    o->mw[1] = q.mw[1];
    return;
  }
  case BK_Q6_K: {
    const uint8_t *B = row + (s / 8) * 210;
    int j = (int)(s % 8), h = j / 4, k = j % 4;
    const int8_t *sc = (const int8_t *)(B + 192 + 8 * h);
    __m256i v = _mm256_loadu_si256((const __m256i *)(B + 64 * h + 32 * (k % 2)));
    __m256i nib = _mm256_and_si256(k < 2 ? v : _mm256_srli_epi16(v, 4), m4);
    __m256i hv = _mm256_loadu_si256((const __m256i *)(B + 128 + 32 * h));
    hv = _mm256_and_si256(_mm256_srl_epi16(hv, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    o->q = _mm256_sub_epi8(_mm256_or_si256(nib, _mm256_slli_epi16(hv, 4)), _mm256_set1_epi8(32));
    o->dw = hf(B + 208);
    o->mw[0] = o->mw[1] = 0;
    o->sc = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
    return;
  }
  }
}

QAVX2_INLINE float hsum_ps(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Weights are prefetched this many bytes ahead.
#define QPF 4096

// Up to QN x rows per pass over a weight row, so every sub-block is
// decoded once for all of them.
#define QN 4

// One group of N (a constant per instance, so sums stay in registers) x
// rows starting at row i0.
QAVX2_INLINE void qdot_blk_n(int dt, const int nn, int64_t i0, float *out, const int8_t *qs,
                             const float *d, const int32_t *s, const uint8_t *w, int64_t rows,
                             int64_t cols, int64_t r0, int64_t r1) {
  int64_t rb = bk_quant_row_bytes(dt, cols), nb = cols / 32;
  int64_t per = bk_quant_x_block(dt) / 32, nd = nb / per; // sub-blocks per x scale
  {
    for (int64_t r = r0; r < r1; r++) {
      const uint8_t *row = w + r * rb;
      __m256 acc[QN];
      float accm[QN];
      for (int i = 0; i < QN; i++) {
        acc[i] = _mm256_setzero_ps();
        accm[i] = 0;
      }
      for (int64_t b = 0; b < nb; b++) {
        vsub o;
        vdecode(dt, row, b, &o);
        __m256i aq = _mm256_sign_epi8(o.q, o.q);
#pragma GCC unroll 4
        for (int i = 0; i < nn; i++) {
          int64_t xi = (i0 + i) * nb + b;
          float xd = d[(i0 + i) * nd + b / per];
          __m256i xq = _mm256_loadu_si256((const __m256i *)(qs + (i0 + i) * cols + 32 * b));
          __m256i p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(xq, o.q));
          __m256 f = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, o.sc));
          acc[i] = _mm256_fmadd_ps(f, _mm256_set1_ps(o.dw * xd), acc[i]);
          if (dt == BK_Q2_K) {
            // A minimum per 16 elements: the sums of x's quants by half
            // (lanes 0..3 cover elements 0..15, lanes 4..7 the rest).
            __m256i hs = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), xq),
                                           _mm256_set1_epi16(1));
            __m256 mv = _mm256_set_m128(_mm_set1_ps(o.mw[1] * xd), _mm_set1_ps(o.mw[0] * xd));
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(hs), mv, acc[i]);
          } else if (lay(dt).has_min) {
            accm[i] += o.mw[0] * xd * (float)s[xi];
          }
        }
      }
      for (int i = 0; i < nn; i++) out[(i0 + i) * rows + r] = hsum_ps(acc[i]) + accm[i];
    }
  }
}

QAVX2_INLINE void qdot_avx2_dt(int dt, float *out, const int8_t *qs, const float *d,
                               const int32_t *s, int64_t n, const uint8_t *w, int64_t rows,
                               int64_t cols, int64_t r0, int64_t r1) {
  for (int64_t i0 = 0; i0 < n; i0 += QN) {
    switch (n - i0 < QN ? (int)(n - i0) : QN) {
    case 1: qdot_blk_n(dt, 1, i0, out, qs, d, s, w, rows, cols, r0, r1); break;
    case 2: qdot_blk_n(dt, 2, i0, out, qs, d, s, w, rows, cols, r0, r1); break;
    case 3: qdot_blk_n(dt, 3, i0, out, qs, d, s, w, rows, cols, r0, r1); break;
    default: qdot_blk_n(dt, QN, i0, out, qs, d, s, w, rows, cols, r0, r1); break;
    }
  }
}

// Dequantisation with the reference's operations in the same order (a
// product (dw·sc)·q, then + mw for formats with a minimum; intrinsics are
// never contracted into FMAs), so results are identical to the scalar path.
QAVX2_INLINE void vdequant_dt(int dt, float *dst, const uint8_t *row, int64_t cols) {
  int has_min = lay(dt).has_min;
  for (int64_t b = 0; b < cols / 32; b++) {
    vsub o;
    vdecode(dt, row, b, &o);
    int16_t sc[16];
    _mm256_storeu_si256((__m256i *)sc, o.sc);
    for (int k = 0; k < 4; k++) {
      __m256 mw = _mm256_set1_ps(o.mw[k / 2]);
      __m128i q8 = k < 2 ? _mm256_castsi256_si128(o.q) : _mm256_extracti128_si256(o.q, 1);
      if (k % 2) q8 = _mm_srli_si128(q8, 8);
      __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8));
      // scale of elements 8k..8k+7: sc[e/16] sits in pair lane (8k)/2
      __m256 v = _mm256_mul_ps(_mm256_set1_ps(o.dw * (float)sc[4 * k]), q);
      if (has_min) v = _mm256_add_ps(v, mw);
      _mm256_storeu_ps(dst + 32 * b + 8 * k, v);
    }
  }
}

#define DEQ_FOR(DT, NAME)                                                                       \
  QAVX2 static void NAME(float *dst, const uint8_t *row, int64_t cols) {                       \
    vdequant_dt(DT, dst, row, cols);                                                            \
  }
DEQ_FOR(BK_Q4_0, deq_q4_0)
DEQ_FOR(BK_Q4_1, deq_q4_1)
DEQ_FOR(BK_Q5_0, deq_q5_0)
DEQ_FOR(BK_Q5_1, deq_q5_1)
DEQ_FOR(BK_Q4_K, deq_q4_k)
DEQ_FOR(BK_Q5_K, deq_q5_k)
DEQ_FOR(BK_Q6_K, deq_q6_k)
DEQ_FOR(BK_Q3_K, deq_q3_k)
DEQ_FOR(BK_Q2_K, deq_q2_k)

void bk_quant_dequant_row_avx2(float *dst, const uint8_t *row, int dt, int64_t cols) {
  switch (dt) {
  case BK_Q4_0: deq_q4_0(dst, row, cols); return;
  case BK_Q4_1: deq_q4_1(dst, row, cols); return;
  case BK_Q5_0: deq_q5_0(dst, row, cols); return;
  case BK_Q5_1: deq_q5_1(dst, row, cols); return;
  case BK_Q4_K: deq_q4_k(dst, row, cols); return;
  case BK_Q5_K: deq_q5_k(dst, row, cols); return;
  case BK_Q6_K: deq_q6_k(dst, row, cols); return;
  case BK_Q3_K: deq_q3_k(dst, row, cols); return;
  case BK_Q2_K: deq_q2_k(dst, row, cols); return;
  }
  bk_quant_dequant_row(dst, row, dt, cols);
}

// The K formats a super-block at a time, for a fixed number N of x rows
// (1..QN, a compile-time constant in each instance, so every accumulator
// stays in a register): scales and mins are unpacked with vector
// instructions once per 256 elements (ggml's byte shuffles), a 32-byte
// load of nibbles serves two sub-blocks, Q4_K/Q5_K quants (unsigned) go
// straight into maddubs, the mins meet x's per-32 sums in one vector
// multiply, and the integer sums of the 8 sub-blocks (x has one scale per
// super-block) are added before one conversion to float. Sums stay far
// inside int32: at most 8 sub-blocks x 2 pairs x (32·127·2) x 128.

// Shuffle masks that spread int16 lane j of a 128-bit half across the half.
QAVX2_INLINE __m256i scale_shuffle(int j) {
  return _mm256_set1_epi16((short)((2 * j) | ((2 * j + 1) << 8)));
}

// Lane j of the low half and lane j+1 of the high half, spread over their halves.
QAVX2_INLINE __m256i scale_shuffle2(int j) {
  return _mm256_set_m128i(_mm_set1_epi16((short)((2 * j + 2) | ((2 * j + 3) << 8))),
                          _mm_set1_epi16((short)((2 * j) | ((2 * j + 1) << 8))));
}

QAVX2_INLINE void qdot_k45_n(const int five, const int N, float *out, const int8_t *qs,
                             const float *d, const int32_t *s, const uint8_t *w, int64_t rows,
                             int64_t cols, int64_t r0, int64_t r1) {
  const int64_t bytes = five ? 176 : 144, nsb = cols / 256, nb = cols / 32;
  const int64_t rb = nsb * bytes;
  const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = w + r * rb;
    __m256 acc[QN], accm[QN];
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) acc[i] = accm[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
      const uint8_t *B = row + sb * bytes;
      // Prefetch as the float decode rows do (ROW1_PF in cpu.c).
      for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char *)B + QPF + l, _MM_HINT_T0);
      uint32_t u[4];
      k4_scales(B, u);
      __m128i sm = _mm_loadu_si128((const __m128i *)u);
      __m256i mins = _mm256_cvtepu8_epi32(_mm_srli_si128(sm, 8));
      __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
      const float dd = hf(B), dmin = hf(B + 2);
      __m256i isum[QN];
#pragma GCC unroll 4
      for (int i = 0; i < N; i++) {
        const float xd = d[i * nsb + sb];
        __m256i xs = _mm256_loadu_si256((const __m256i *)(s + i * nb + 8 * sb));
        accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(mins, xs)),
                                  _mm256_set1_ps(dmin * xd), accm[i]);
        isum[i] = _mm256_setzero_si256();
      }
      const uint8_t *qsb = B + (five ? 48 : 16);
      __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(B + 16)) : _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int p = 0; p < 4; p++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(qsb + 32 * p));
        __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        if (five) {
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
        }
        __m256i slo = _mm256_shuffle_epi8(scales, scale_shuffle(2 * p));
        __m256i shi = _mm256_shuffle_epi8(scales, scale_shuffle(2 * p + 1));
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
          const int8_t *xq = qs + i * cols + 256 * sb + 64 * p;
          __m256i pa = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)), slo);
          __m256i pc = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32))), shi);
          isum[i] = _mm256_add_epi32(isum[i], _mm256_add_epi32(pa, pc));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < N; i++)
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_set1_ps(dd * d[i * nsb + sb]), acc[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) out[i * rows + r] = hsum_ps(_mm256_sub_ps(acc[i], accm[i]));
  }
}

// Q6_K: 16 int8 scales per super-block, widened 8 at a time; a
// sub-block's two scales (one per 16 elements) are spread over the two
// halves of a vector by one byte shuffle. Quants go into maddubs unsigned
// (0..63) and 32·Σx comes off, as ggml does.
QAVX2_INLINE void qdot_k6_n(const int N, float *out, const int8_t *qs, const float *d,
                            const uint8_t *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  const int64_t nsb = cols / 256, rb = nsb * 210;
  const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = w + r * rb;
    __m256 acc[QN];
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
      const uint8_t *B = row + sb * 210;
      for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)B + QPF + l, _MM_HINT_T0);
      const float dd = hf(B + 208);
      __m256i isum[QN];
#pragma GCC unroll 4
      for (int i = 0; i < N; i++) isum[i] = _mm256_setzero_si256();
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
        __m256i ql0 = _mm256_loadu_si256((const __m256i *)(B + 64 * h));
        __m256i ql1 = _mm256_loadu_si256((const __m256i *)(B + 64 * h + 32));
        __m256i qh = _mm256_loadu_si256((const __m256i *)(B + 128 + 32 * h));
        // the 8 int16 scales of this half, in both 128-bit lanes
        __m256i sch = _mm256_broadcastsi128_si256(
            _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(B + 192 + 8 * h))));
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
          __m256i v = k % 2 ? ql1 : ql0;
          __m256i nib = _mm256_and_si256(k < 2 ? v : _mm256_srli_epi16(v, 4), m4);
          __m256i hb = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m3);
          __m256i q = _mm256_or_si256(nib, _mm256_slli_epi16(hb, 4)); // 0..63, 32 too many
          __m256i scv = _mm256_shuffle_epi8(sch, scale_shuffle2(2 * k));
#pragma GCC unroll 4
          for (int i = 0; i < N; i++) {
            const int8_t *xq = qs + i * cols + 256 * sb + 128 * h + 32 * k;
            __m256i x = _mm256_loadu_si256((const __m256i *)xq);
            __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, x), _mm256_maddubs_epi16(m32, x));
            isum[i] = _mm256_add_epi32(isum[i], _mm256_madd_epi16(p, scv));
          }
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < N; i++)
        acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i]), _mm256_set1_ps(dd * d[i * nsb + sb]), acc[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) out[i * rows + r] = hsum_ps(acc[i]);
  }
}

// qdot_k_dt: x rows in groups of up to QN, each group through the instance
// for its size.
QAVX2_INLINE void qdot_k_dt(int dt, float *out, const int8_t *qs, const float *d,
                            const int32_t *s, int64_t n, const uint8_t *w, int64_t rows,
                            int64_t cols, int64_t r0, int64_t r1) {
  const int64_t nsb = cols / 256, nb = cols / 32;
  for (int64_t i0 = 0; i0 < n; i0 += QN) {
    int nn = n - i0 < QN ? (int)(n - i0) : QN;
    float *o = out + i0 * rows;
    const int8_t *q = qs + i0 * cols;
    const float *dx = d + i0 * nsb;
    const int32_t *sx = s + i0 * nb;
#define QK_CASE(N)                                                                             \
  case N:                                                                                      \
    if (dt == BK_Q6_K) qdot_k6_n(N, o, q, dx, w, rows, cols, r0, r1);                           \
    else qdot_k45_n(dt == BK_Q5_K, N, o, q, dx, sx, w, rows, cols, r0, r1);                     \
    break;
    switch (nn) {
      QK_CASE(1)
      QK_CASE(2)
      QK_CASE(3)
      QK_CASE(4)
    }
#undef QK_CASE
  }
}

// One instance per format, so vdecode's switch is resolved at compile time.
#define QDOT_FOR(DT, NAME)                                                                     \
  QAVX2 static void NAME(float *out, const int8_t *qs, const float *d, const int32_t *s,        \
                         int64_t n, const uint8_t *w, int64_t rows, int64_t cols, int64_t r0,  \
                         int64_t r1) {                                                         \
    qdot_avx2_dt(DT, out, qs, d, s, n, w, rows, cols, r0, r1);                                 \
  }
QDOT_FOR(BK_Q8_0, qdot_q8_0)
QDOT_FOR(BK_Q4_0, qdot_q4_0)
QDOT_FOR(BK_Q4_1, qdot_q4_1)
QDOT_FOR(BK_Q5_0, qdot_q5_0)
QDOT_FOR(BK_Q5_1, qdot_q5_1)
QDOT_FOR(BK_Q3_K, qdot_q3_k)
QDOT_FOR(BK_Q2_K, qdot_q2_k)
#define QDOTK_FOR(DT, NAME)                                                                    \
  QAVX2 static void NAME(float *out, const int8_t *qs, const float *d, const int32_t *s,        \
                         int64_t n, const uint8_t *w, int64_t rows, int64_t cols, int64_t r0,  \
                         int64_t r1) {                                                         \
    qdot_k_dt(DT, out, qs, d, s, n, w, rows, cols, r0, r1);                                    \
  }
QDOTK_FOR(BK_Q4_K, qdot_q4_k)
QDOTK_FOR(BK_Q5_K, qdot_q5_k)
QDOTK_FOR(BK_Q6_K, qdot_q6_k)
#endif

void bk_qdot(int simd, float *out, const int8_t *qs, const float *d, const int32_t *s, int64_t n,
             const uint8_t *w, int dt, int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  if (r1 <= r0 || n <= 0) return;
#ifdef QX86
  if (simd >= 2 && g_have_avx512 &&
      bk_qdot_k_avx512(out, qs, d, s, n, w, dt, rows, cols, r0, r1))
    return;
  if (simd && g_have_simd) {
    switch (dt) {
    case BK_Q8_0: qdot_q8_0(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q4_0: qdot_q4_0(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q4_1: qdot_q4_1(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q5_0: qdot_q5_0(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q5_1: qdot_q5_1(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q4_K: qdot_q4_k(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q5_K: qdot_q5_k(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q6_K: qdot_q6_k(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q3_K: qdot_q3_k(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    case BK_Q2_K: qdot_q2_k(out, qs, d, s, n, w, rows, cols, r0, r1); return;
    }
  }
#else
  (void)simd;
#endif
  qdot_scalar(out, qs, d, s, n, w, dt, rows, cols, r0, r1);
}
