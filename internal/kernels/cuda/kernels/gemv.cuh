// gemv.cuh: out[n, rows] = x[n, cols] · wᵀ for a few rows of x (n <= 8),
// reading f32, f16, bf16 and q8_0 weights directly; plus the conversions
// the cuBLAS path of larger products needs.
//
// One warp per weight row, BK_GEMV_WARPS rows per block: each lane walks
// the row (8 elements at a time when cols is a multiple of 8, so weights
// and x load as 16-byte vectors), keeps n float32 partial sums, and the
// warp adds them up. Differences from ref: float32 accumulation (ref uses
// float64) and, for q8_0, the block scale applied to the block's sum.
#pragma once
#include "common.cuh"

#define BK_GEMV_MAXN 8
#define BK_GEMV_WARPS 4

template <int N>
__device__ __forceinline__ void bk_gemv_fma8(float (&acc)[N], const float (&wv)[8], const float* __restrict__ x, int64_t cols, int64_t c) {
#pragma unroll
  for (int i = 0; i < N; i++) {
    const float4* xp = reinterpret_cast<const float4*>(x + i * cols + c);
    float4 a = xp[0], b = xp[1];
    acc[i] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
  }
}

template <int N, int DT>
__device__ void bk_gemv_row(float* __restrict__ out, const float* __restrict__ x, const uint8_t* __restrict__ wrow,
                            int64_t rows, int64_t cols, int64_t r, int lane) {
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; i++) acc[i] = 0.f;

  if (DT == BK_Q8_0) {
    const int64_t nb = cols / 32;
    for (int64_t b = lane; b < nb; b += 32) {
      const uint8_t* blk = wrow + b * 34;
      const float d = bk_h2f((uint32_t)blk[0] | ((uint32_t)blk[1] << 8));
      // The 32 quants start 2 bytes into a 34-byte block: 2-byte aligned.
      const uint16_t* qp = reinterpret_cast<const uint16_t*>(blk + 2);
      float part[N];
#pragma unroll
      for (int i = 0; i < N; i++) part[i] = 0.f;
#pragma unroll 4
      for (int j = 0; j < 32; j += 8) {
        float wv[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
          uint32_t two = qp[j / 2 + k];
          wv[2 * k] = (float)(int8_t)(two & 0xff);
          wv[2 * k + 1] = (float)(int8_t)(two >> 8);
        }
        bk_gemv_fma8<N>(part, wv, x, cols, b * 32 + j);
      }
#pragma unroll
      for (int i = 0; i < N; i++) acc[i] += d * part[i];
    }
  } else if (cols % 8 == 0) {
    // 16-byte loads: rows start 16-byte aligned (device buffers are
    // 256-aligned and a row is a multiple of 16 bytes here).
    for (int64_t c = (int64_t)lane * 8; c < cols; c += 32 * 8) {
      float wv[8];
      if (DT == BK_F32) {
        const float4* wp = reinterpret_cast<const float4*>(wrow + c * 4);
        float4 a = wp[0], b = wp[1];
        wv[0] = a.x; wv[1] = a.y; wv[2] = a.z; wv[3] = a.w;
        wv[4] = b.x; wv[5] = b.y; wv[6] = b.z; wv[7] = b.w;
      } else {
        uint4 u = *reinterpret_cast<const uint4*>(wrow + c * 2);
        uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
          if (DT == BK_F16) {
            wv[2 * k] = bk_h2f(p[k] & 0xffff);
            wv[2 * k + 1] = bk_h2f(p[k] >> 16);
          } else {
            wv[2 * k] = bk_bf2f(p[k] & 0xffff);
            wv[2 * k + 1] = bk_bf2f(p[k] >> 16);
          }
        }
      }
      bk_gemv_fma8<N>(acc, wv, x, cols, c);
    }
  } else {
    for (int64_t c = lane; c < cols; c += 32) {
      float wv;
      if (DT == BK_F32) {
        wv = reinterpret_cast<const float*>(wrow)[c];
      } else if (DT == BK_F16) {
        wv = bk_h2f(reinterpret_cast<const uint16_t*>(wrow)[c]);
      } else {
        wv = bk_bf2f(reinterpret_cast<const uint16_t*>(wrow)[c]);
      }
#pragma unroll
      for (int i = 0; i < N; i++) acc[i] += wv * x[i * cols + c];
    }
  }
#pragma unroll
  for (int i = 0; i < N; i++) {
    float s = bk_warp_sum(acc[i]);
    if (lane == 0) out[i * rows + r] = s;
  }
}

template <int DT>
__device__ void bk_gemv(float* __restrict__ out, const float* __restrict__ x, int64_t n, const uint8_t* __restrict__ w,
                        int64_t rows, int64_t cols) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * BK_GEMV_WARPS + warp;
  if (r >= rows) return;  // the whole warp leaves together
  const uint8_t* wrow = w + r * bk_row_bytes(DT, cols);
  switch (n) {
    case 1: bk_gemv_row<1, DT>(out, x, wrow, rows, cols, r, lane); break;
    case 2: bk_gemv_row<2, DT>(out, x, wrow, rows, cols, r, lane); break;
    case 3: bk_gemv_row<3, DT>(out, x, wrow, rows, cols, r, lane); break;
    case 4: bk_gemv_row<4, DT>(out, x, wrow, rows, cols, r, lane); break;
    case 5: bk_gemv_row<5, DT>(out, x, wrow, rows, cols, r, lane); break;
    case 6: bk_gemv_row<6, DT>(out, x, wrow, rows, cols, r, lane); break;
    case 7: bk_gemv_row<7, DT>(out, x, wrow, rows, cols, r, lane); break;
    default: bk_gemv_row<8, DT>(out, x, wrow, rows, cols, r, lane); break;
  }
}

// Launch: grid ceil(rows / BK_GEMV_WARPS), block 32 * BK_GEMV_WARPS, 1 <= n <= 8.
extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_f32(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_F32>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_f16(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_F16>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_bf16(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_BF16>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q8_0(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q8_0>(out, x, n, w, rows, cols);
}

// bk_dequant_rows writes nrows dequantised rows of a weight matrix to dst
// (float32, row-major): row i is ids[i] when ids is not null (Embed),
// else lo+i (a chunk of a q8_0 matrix for sgemm). Bit-exact with
// kernels.Matrix.Row. Launch: one thread per output element.
extern "C" __global__ void bk_dequant_rows(float* dst, const uint8_t* w, int64_t dt, int64_t cols, const int32_t* ids,
                                           int64_t lo, int64_t nrows) {
  const int64_t total = nrows * cols;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / cols, c = e % cols;
    const int64_t r = ids ? (int64_t)ids[i] : lo + i;
    dst[e] = bk_dequant_elem(w, (int)dt, cols, r, c);
  }
}

// bk_f32_to_f16 / bk_f32_to_bf16 round x for tensor-core products
// (cublasGemmEx): round to nearest even.
extern "C" __global__ void bk_f32_to_f16(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    dst[i] = bk_f2h(src[i]);
  }
}

extern "C" __global__ void bk_f32_to_bf16(uint16_t* dst, const float* src, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    dst[i] = bk_f2bf(src[i]);
  }
}
