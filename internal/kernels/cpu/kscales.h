// The 6-bit scales and mins of a Q4_K or Q5_K super-block, shared by the
// AVX2 (quant.c) and AVX-512 (qdot512.c) integer dot products.
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

#endif
