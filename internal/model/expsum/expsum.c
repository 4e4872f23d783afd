// The exponentials of a softmax over a vocabulary, with the constants and
// operation order of the Go expNeg (internal/model): a degree-9 polynomial
// on x - k·ln2 and the exponent added to the bits, 0 for x <= -708 and NaN.
// Contraction into fused multiply-adds is off (cgo refuses the flag, hence
// the pragmas): an FMA rounds once where Go's multiply and add round twice.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
#include "expsum.h"

#include <string.h>

#define LOG2E 1.4426950408889634
#define LN2HI 6.93147180369123816490e-01
#define LN2LO 1.90821492927058770002e-10
#define MAGIC 6755399441055744.0 // 1.5·2^52: adding it rounds to an integer

static const double poly[9] = {1.0 / 362880, 1.0 / 40320, 1.0 / 5040, 1.0 / 720, 1.0 / 120,
                               1.0 / 24,     1.0 / 6,     1.0 / 2,    1.0};

static double exp_neg(double x) {
  if (!(x > -708)) return 0;
  double kf = x * LOG2E + MAGIC;
  int64_t kb, mb;
  memcpy(&kb, &kf, 8);
  double magic = MAGIC;
  memcpy(&mb, &magic, 8);
  int64_t ki = kb - mb;
  double k = kf - MAGIC;
  double r = x - k * LN2HI - k * LN2LO;
  double q = poly[0];
  for (int i = 1; i < 9; i++) q = poly[i] + r * q;
  q = 1 + r * q;
  uint64_t qb;
  memcpy(&qb, &q, 8);
  qb += (uint64_t)ki << 52;
  memcpy(&q, &qb, 8);
  return q;
}

static double combine(const double *s) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static double sum_scalar(double *p, const float *l, int64_t n, double top, double inv) {
  double s[8] = {0};
  for (int64_t i = 0; i < n; i++) {
    double e = exp_neg(((double)l[i] - top) * inv);
    if (p) p[i] = e;
    s[i % 8] += e;
  }
  return combine(s);
}

static float max_scalar(const float *l, int64_t n) {
  float m = l[0];
  for (int64_t i = 0; i < n; i++) {
    if (l[i] != l[i]) return l[i];
    if (l[i] > m) m = l[i];
  }
  return m;
}

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>

#define ES512 __attribute__((target("avx512f")))
#define ES256 __attribute__((target("avx2")))

// EXP_NEG_V defines NAME(x): exp_neg on each lane of x, a vector of W-bit
// doubles (P is the intrinsics' prefix, VD and VI the double and integer
// vector types); KEEP(x, e) is e where x > -708, else 0.
#define EXP_NEG_V(NAME, ATTR, W, P, VD, VI, KEEP)                                             \
  ATTR static inline VD NAME(VD x) {                                                          \
    const VD magic = P##_set1_pd(MAGIC);                                                      \
    VD kf = P##_add_pd(P##_mul_pd(x, P##_set1_pd(LOG2E)), magic);                             \
    VI ki = P##_sub_epi64(P##_castpd_si##W(kf), P##_castpd_si##W(magic));                     \
    VD k = P##_sub_pd(kf, magic);                                                             \
    VD r = P##_sub_pd(P##_sub_pd(x, P##_mul_pd(k, P##_set1_pd(LN2HI))),                       \
                      P##_mul_pd(k, P##_set1_pd(LN2LO)));                                     \
    VD q = P##_set1_pd(poly[0]);                                                              \
    for (int i = 1; i < 9; i++) q = P##_add_pd(P##_set1_pd(poly[i]), P##_mul_pd(r, q));       \
    q = P##_add_pd(P##_set1_pd(1), P##_mul_pd(r, q));                                         \
    VI e = P##_add_epi64(P##_castpd_si##W(q), P##_slli_epi64(ki, 52));                        \
    return KEEP(x, P##_castsi##W##_pd(e));                                                    \
  }

ES512 static inline __m512d keep512(__m512d x, __m512d e) {
  return _mm512_maskz_mov_pd(_mm512_cmp_pd_mask(x, _mm512_set1_pd(-708), _CMP_GT_OQ), e);
}
ES256 static inline __m256d keep256(__m256d x, __m256d e) {
  return _mm256_and_pd(_mm256_cmp_pd(x, _mm256_set1_pd(-708), _CMP_GT_OQ), e);
}

EXP_NEG_V(exp8, ES512, 512, _mm512, __m512d, __m512i, keep512)
EXP_NEG_V(exp4, ES256, 256, _mm256, __m256d, __m256i, keep256)

ES512 static double sum512(double *p, const float *l, int64_t n, double top, double inv) {
  __m512d acc = _mm512_setzero_pd(), vt = _mm512_set1_pd(top), vi = _mm512_set1_pd(inv);
  for (int64_t i = 0; i < n; i += 8) {
    __mmask8 m = n - i >= 8 ? 0xff : (__mmask8)((1u << (n - i)) - 1);
    __m512d x = _mm512_cvtps_pd(_mm512_castps512_ps256(_mm512_maskz_loadu_ps((__mmask16)m, l + i)));
    __m512d e = _mm512_maskz_mov_pd(m, exp8(_mm512_mul_pd(_mm512_sub_pd(x, vt), vi)));
    if (p) _mm512_mask_storeu_pd(p + i, m, e);
    acc = _mm512_add_pd(acc, e); // absent lanes add +0: x + 0 == x for x >= 0
  }
  double s[8];
  _mm512_storeu_pd(s, acc);
  return combine(s);
}

ES512 static float max512(const float *l, int64_t n) {
  __m512 m = _mm512_set1_ps(-__builtin_inff());
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    __mmask16 k = n - i >= 16 ? 0xffff : (__mmask16)((1u << (n - i)) - 1);
    __m512 x = _mm512_mask_loadu_ps(m, k, l + i); // absent lanes: m itself
    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    m = _mm512_max_ps(m, x);
  }
  if (nan) return __builtin_nanf("");
  return _mm512_reduce_max_ps(m);
}

ES256 static double sum256(double *p, const float *l, int64_t n, double top, double inv) {
  __m256d lo = _mm256_setzero_pd(), hi = lo, vt = _mm256_set1_pd(top), vi = _mm256_set1_pd(inv);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256d a = exp4(_mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(l + i)), vt), vi));
    __m256d b =
        exp4(_mm256_mul_pd(_mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(l + i + 4)), vt), vi));
    if (p) {
      _mm256_storeu_pd(p + i, a);
      _mm256_storeu_pd(p + i + 4, b);
    }
    lo = _mm256_add_pd(lo, a);
    hi = _mm256_add_pd(hi, b);
  }
  double s[8];
  _mm256_storeu_pd(s, lo);
  _mm256_storeu_pd(s + 4, hi);
  for (; i < n; i++) { // the tail goes on in the same lanes
    double e = exp_neg(((double)l[i] - top) * inv);
    if (p) p[i] = e;
    s[i % 8] += e;
  }
  return combine(s);
}

ES256 static float max256(const float *l, int64_t n) {
  __m256 m = _mm256_set1_ps(-__builtin_inff()), nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(l + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    m = _mm256_max_ps(m, x);
  }
  if (_mm256_movemask_ps(nan)) return __builtin_nanf("");
  float s[8];
  _mm256_storeu_ps(s, m);
  for (; i < n; i++) {
    if (l[i] != l[i]) return l[i];
    s[0] = l[i] > s[0] ? l[i] : s[0];
  }
  return max_scalar(s, 8);
}

static int g_have = -1, g_simd;

int es_simd(void) {
  if (g_have < 0) {
    __builtin_cpu_init();
    g_have = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
    g_simd = g_have;
  }
  return g_simd;
}

void es_limit(int level) {
  es_simd();
  g_simd = level < g_have ? level : g_have;
}

double es_sum(double *p, const float *l, int64_t n, double top, double inv) {
  switch (es_simd()) {
  case 2:
    return sum512(p, l, n, top, inv);
  case 1:
    return sum256(p, l, n, top, inv);
  }
  return sum_scalar(p, l, n, top, inv);
}

float es_max(const float *l, int64_t n) {
  switch (es_simd()) {
  case 2:
    return max512(l, n);
  case 1:
    return max256(l, n);
  }
  return max_scalar(l, n);
}
#else
int es_simd(void) { return 0; }

float es_max(const float *l, int64_t n) { return max_scalar(l, n); }

void es_limit(int level) { (void)level; }

double es_sum(double *p, const float *l, int64_t n, double top, double inv) {
  return sum_scalar(p, l, n, top, inv);
}
#endif
