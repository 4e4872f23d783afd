// The quants of the K formats unpacked to unsigned bytes with AVX-512BW,
// 64 elements a register, shared by the integer dot products (qdot512.c)
// and the int8 gemm (qgemm512.c).
#ifndef BATON_KQUANTS512_H
#define BATON_KQUANTS512_H

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#include <stdint.h>

#define KQ512_INLINE                                                                           \
  static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// k45_group: elements 64g..64g+63 of a Q4_K (five = 0) or Q5_K super-block
// B: the low 256 bits the low nibbles of its 32 quant bytes, the high 256
// bits the high nibbles, each with Q5_K's fifth bit (2g, 2g+1) on top.
KQ512_INLINE __m512i k45_group(const uint8_t *B, int five, int g) {
  // Per 16-bit lane: the low half's bytes shift by 0, the high half's
  // by 4; the fifth bits by 2g and 2g+1.
  const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  const uint8_t *qs = B + (five ? 48 : 16);
  __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * g)));
  __m512i q = _mm512_and_si512(_mm512_srlv_epi16(v, nib_shift), _mm512_set1_epi8(15));
  if (five) {
    __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(B + 16)));
    __m512i hs = _mm512_add_epi16(_mm512_srli_epi16(nib_shift, 2), _mm512_set1_epi16((short)(2 * g)));
    __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(qh, hs), _mm512_set1_epi8(1));
    q = _mm512_or_si512(q, _mm512_slli_epi16(hb, 4));
  }
  return q;
}

// k6_chunk: elements 128h+64k..128h+64k+63 of a Q6_K super-block B as
// 0..63 (32 more than the format's value): the low 256 bits from the
// first 32 bytes of the half's ql, the high from the next 32, nibble k,
// with bits 4k..4k+1 and 4k+2..4k+3 of the half's qh above them.
KQ512_INLINE __m512i k6_chunk(const uint8_t *B, int h, int k) {
  const __m512i hshift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
  __m512i ql = _mm512_loadu_si512((const void *)(B + 64 * h));
  __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(B + 128 + 32 * h)));
  __m512i nib = _mm512_and_si512(k ? _mm512_srli_epi16(ql, 4) : ql, _mm512_set1_epi8(15));
  __m512i hb = _mm512_and_si512(
      _mm512_srlv_epi16(qh, _mm512_add_epi16(hshift, _mm512_set1_epi16((short)(4 * k)))),
      _mm512_set1_epi8(3));
  return _mm512_or_si512(nib, _mm512_slli_epi16(hb, 4));
}
#endif

#endif
