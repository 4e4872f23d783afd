// The packed scales of the K formats, shared by the scalar and AVX2
// kernels (quant.c), the AVX-512 dot products (qdot512.c) and the int8
// gemm (qgemm512.c).
#ifndef BATON_KSCALES_H
#define BATON_KSCALES_H

#include <stdint.h>
#include <string.h>

// k4_scales unpacks the 12 packed bytes at B+4 into u: bytes 0..7 the 8
// scales, bytes 8..15 the 8 mins, one byte each.
static inline void k4_scales(const uint8_t *B, uint32_t u[4]) {
  const uint32_t m1 = 0x3f3f3f3f, m2 = 0x0f0f0f0f, m3 = 0x03030303;
  memcpy(u, B + 4, 12);
  u[3] = ((u[2] >> 4) & m2) | (((u[1] >> 6) & m3) << 4);
  const uint32_t mins03 = u[1] & m1;
  u[1] = (u[2] & m2) | (((u[0] >> 6) & m3) << 4);
  u[2] = mins03;
  u[0] &= m1;
}

// k3_scale is scale g (0..15, one per 16 elements) of a Q3_K
// super-block whose 12 packed scale bytes start at sc: 6 bits, signed by
// an offset of 32.
static inline int k3_scale(const uint8_t *sc, int g) {
  int lo = g < 8 ? sc[g % 8] & 15 : sc[g % 8] >> 4;
  return (lo | ((sc[8 + g % 4] >> (2 * (g / 4))) & 3) << 4) - 32;
}

#endif
