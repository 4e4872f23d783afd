// quant.cuh: decoders of ggml's block formats (q8_0, q4_0, q4_1, q5_0,
// q5_1, q2_k, q3_k, q4_k, q5_k, q6_k; layouts in internal/kernels/quant.go),
// shared by the gemv kernels (which dequantise in registers), by
// bk_dequant_rows (Embed, and the float32 row chunks of exact cuBLAS
// products) and by bk_dequant_rows_f16 (the f16 row chunks of GemmEx
// products).
//
// A block is cut into slots of 8 elements, each decoded by one thread:
// 4 slots for the 32-element formats, 32 for the 256-element K formats.
// A slot is the elements one lane can fetch with one 4-byte (or two
// 2-byte) load of quants and combine with two 4-float runs of x: elements
// c0..c0+3 of the block are w[0..3], c1..c1+3 are w[4..7]
// (bk_q_slot). Within a warp, the lanes of consecutive slots read
// consecutive quant bytes and consecutive x, so the loads coalesce.
//
// The decode is bit-exact with kernels.Matrix.Row: the same float32
// operations in the same order, each rounded (bk_mul_rn and friends stop
// nvcc from fusing a multiply and an add into an FMA, which Go does not do).
// Included at the end of common.cuh.
#pragma once
#include "common.cuh"

// The alignment every block of a row (and so every row) has on the device
// (buffers start 256-aligned): the gcd of 4 and the block size.
__host__ __device__ constexpr int bk_qalign(int dt) { return bk_qbytes(dt) % 4 == 0 ? 4 : 2; }

// Float operations rounded one by one, as Go computes them.
__device__ __forceinline__ float bk_mul_rn(float a, float b) {
#ifdef BK_EMU
  return a * b;  // g++ -std=c++17 does not contract
#else
  return __fmul_rn(a, b);
#endif
}

__device__ __forceinline__ float bk_add_rn(float a, float b) {
#ifdef BK_EMU
  return a + b;
#else
  return __fadd_rn(a, b);
#endif
}

__device__ __forceinline__ float bk_sub_rn(float a, float b) {
#ifdef BK_EMU
  return a - b;
#else
  return __fsub_rn(a, b);
#endif
}

// bk_u2f: a small unsigned integer (< 2^23) as a float, exactly, by
// placing it in the mantissa of 2^23: an OR and a subtraction instead of
// an int-to-float conversion (which has a quarter of the throughput).
__device__ __forceinline__ float bk_u2f(uint32_t q) { return __uint_as_float(0x4b000000u | q) - 8388608.f; }

__device__ __forceinline__ uint32_t bk_ld16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }

// bk_ld4 loads 4 bytes at p, which is 2- or 4-byte aligned (A).
template <int A>
__device__ __forceinline__ uint32_t bk_ld4(const uint8_t* p) {
  if (A == 4) return *reinterpret_cast<const uint32_t*>(p);
  return bk_ld16(p) | bk_ld16(p + 2) << 16;
}

__device__ __forceinline__ float bk_half_at(const uint8_t* p) { return bk_h2f(bk_ld16(p)); }

// Byte i (0..3) of a little-endian word.
__device__ __forceinline__ uint32_t bk_byte(uint32_t v, int i) { return (v >> (8 * i)) & 0xffu; }

// bk_q_slot: where slot s of a block of DT sits: w[0..3] are elements
// c0..c0+3 of the block, w[4..7] elements c1..c1+3.
template <int DT>
__device__ __forceinline__ void bk_q_slot(int s, int& c0, int& c1) {
  const int l0 = 4 * (s % 8);
  switch (DT) {
    case BK_Q8_0: c0 = 8 * s; c1 = 8 * s + 4; break;
    // Byte j holds elements j (low nibble) and j+16 (high).
    case BK_Q4_0: case BK_Q4_1: case BK_Q5_0: case BK_Q5_1: c0 = 4 * s; c1 = 16 + 4 * s; break;
    // Byte l of run r: element l of sub-block 2r (low), of 2r+1 (high).
    case BK_Q4_K: case BK_Q5_K: c0 = 64 * (s / 8) + l0; c1 = c0 + 32; break;
    // Low byte l of half h: quarters m (low nibble) and m+2 (high).
    case BK_Q6_K: c0 = 128 * (s / 16) + 32 * (s / 8 % 2) + l0; c1 = c0 + 64; break;
    // Quant byte l of half h: quarters 2p and 2p+1 of its four.
    default: c0 = 128 * (s / 16) + 64 * (s / 8 % 2) + l0; c1 = c0 + 32; break;
  }
}

// bk_q_decode dequantises slot s of the block at blk into w (layout of
// bk_q_slot), bit-exact with kernels.Matrix.Row.
template <int DT>
__device__ __forceinline__ void bk_q_decode(const uint8_t* __restrict__ blk, int s, float (&w)[8]) {
  constexpr int A = bk_qalign(DT);
  const int l0 = 4 * (s % 8);
  switch (DT) {
    case BK_Q8_0: {
      const float d = bk_half_at(blk);
      const uint32_t a = bk_ld4<2>(blk + 2 + 8 * s), b = bk_ld4<2>(blk + 6 + 8 * s);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        // (q ^ 0x80) is q + 128 as an unsigned byte.
        w[k] = bk_mul_rn(d, bk_u2f(bk_byte(a, k) ^ 0x80u) - 128.f);
        w[4 + k] = bk_mul_rn(d, bk_u2f(bk_byte(b, k) ^ 0x80u) - 128.f);
      }
      break;
    }
    case BK_Q4_0:
    case BK_Q4_1:
    case BK_Q5_0:
    case BK_Q5_1: {
      const bool five = DT == BK_Q5_0 || DT == BK_Q5_1, one = DT == BK_Q4_1 || DT == BK_Q5_1;
      const float d = bk_half_at(blk);
      const float m = one ? bk_half_at(blk + 2) : 0.f;
      const uint8_t* rest = blk + (one ? 4 : 2);
      uint32_t qh = 0;
      if (five) {
        qh = bk_ld4<A>(rest);
        rest += 4;
      }
      const uint32_t q = bk_ld4<A>(rest + 4 * s);
      // Type-0 formats store q + 8 (q + 16): removed after the conversion.
      const float off = one ? 0.f : five ? 16.f : 8.f;
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const int j = 4 * s + k;
        uint32_t lo = bk_byte(q, k) & 15u, hi = bk_byte(q, k) >> 4;
        if (five) {
          lo |= (qh >> j & 1u) << 4;
          hi |= (qh >> (j + 16) & 1u) << 4;
        }
        if (one) {
          w[k] = bk_add_rn(bk_mul_rn(d, bk_u2f(lo)), m);
          w[4 + k] = bk_add_rn(bk_mul_rn(d, bk_u2f(hi)), m);
        } else {
          w[k] = bk_mul_rn(d, bk_u2f(lo) - off);
          w[4 + k] = bk_mul_rn(d, bk_u2f(hi) - off);
        }
      }
      break;
    }
    case BK_Q4_K:
    case BK_Q5_K: {
      const int r = s / 8;
      // d and dmin, then the 12 bytes of scales, as 4-byte words.
      const uint32_t dm = bk_ld4<A>(blk), w0 = bk_ld4<A>(blk + 4), w1 = bk_ld4<A>(blk + 8), w2 = bk_ld4<A>(blk + 12);
      const float d = bk_h2f(dm & 0xffffu), dmin = bk_h2f(dm >> 16);
      // Scales and mins of sub-blocks 2r and 2r+1 (kernels.scaleMinK):
      // bytes i, i+1 of each word, i = 2r for r < 2 and 2r-4 after.
      const int i = 2 * (r & 1);
      const uint32_t a0 = bk_byte(w0, i), a1 = bk_byte(w0, i + 1), b0 = bk_byte(w1, i), b1 = bk_byte(w1, i + 1);
      uint32_t s1, m1, s2, m2;
      if (r < 2) {
        s1 = a0 & 63u, m1 = b0 & 63u, s2 = a1 & 63u, m2 = b1 & 63u;
      } else {
        const uint32_t c0 = bk_byte(w2, i), c1 = bk_byte(w2, i + 1);
        s1 = (c0 & 15u) | (a0 >> 6) << 4, m1 = (c0 >> 4) | (b0 >> 6) << 4;
        s2 = (c1 & 15u) | (a1 >> 6) << 4, m2 = (c1 >> 4) | (b1 >> 6) << 4;
      }
      const float d1 = bk_mul_rn(d, bk_u2f(s1)), o1 = bk_mul_rn(dmin, bk_u2f(m1));
      const float d2 = bk_mul_rn(d, bk_u2f(s2)), o2 = bk_mul_rn(dmin, bk_u2f(m2));
      uint32_t qh = 0, q;
      if (DT == BK_Q5_K) {
        qh = bk_ld4<A>(blk + 16 + l0);
        q = bk_ld4<A>(blk + 48 + 32 * r + l0);
      } else {
        q = bk_ld4<A>(blk + 16 + 32 * r + l0);
      }
#pragma unroll
      for (int k = 0; k < 4; k++) {
        uint32_t lo = bk_byte(q, k) & 15u, hi = bk_byte(q, k) >> 4;
        if (DT == BK_Q5_K) {
          lo |= (bk_byte(qh, k) >> (2 * r) & 1u) << 4;
          hi |= (bk_byte(qh, k) >> (2 * r + 1) & 1u) << 4;
        }
        w[k] = bk_sub_rn(bk_mul_rn(d1, bk_u2f(lo)), o1);
        w[4 + k] = bk_sub_rn(bk_mul_rn(d2, bk_u2f(hi)), o2);
      }
      break;
    }
    case BK_Q6_K: {
      const int h = s / 16, m = s / 8 % 2;
      const float d = bk_half_at(blk + 208);
      const uint32_t ql = bk_ld4<A>(blk + 64 * h + 32 * m + l0), qh = bk_ld4<A>(blk + 128 + 32 * h + l0);
      const int8_t* sc = reinterpret_cast<const int8_t*>(blk + 192 + 8 * h + l0 / 16);
      // Quarters m (low nibbles) and m+2 (high), each with its scale.
      const float da = bk_mul_rn(d, (float)sc[2 * m]), db = bk_mul_rn(d, (float)sc[2 * m + 4]);
#pragma unroll
      for (int k = 0; k < 4; k++) {
        const uint32_t hb = bk_byte(qh, k);
        const uint32_t a = (bk_byte(ql, k) & 15u) | (hb >> (2 * m) & 3u) << 4;
        const uint32_t b = (bk_byte(ql, k) >> 4) | (hb >> (2 * m + 4) & 3u) << 4;
        w[k] = bk_mul_rn(da, bk_u2f(a) - 32.f);
        w[4 + k] = bk_mul_rn(db, bk_u2f(b) - 32.f);
      }
      break;
    }
    case BK_Q3_K: {
      const int h = s / 16, p = s / 8 % 2;
      const float d = bk_half_at(blk + 108);
      const uint32_t q = bk_ld4<A>(blk + 32 + 32 * h + l0), hm = bk_ld4<A>(blk + l0);
      const uint8_t* sc = blk + 96;
      float dk[2];
#pragma unroll
      for (int t = 0; t < 2; t++) {
        // Scale g (kernels.scaleQ3K), minus 32.
        const int g = 8 * h + 2 * (2 * p + t) + l0 / 16;
        const uint32_t lo = g < 8 ? sc[g % 8] & 15u : sc[g % 8] >> 4u;
        const int v = (int)(lo | (sc[8 + g % 4] >> (2 * (g / 4)) & 3u) << 4) - 32;
        dk[t] = bk_mul_rn(d, (float)v);
      }
#pragma unroll
      for (int k = 0; k < 4; k++) {
#pragma unroll
        for (int t = 0; t < 2; t++) {
          const int kk = 2 * p + t;
          // 2 low bits, and a set high bit adds 4: q - 4 + 4·bit.
          const uint32_t v = (bk_byte(q, k) >> (2 * kk) & 3u) | (bk_byte(hm, k) >> (4 * h + kk) & 1u) << 2;
          w[4 * t + k] = bk_mul_rn(dk[t], bk_u2f(v) - 4.f);
        }
      }
      break;
    }
    default: {  // BK_Q2_K
      const int h = s / 16, p = s / 8 % 2;
      const float d = bk_half_at(blk + 80), dmin = bk_half_at(blk + 82);
      const uint32_t q = bk_ld4<A>(blk + 16 + 32 * h + l0);
      float dk[2], ok[2];
#pragma unroll
      for (int t = 0; t < 2; t++) {
        const uint32_t sc = blk[8 * h + 2 * (2 * p + t) + l0 / 16];
        dk[t] = bk_mul_rn(d, bk_u2f(sc & 15u));
        ok[t] = bk_mul_rn(dmin, bk_u2f(sc >> 4));
      }
#pragma unroll
      for (int k = 0; k < 4; k++) {
#pragma unroll
        for (int t = 0; t < 2; t++) {
          const uint32_t v = bk_byte(q, k) >> (2 * (2 * p + t)) & 3u;
          w[4 * t + k] = bk_sub_rn(bk_mul_rn(dk[t], bk_u2f(v)), ok[t]);
        }
      }
      break;
    }
  }
}

// bk_q_elem is element c of a row of DT (bytes at row): the slot that
// holds it, decoded, and the one value picked out.
template <int DT>
__device__ __forceinline__ float bk_q_elem(const uint8_t* __restrict__ row, int64_t c) {
  const int e = (int)(c % bk_qk(DT));
  int s, i;
  if (DT == BK_Q8_0) {
    s = e / 8, i = e % 8;
  } else if (bk_qk(DT) == 32) {
    s = e % 16 / 4, i = e % 4 + 4 * (e / 16);
  } else if (DT == BK_Q4_K || DT == BK_Q5_K) {
    s = 8 * (e / 64) + e % 32 / 4, i = e % 4 + 4 * (e / 32 % 2);
  } else if (DT == BK_Q6_K) {
    s = 16 * (e / 128) + 8 * (e / 32 % 2) + e % 32 / 4, i = e % 4 + 4 * (e / 64 % 2);
  } else {
    s = 16 * (e / 128) + 8 * (e / 64 % 2) + e % 32 / 4, i = e % 4 + 4 * (e / 32 % 2);
  }
  float w[8];
  bk_q_decode<DT>(row + c / bk_qk(DT) * bk_qbytes(DT), s, w);
  float v = w[0];
#pragma unroll
  for (int k = 1; k < 8; k++) v = i == k ? w[k] : v;
  return v;
}

// BK_QUANT_CASES(F) applies F to every block format (a switch over dt).
#define BK_QUANT_CASES(F) \
  F(BK_Q8_0)              \
  F(BK_Q4_0)              \
  F(BK_Q4_1)              \
  F(BK_Q5_0)              \
  F(BK_Q5_1)              \
  F(BK_Q4_K)              \
  F(BK_Q5_K)              \
  F(BK_Q6_K)              \
  F(BK_Q3_K)              \
  F(BK_Q2_K)

// bk_dequant_elem is element c of row r of a weight matrix (kernels.Matrix.Row):
// bit-exact with the Go definition.
__device__ __forceinline__ float bk_dequant_elem(const uint8_t* __restrict__ w, int dt, int64_t cols, int64_t r, int64_t c) {
  const uint8_t* row = w + r * bk_row_bytes(dt, cols);
  switch (dt) {
    case BK_F32: return reinterpret_cast<const float*>(row)[c];
    case BK_F16: return bk_h2f(reinterpret_cast<const uint16_t*>(row)[c]);
    case BK_BF16: return bk_bf2f(reinterpret_cast<const uint16_t*>(row)[c]);
#define BK_ELEM_CASE(DT) \
  case DT: return bk_q_elem<DT>(row, c);
    BK_QUANT_CASES(BK_ELEM_CASE)
#undef BK_ELEM_CASE
  }
  return 0.f;
}

// bk_dequant_rows_f16 writes rows [lo, lo+nrows) of a block-format matrix
// to dst as f16 (row-major) for a GemmEx product of a prompt chunk: the
// decode of bk_dequant_rows, each value then rounded to nearest even
// (kernels.F32ToF16). Half the bytes of the float32 rows, and the product
// on the tensor cores. Launch: one thread per 8-element slot.
template <int DT>
__device__ void bk_dequant_slots_f16(uint16_t* __restrict__ dst, const uint8_t* __restrict__ w, int64_t cols,
                                     int64_t lo, int64_t nrows) {
  constexpr int per = bk_qk(DT) / 8;  // slots a block
  const int64_t nb = cols / bk_qk(DT), total = nrows * nb * per;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / (nb * per), b = e / per % nb;
    const int s = (int)(e % per);
    float v[8];
    bk_q_decode<DT>(w + (lo + i) * bk_row_bytes(DT, cols) + b * bk_qbytes(DT), s, v);
    int c0, c1;
    bk_q_slot<DT>(s, c0, c1);
    // Each run of 4 halves as two words: dst is 4-byte aligned (a device
    // buffer), rows and blocks are multiples of 32 elements, runs start
    // at multiples of 4.
    uint32_t* o0 = reinterpret_cast<uint32_t*>(dst + i * cols + b * bk_qk(DT) + c0);
    uint32_t* o1 = reinterpret_cast<uint32_t*>(dst + i * cols + b * bk_qk(DT) + c1);
#pragma unroll
    for (int k = 0; k < 2; k++) {
      o0[k] = bk_f2h(v[2 * k]) | (uint32_t)bk_f2h(v[2 * k + 1]) << 16;
      o1[k] = bk_f2h(v[4 + 2 * k]) | (uint32_t)bk_f2h(v[5 + 2 * k]) << 16;
    }
  }
}

extern "C" __global__ void bk_dequant_rows_f16(uint16_t* dst, const uint8_t* w, int64_t dt, int64_t cols, int64_t lo,
                                               int64_t nrows) {
  switch (dt) {
#define BK_DEQUANT_F16_CASE(DT)                        \
  case DT:                                             \
    bk_dequant_slots_f16<DT>(dst, w, cols, lo, nrows); \
    return;
    BK_QUANT_CASES(BK_DEQUANT_F16_CASE)
#undef BK_DEQUANT_F16_CASE
  }
}
