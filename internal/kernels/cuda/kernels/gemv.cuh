// gemv.cuh: out[n, rows] = x[n, cols] · wᵀ for a few rows of x (n <= 8),
// reading the weights directly in every format (f32, f16, bf16 and the
// ggml block formats, dequantised in registers); plus the conversions the
// cuBLAS path of larger products needs.
//
// One warp per weight row, BK_GEMV_WARPS rows per block; each lane keeps
// n float32 partial sums and the warp adds them up at the end. Float
// types: each lane walks the row 8 elements at a time when cols is a
// multiple of 8, so weights and x load as 16-byte vectors. Block formats:
// the lanes split each block into 8-element slots (quant.cuh): 4 lanes a
// block for the 32-element formats (a warp takes 8 consecutive blocks a
// step), 32 lanes a block for the K formats. So a warp's loads of quant
// bytes are consecutive words and its loads of x are runs of 16-byte
// vectors over consecutive addresses, both coalesced; each lane
// dequantises its 8 weights once and uses them for all n rows of x. This
// is how a bandwidth-bound kernel should read (a lane owning a whole
// block, as the q8_0 kernel used to, makes every load of a warp touch 32
// cache lines, which starves the loads with 2-8 rows of x); it has been
// checked for results on the emulation, not timed here.
//
// Differences from ref: float32 accumulation (ref uses float64). The
// weights themselves are the exact values of kernels.Matrix.Row.
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

// bk_gemv_fma4x2: acc[i] += wv · x[i] over elements c0..c0+3 (wv[0..3])
// and c1..c1+3 (wv[4..7]) of each row i of x; c0 and c1 are multiples
// of 4, so x loads as 16-byte vectors.
template <int N>
__device__ __forceinline__ void bk_gemv_fma4x2(float (&acc)[N], const float (&wv)[8], const float* __restrict__ x, int64_t cols,
                                               int64_t c0, int64_t c1) {
#pragma unroll
  for (int i = 0; i < N; i++) {
    const float4 a = *reinterpret_cast<const float4*>(x + i * cols + c0);
    const float4 b = *reinterpret_cast<const float4*>(x + i * cols + c1);
    acc[i] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
  }
}

template <int N, int DT>
__device__ void bk_gemv_row(float* __restrict__ out, const float* __restrict__ x, const uint8_t* __restrict__ wrow,
                            int64_t rows, int64_t cols, int64_t r, int lane) {
  float acc[N];
#pragma unroll
  for (int i = 0; i < N; i++) acc[i] = 0.f;

  if (bk_is_quant(DT)) {
    // U blocks a lane per trip, decoded before any is used, so that their
    // loads are in flight together: one block at a time leaves a warp
    // with 150-300 bytes outstanding, too few to cover DRAM latency.
    constexpr int qk = bk_qk(DT), per = qk == 32 ? 4 : 32, step = 32 / per, U = 4;  // per: lanes a block
    const int64_t nb = cols / qk;
    const int slot = lane % per;
    int c0, c1;
    bk_q_slot<DT>(slot, c0, c1);
    for (int64_t b0 = lane / per; b0 < nb; b0 += U * step) {
      float wv[U][8];
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (b0 + u * step < nb) bk_q_decode<DT>(wrow + (b0 + u * step) * bk_qbytes(DT), slot, wv[u]);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        const int64_t b = b0 + u * step;
        if (b < nb) bk_gemv_fma4x2<N>(acc, wv[u], x, cols, b * qk + c0, b * qk + c1);
      }
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

// bk_gemv_row_n is bk_gemv_row for a row count (1..8) known at run time.
template <int DT>
__device__ __forceinline__ void bk_gemv_row_n(int n, float* __restrict__ out, const float* __restrict__ x,
                                              const uint8_t* __restrict__ wrow, int64_t rows, int64_t cols, int64_t r,
                                              int lane) {
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

template <int DT>
__device__ void bk_gemv(float* __restrict__ out, const float* __restrict__ x, int64_t n, const uint8_t* __restrict__ w,
                        int64_t rows, int64_t cols) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * BK_GEMV_WARPS + warp;
  if (r >= rows) return;  // the whole warp leaves together
  bk_gemv_row_n<DT>(n, out, x, w + r * bk_row_bytes(DT, cols), rows, cols, r, lane);
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

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q4_0(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q4_0>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q4_1(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q4_1>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q5_0(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q5_0>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q5_1(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q5_1>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q4_k(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q4_K>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q5_k(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q5_K>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q6_k(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q6_K>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q3_k(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q3_K>(out, x, n, w, rows, cols);
}

extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_gemv_q2_k(float* out, const float* x, int64_t n, const uint8_t* w, int64_t rows, int64_t cols) {
  bk_gemv<BK_Q2_K>(out, x, n, w, rows, cols);
}

// bk_dequant_slots writes the dequantised rows of a block-format matrix,
// one 8-element slot (quant.cuh) a thread: the block's scales are decoded
// once for its 8 elements, and the weights read as whole words.
template <int DT>
__device__ void bk_dequant_slots(float* __restrict__ dst, const uint8_t* __restrict__ w, int64_t cols, const int32_t* ids, int64_t lo,
                                 int64_t nrows) {
  constexpr int per = bk_qk(DT) / 8;  // slots a block
  const int64_t nb = cols / bk_qk(DT), total = nrows * nb * per;
  // dst rows are 16-byte aligned when dst is (cols is a multiple of 32).
  const bool vec = (reinterpret_cast<uintptr_t>(dst) & 15) == 0;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / (nb * per), b = e / per % nb;
    const int s = (int)(e % per);
    const int64_t r = ids ? (int64_t)ids[i] : lo + i;
    float v[8];
    bk_q_decode<DT>(w + r * bk_row_bytes(DT, cols) + b * bk_qbytes(DT), s, v);
    int c0, c1;
    bk_q_slot<DT>(s, c0, c1);
    float* o0 = dst + i * cols + b * bk_qk(DT) + c0;
    float* o1 = dst + i * cols + b * bk_qk(DT) + c1;
    if (vec) {
      *reinterpret_cast<float4*>(o0) = float4{v[0], v[1], v[2], v[3]};
      *reinterpret_cast<float4*>(o1) = float4{v[4], v[5], v[6], v[7]};
    } else {
#pragma unroll
      for (int k = 0; k < 4; k++) o0[k] = v[k], o1[k] = v[4 + k];
    }
  }
}

// bk_dequant_rows writes nrows dequantised rows of a weight matrix to dst
// (float32, row-major): row i is ids[i] when ids is not null (Embed),
// else lo+i (a chunk of a matrix for sgemm). Bit-exact with
// kernels.Matrix.Row. Launch: one thread per output element for the float
// types, per 8 elements (bk_dequant_slots) for the block formats.
extern "C" __global__ void bk_dequant_rows(float* dst, const uint8_t* w, int64_t dt, int64_t cols, const int32_t* ids,
                                           int64_t lo, int64_t nrows) {
  switch (dt) {
#define BK_DEQUANT_CASE(DT)                                  \
  case DT:                                                   \
    bk_dequant_slots<DT>(dst, w, cols, ids, lo, nrows); \
    return;
    BK_QUANT_CASES(BK_DEQUANT_CASE)
#undef BK_DEQUANT_CASE
  }
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
