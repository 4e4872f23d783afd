// elementwise.cuh: RMSNorm (alone or after a residual add), RoPE (alone
// or with the KV store it precedes), SwiGLU and Add.
//
// These are cheap next to the products, so they use the reference's
// float64 arithmetic where the reference does (RMSNorm's sum and scale,
// RoPE's angles and rotation, SwiGLU's sigmoid) and agree with it to about
// one float32 rounding.
#pragma once
#include "common.cuh"

// bk_rms_row normalises one row with one block: out = x / rms(x) * w. When
// delta is not null it first adds it into x (x += delta, stored), so a
// residual add and the next norm read the row once: the model's
// Add then RMSNorm, fused, with the same float32 sum and float64 scale.
// The normalised row stays float32 (the reference's), and hrow gets its
// rounded copy (bk_half_out).
__device__ __forceinline__ void bk_rms_row(float* orow, float* xr, const float* dr, const float* w, int64_t d, float eps,
                                           uint16_t* hrow, int64_t hkind) {
  __shared__ double red[32];
  double ss = 0;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float xv = xr[j];
    if (dr) {
      xv = xv + dr[j];
      xr[j] = xv;
    }
    const double v = xv;
    ss += v * v;
  }
  ss = bk_warp_sum_d(ss);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nwarps = blockDim.x / 32;
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    double t = lane < nwarps ? red[lane] : 0.0;
    t = bk_warp_sum_d(t);
    if (lane == 0) red[0] = t;
  }
  __syncthreads();
  const double scale = 1.0 / sqrt(red[0] / (double)d + (double)eps);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float o = (float)((double)xr[j] * scale) * w[j];
    orow[j] = o;
    bk_half_out(hrow, hkind, j, o);
  }
}

// bk_rmsnorm: out[i, :] = x[i, :] / rms(x[i, :]) * w for n rows of d, and
// half[i, :] its rounded copy by half_kind (bk_half_out).
// Launch: grid n, block a multiple of 32 (<= 1024).
extern "C" __global__ void bk_rmsnorm(float* out, const float* x, const float* w, int64_t n, int64_t d, float eps,
                                      uint16_t* half, int64_t half_kind) {
  const int64_t row = blockIdx.x;
  if (row >= n) return;  // uniform over the block
  bk_rms_row(out + row * d, const_cast<float*>(x) + row * d, nullptr, w, d, eps, half ? half + row * d : nullptr, half_kind);
}

// bk_add_rmsnorm: x[i, :] += delta[i, :], then out[i, :] = x[i, :] /
// rms(x[i, :]) * w (kernels.AddRMSNorm), half as bk_rmsnorm's. Launch as
// bk_rmsnorm.
extern "C" __global__ void bk_add_rmsnorm(float* out, float* x, const float* delta, const float* w, int64_t n, int64_t d,
                                          float eps, uint16_t* half, int64_t half_kind) {
  const int64_t row = blockIdx.x;
  if (row >= n) return;
  bk_rms_row(out + row * d, x + row * d, delta + row * d, w, d, eps, half ? half + row * d : nullptr, half_kind);
}

// bk_rope_pair rotates pair i of one head's row v by the angle whose sine
// and cosine are s and c; a and b are the pair's dimensions.
__device__ __forceinline__ void bk_rope_pair(float* v, int64_t i, int64_t half, int64_t neox, double s, double c,
                                             int64_t& a, int64_t& b) {
  a = neox ? i : 2 * i;
  b = neox ? i + half : 2 * i + 1;
  const double x0 = v[a], x1 = v[b];
  v[a] = (float)(x0 * c - x1 * s);
  v[b] = (float)(x0 * s + x1 * c);
}

// bk_rope rotates x in place: ntok rows of heads*hd; pairs (2i, 2i+1), or
// (i, i+half) for NeoX, for i < half. freq[i] is the reference's
// frequency (theta^(-2i/dim), divided by the llama3 factor), computed by
// the host in float64. Launch: one thread per (token, pair, head), so a
// single token still spreads over heads*half threads.
extern "C" __global__ void bk_rope(float* x, const int32_t* pos, int64_t ntok, int64_t heads, int64_t hd, int64_t half,
                                   int64_t neox, double posScale, const double* freq) {
  const int64_t total = ntok * half * heads;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t h = e % heads, i = e / heads % half, t = e / heads / half;
    double s, c;
    sincos((double)pos[t] * posScale * freq[i], &s, &c);
    int64_t a, b;
    bk_rope_pair(x + (t * heads + h) * hd, i, half, neox, s, c, a, b);
  }
}

// bk_swiglu: out[i] = silu(gate[i]) * up[i], the sigmoid in float64 as ref,
// and half[i] its rounded copy by half_kind (bk_half_out).
extern "C" __global__ void bk_swiglu(float* out, const float* gate, const float* up, int64_t n, uint16_t* half,
                                     int64_t half_kind) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const double g = gate[i];
    const float o = (float)(g / (1.0 + exp(-g))) * up[i];
    out[i] = o;
    bk_half_out(half, half_kind, i, o);
  }
}

// bk_add: out[i] = a[i] + b[i] (exact).
extern "C" __global__ void bk_add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = a[i] + b[i];
  }
}

// bk_gather_rows: dst row i = src row rows[i], each width floats
// (kernels.RowGatherer). Launch: one thread per element of dst.
extern "C" __global__ void bk_gather_rows(float* dst, const float* src, const int32_t* rows, int64_t n, int64_t width) {
  const int64_t total = n * width;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    dst[e] = src[(int64_t)rows[e / width] * width + e % width];
  }
}
