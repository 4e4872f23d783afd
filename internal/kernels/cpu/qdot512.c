// Integer dot products of the K formats (Q4_K, Q5_K, Q6_K) with AVX-512BW:
// the AVX2 kernels of quant.c with 64 quants a register. A 64-byte vector
// holds two whole 32-element sub-blocks (Q4_K/Q5_K: the low and the high
// nibbles of one 32-byte group; Q6_K: two neighbouring groups), whose x
// quants are contiguous, so one maddubs and one madd with the sub-blocks'
// scales cover what took two of each. Chosen at run time like the AVX-512
// gemm. The integer sums per super-block are the AVX2 kernels'; only the
// float sums over super-blocks run in 16 lanes instead of 8.
#include "cpu.h"
#include "kquants512.h"
#include "kscales.h"

#include <string.h>

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#define Q512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define Q512_INLINE static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

extern float g_f16[65536];

static inline float q5hf(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return g_f16[v];
}

#define ZQN 4    // x rows per pass over a weight row
#define ZQPF 4096 // prefetch distance, as the AVX2 rows (QPF)

// Two int16 scales: a in the low 256 bits, b in the high.
Q512_INLINE __m512i scale_pair(int a, int b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16((short)a)),
                            _mm256_set1_epi16((short)b), 1);
}

Q512_INLINE float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

Q512_INLINE void zq_k45_n(const int five, const int N, float *out, const int8_t *qs,
                          const float *d, const int32_t *s, const uint8_t *w, int64_t rows,
                          int64_t cols, int64_t r0, int64_t r1) {
  const int64_t bytes = five ? 176 : 144, nsb = cols / 256, nb = cols / 32;
  const int64_t rb = nsb * bytes;
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = w + r * rb;
    __m512 acc[ZQN];
    __m256 accm[ZQN];
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) {
      acc[i] = _mm512_setzero_ps();
      accm[i] = _mm256_setzero_ps();
    }
    for (int64_t sb = 0; sb < nsb; sb++) {
      const uint8_t *B = row + sb * bytes;
      for (int l = 0; l < bytes; l += 64) _mm_prefetch((const char *)B + ZQPF + l, _MM_HINT_T0);
      uint32_t u[4];
      k4_scales(B, u); // bytes 0..7: the 8 scales, 8..15: the 8 mins
      uint8_t sc[16];
      memcpy(sc, u, 16);
      __m256i mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8)));
      const float dd = q5hf(B), dmin = q5hf(B + 2);
      __m512i isum[ZQN];
#pragma GCC unroll 4
      for (int i = 0; i < N; i++) {
        const float xd = d[i * nsb + sb];
        __m256i xs = _mm256_loadu_si256((const __m256i *)(s + i * nb + 8 * sb));
        accm[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_mullo_epi32(mins, xs)),
                                  _mm256_set1_ps(dmin * xd), accm[i]);
        isum[i] = _mm512_setzero_si512();
      }
#pragma GCC unroll 4
      for (int p = 0; p < 4; p++) {
        __m512i q = k45_group(B, five, p);
        __m512i scv = scale_pair(sc[2 * p], sc[2 * p + 1]);
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
          __m512i x = _mm512_loadu_si512((const void *)(qs + i * cols + 256 * sb + 64 * p));
          isum[i] = _mm512_add_epi32(isum[i], _mm512_madd_epi16(_mm512_maddubs_epi16(q, x), scv));
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < N; i++)
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_set1_ps(dd * d[i * nsb + sb]), acc[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) out[i * rows + r] = _mm512_reduce_add_ps(acc[i]) - hsum8(accm[i]);
  }
}

Q512_INLINE void zq_k6_n(const int N, float *out, const int8_t *qs, const float *d,
                         const uint8_t *w, int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  const int64_t nsb = cols / 256, rb = nsb * 210;
  const __m512i m32 = _mm512_set1_epi8(32);
  // A 128-bit quarter j of scale vector v takes scale 4v+j, widened.
  const __m512i qsel = _mm512_set_epi16(15, 15, 15, 15, 15, 15, 15, 15, 14, 14, 14, 14, 14, 14,
                                        14, 14, 13, 13, 13, 13, 13, 13, 13, 13, 12, 12, 12, 12,
                                        12, 12, 12, 12);
  for (int64_t r = r0; r < r1; r++) {
    const uint8_t *row = w + r * rb;
    __m512 acc[ZQN];
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++) {
      const uint8_t *B = row + sb * 210;
      for (int l = 0; l < 210; l += 64) _mm_prefetch((const char *)B + ZQPF + l, _MM_HINT_T0);
      const float dd = q5hf(B + 208);
      // The 16 scales as int16 in the low 256 bits.
      __m512i s16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(B + 192))));
      __m512i isum[ZQN];
#pragma GCC unroll 4
      for (int i = 0; i < N; i++) isum[i] = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {
#pragma GCC unroll 2
        for (int k = 0; k < 2; k++) { // elements 128h + 64k .. +64
          __m512i q = k6_chunk(B, h, k); // 0..63, 32 too many
          __m512i scv = _mm512_permutexvar_epi16(
              _mm512_sub_epi16(qsel, _mm512_set1_epi16((short)(12 - 8 * h - 4 * k))), s16);
#pragma GCC unroll 4
          for (int i = 0; i < N; i++) {
            __m512i x = _mm512_loadu_si512((const void *)(qs + i * cols + 256 * sb + 128 * h + 64 * k));
            __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(q, x), _mm512_maddubs_epi16(m32, x));
            isum[i] = _mm512_add_epi32(isum[i], _mm512_madd_epi16(p, scv));
          }
        }
      }
#pragma GCC unroll 4
      for (int i = 0; i < N; i++)
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i]), _mm512_set1_ps(dd * d[i * nsb + sb]), acc[i]);
    }
#pragma GCC unroll 4
    for (int i = 0; i < N; i++) out[i * rows + r] = _mm512_reduce_add_ps(acc[i]);
  }
}

#define ZQ_CASE(N)                                                                              \
  case N:                                                                                       \
    if (dt == BK_Q6_K) zq_k6_n(N, o, q, dx, w, rows, cols, r0, r1);                              \
    else zq_k45_n(dt == BK_Q5_K, N, o, q, dx, sx, w, rows, cols, r0, r1);                        \
    break;

Q512 int bk_qdot_k_avx512(float *out, const int8_t *qs, const float *d, const int32_t *s, int64_t n,
                          const uint8_t *w, int dt, int64_t rows, int64_t cols, int64_t r0,
                          int64_t r1) {
  if (dt != BK_Q4_K && dt != BK_Q5_K && dt != BK_Q6_K) return 0;
  const int64_t nsb = cols / 256, nb = cols / 32;
  for (int64_t i0 = 0; i0 < n; i0 += ZQN) {
    int nn = n - i0 < ZQN ? (int)(n - i0) : ZQN;
    float *o = out + i0 * rows;
    const int8_t *q = qs + i0 * cols;
    const float *dx = d + i0 * nsb;
    const int32_t *sx = s + i0 * nb;
    switch (nn) {
      ZQ_CASE(1)
      ZQ_CASE(2)
      ZQ_CASE(3)
      ZQ_CASE(4)
    }
  }
  return 1;
}
#else
int bk_qdot_k_avx512(float *out, const int8_t *qs, const float *d, const int32_t *s, int64_t n,
                     const uint8_t *w, int dt, int64_t rows, int64_t cols, int64_t r0, int64_t r1) {
  (void)out, (void)qs, (void)d, (void)s, (void)n, (void)w, (void)dt, (void)rows, (void)cols;
  (void)r0, (void)r1;
  return 0;
}
#endif
