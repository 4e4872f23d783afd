// bk_emu.h: just enough CUDA to run baton's kernels on the CPU, for the
// fake driver the Go tests load instead of libcuda.so.1 (fakecuda.cc).
//
// Every CUDA thread of a block is a fiber; fakecuda.cc runs a block's
// fibers one at a time until each reaches a barrier (__syncthreads, or the
// warp barrier inside a shuffle), so barriers and shuffles behave as on a
// GPU and a missing or divergent barrier is reported, not ignored. Blocks
// run one after another; __shared__ variables are function statics.
#pragma once

#include <math.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define BK_DYN_SMEM(T, name) T* name = (T*)bk_emu_dyn_smem()

struct dim3 {
  unsigned x, y, z;
};
struct float4 {
  float x, y, z, w;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};

extern dim3 threadIdx, blockIdx, blockDim, gridDim;

void* bk_emu_dyn_smem();
void __syncthreads();
void bk_emu_syncwarp(unsigned mask);
uint64_t* bk_emu_warp_slots();

inline float __uint_as_float(unsigned u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  memcpy(&u, &f, 4);
  return u;
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int laneMask) {
  static_assert(sizeof(T) <= 8, "shuffle of a value wider than 8 bytes");
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = tid % 32;
  uint64_t* slots = bk_emu_warp_slots();
  uint64_t raw = 0;
  memcpy(&raw, &v, sizeof(T));
  slots[lane] = raw;
  bk_emu_syncwarp(mask);
  raw = slots[lane ^ (unsigned)laneMask];
  bk_emu_syncwarp(mask);
  T r;
  memcpy(&r, &raw, sizeof(T));
  return r;
}

// The conversions of kernels.F16ToF32 / F32ToF16 and round-to-nearest-even bfloat16.
inline float bk_emu_h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0 && man == 0) return __uint_as_float(sign);
  if (exp == 0) {
    uint32_t e = 127 - 15 + 1;
    while ((man & 0x400) == 0) {
      man <<= 1;
      e--;
    }
    man &= 0x3ff;
    return __uint_as_float(sign | e << 23 | man << 13);
  }
  if (exp == 0x1f) return __uint_as_float(sign | 0xffu << 23 | man << 13);
  return __uint_as_float(sign | (exp + 127 - 15) << 23 | man << 13);
}

inline uint16_t bk_emu_f2h(float f) {
  uint32_t b = __float_as_uint(f);
  uint16_t sign = (uint16_t)(b >> 16) & 0x8000;
  int32_t exp = (int32_t)(b >> 23) & 0xff;
  uint32_t man = b & 0x7fffff;
  if (exp == 0xff) return man ? (sign | 0x7e00) : (sign | 0x7c00);
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

inline uint16_t bk_emu_f2bf(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

// The warp-wide mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
// (d = a·b + d), faithful to the PTX ISA's fragment layouts: with g =
// lane/4 and t = lane%4, a lane holds A[g][2t..2t+1] (a[0]), A[g+8][2t..]
// (a[1]), A[g][2t+8..] (a[2]), A[g+8][2t+8..] (a[3]); B[2t..2t+1][g] (b[0]),
// B[2t+8..2t+9][g] (b[1]); D[g][2t..2t+1] (d[0], d[1]), D[g+8][2t..]
// (d[2], d[3]). Each register holds two halves, the lower column (or k
// row) in its low 16 bits. Every lane deposits its A and B, the warp
// meets, each lane computes its own D elements in float32 from the exact
// half inputs (k in order), and the warp meets again before the area is
// reused. All 32 lanes must call it.
inline uint32_t (*bk_emu_mma_area())[32][6] {
  static uint32_t area[32][32][6];  // [warp][lane][a0..a3, b0, b1]
  return area;
}

template <bool BF16>
void bk_emu_mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned lane = tid % 32;
  uint32_t(*w)[6] = bk_emu_mma_area()[tid / 32];
  for (int i = 0; i < 4; i++) w[lane][i] = a[i];
  w[lane][4] = b[0];
  w[lane][5] = b[1];
  bk_emu_syncwarp(0xffffffffu);
  auto half = [](uint32_t reg, int hi) -> float {
    const uint16_t h = (uint16_t)(hi ? reg >> 16 : reg & 0xffff);
    return BF16 ? __uint_as_float((uint32_t)h << 16) : bk_emu_h2f(h);
  };
  // A[r][k]: lane 4*(r%8) + (k%8)/2, register (r >= 8) + 2*(k >= 8), half k%2.
  auto A = [&](int r, int k) { return half(w[4 * (r % 8) + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)], k % 2); };
  // B[k][c]: lane 4*c + (k%8)/2, register 4 + (k >= 8), half k%2.
  auto B = [&](int k, int c) { return half(w[4 * c + (k % 8) / 2][4 + (k >= 8)], k % 2); };
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; i++) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    float s = d[i];
    for (int k = 0; k < 16; k++) s += A(r, k) * B(k, c);
    d[i] = s;
  }
  bk_emu_syncwarp(0xffffffffu);
}
