// exp(x) for float lanes, defined once for every vector width the
// kernels use (AVX2 in cpu.c, AVX-512 in attn512.c): Cephes-style range
// reduction and polynomial (about 1 ulp). Inputs are clamped to
// [-87.3, 88]: below, the result is ~1e-38 instead of a denormal or 0,
// which no caller can tell apart. The clamps take x as their second
// operand, which min/max return when it is NaN: a NaN attention score
// (poisoned K) stays NaN, not a finite weight.
#ifndef BATON_VEXP_H
#define BATON_VEXP_H

// BK_VEXP defines `ATTR V NAME(V x)` for vectors V of BITS bits, whose
// intrinsics start with P (_mm256, _mm512); ROUND rounds to the nearest
// integer as P_round_ps / P_roundscale_ps do with that mode.
#define BK_VEXP(NAME, ATTR, V, BITS, P, ROUND)                                                \
  ATTR V NAME(V x) {                                                                          \
    x = P##_min_ps(P##_set1_ps(88.0f), x);                                                    \
    x = P##_max_ps(P##_set1_ps(-87.3f), x);                                                   \
    V n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)),                             \
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);                               \
    V r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                     \
    r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                    \
    V p = P##_set1_ps(1.9875691500E-4f);                                                      \
    p = P##_fmadd_ps(p, r, P##_set1_ps(1.3981999507E-3f));                                    \
    p = P##_fmadd_ps(p, r, P##_set1_ps(8.3334519073E-3f));                                    \
    p = P##_fmadd_ps(p, r, P##_set1_ps(4.1665795894E-2f));                                    \
    p = P##_fmadd_ps(p, r, P##_set1_ps(1.6666665459E-1f));                                    \
    p = P##_fmadd_ps(p, r, P##_set1_ps(5.0000001201E-1f));                                    \
    p = P##_fmadd_ps(p, P##_mul_ps(r, r), r);                                                 \
    p = P##_add_ps(p, P##_set1_ps(1.0f));                                                     \
    V##i e = P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23);      \
    return P##_mul_ps(p, P##_castsi##BITS##_ps(e));                                           \
  }

#endif
