// moe.cuh: a mixture-of-experts FFN over the rows of a step (the
// backend's Experts, internal/kernels/cuda/moe.go), without the rows
// leaving the device.
//
// The host routes (pick, weight: n*k numbers) and lays out the slots: the
// n*k (row, expert) pairs ordered by expert, so that each expert's rows are
// one contiguous segment. Then:
//   - bk_moe_gather copies each slot's row of x into the gathered buffer;
//   - bk_moe_gemv runs one product (gate, up or down) of every segment of
//     up to BK_GEMV_MAXN rows in one launch, each block reading its
//     segment's weights through the device table (longer segments go to
//     cuBLAS, one product per expert, from the host);
//   - bk_swiglu (elementwise.cuh) runs over all slots at once;
//   - bk_moe_scatter sums each row's k weighted outputs, in pick order.
// The products are bk_gemv_row, so a segment's numbers are those of the
// backend's MatMul over the same rows; nothing is accumulated with
// atomics, so the result does not depend on scheduling.
#pragma once
#include "common.cuh"
#include "gemv.cuh"

// A segment of the table: BK_MOE_SEG_FIELDS int64s, the first slot and
// the slot count (1..BK_GEMV_MAXN), then a (weight pointer, dtype) pair for
// each of the gate, up and down products.
#define BK_MOE_SEG_FIELDS 8

// bk_moe_gather: dst[s, :] = x[row[s], :] for the nslots slots, rows of d.
// Launch: one thread per element (grid-stride).
extern "C" __global__ void bk_moe_gather(float* dst, const float* x, const int32_t* row, int64_t nslots, int64_t d) {
  const int64_t total = nslots * d;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t s = e / d, c = e % d;
    dst[e] = x[(int64_t)row[s] * d + c];
  }
}

// bk_moe_gemv_dt is the one place a weight format of the grouped products
// is chosen: a format bk_gemv_row learns is one more case here. A dtype
// without a case writes NaN, so that a format the backend takes but this
// switch lacks fails every test of it rather than leaving stale numbers.
__device__ __forceinline__ void bk_moe_gemv_dt(int dt, int n, float* __restrict__ out, const float* __restrict__ x,
                                               const uint8_t* __restrict__ w, int64_t rows, int64_t cols, int64_t r,
                                               int lane) {
  const uint8_t* wrow = w + r * bk_row_bytes(dt, cols);
  switch (dt) {
    case BK_F32: bk_gemv_row_n<BK_F32>(n, out, x, wrow, rows, cols, r, lane); break;
    case BK_F16: bk_gemv_row_n<BK_F16>(n, out, x, wrow, rows, cols, r, lane); break;
    case BK_BF16: bk_gemv_row_n<BK_BF16>(n, out, x, wrow, rows, cols, r, lane); break;
#define BK_MOE_CASE(DT) \
  case DT: bk_gemv_row_n<DT>(n, out, x, wrow, rows, cols, r, lane); break;
    BK_QUANT_CASES(BK_MOE_CASE)
#undef BK_MOE_CASE
    default:
      if (lane == 0) {
        for (int i = 0; i < n; i++) out[i * rows + r] = __uint_as_float(0x7fc00000u);
      }
      break;
  }
}

// bk_moe_gemv: for every segment g of the table, out[slots of g, rows] =
// x[slots of g, cols] · wᵀ with w the segment's weights of product which
// (0 gate, 1 up, 2 down). x and out are the gathered buffers (slot rows of
// cols and of rows). Launch: grid (ceil(rows / BK_GEMV_WARPS), segments),
// block 32 * BK_GEMV_WARPS; one warp per weight row, as bk_gemv.
extern "C" __global__ void __launch_bounds__(32 * BK_GEMV_WARPS)
bk_moe_gemv(float* out, const float* x, const int64_t* seg, int64_t which, int64_t rows, int64_t cols) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = (int64_t)blockIdx.x * BK_GEMV_WARPS + warp;
  if (r >= rows) return;  // the whole warp leaves together
  const int64_t* g = seg + (int64_t)blockIdx.y * BK_MOE_SEG_FIELDS;
  const int64_t first = g[0];
  const int n = (int)g[1];
  const uint8_t* w = reinterpret_cast<const uint8_t*>(g[2 + 2 * which]);
  const int dt = (int)g[3 + 2 * which];
  bk_moe_gemv_dt(dt, n, out + first * rows, x + first * cols, w, rows, cols, r, lane);
}

// bk_moe_scatter: out[i, :] = Σ_j weight[i*k+j] · y[slot[i*k+j], :] for
// j = 0..k-1 in that order (each element summed by one thread: the same
// order whatever the schedule), n rows of d. Launch: one thread per
// element (grid-stride).
extern "C" __global__ void bk_moe_scatter(float* out, const float* y, const int32_t* slot, const float* weight,
                                          int64_t n, int64_t k, int64_t d) {
  const int64_t total = n * d;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / d, c = e % d;
    float acc = 0.f;
    for (int64_t j = 0; j < k; j++) acc += weight[i * k + j] * y[(int64_t)slot[i * k + j] * d + c];
    out[e] = acc;
  }
}
