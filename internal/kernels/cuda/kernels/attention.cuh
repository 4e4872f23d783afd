// attention.cuh: paged attention for decode steps and prefill chunks
// (kernels.AttnSeq with QLen >= 1), grouped-query heads, causal, over KV
// stored as f32, f16 or bf16. Prompt chunks of at least 16 rows over f16
// or bf16 KV at head dims 64 and 128 go to the tensor cores instead
// (attn_mma.cuh); this file serves the rest.
//
// The host cuts the work into items: one sequence, one KV head, and up to
// BK_ATTN_MAX_MEMBERS (query row, query head) members that share them (a
// GQA group of one row, or for prefill several rows of a small group), so
// every K/V row read serves all members. An item reads positions
// [0, len) with len = 1 + the last member's causal limit; blockIdx.y
// splits that range into gridDim.y parts (flash-decoding: the host picks
// the split from the SM count and the number of items, so one short
// sequence fills the GPU as well as a batch of long ones).
//
// Decode is bound by how fast K and V come in, so the loads are what the
// layout is built around:
//   - a group of L lanes reads one K (or V) row: each lane a 16-byte
//     vector (4 floats or 8 halves) at a time, neighbouring lanes
//     neighbouring vectors, so a row is one coalesced read (L = the row's
//     vectors rounded up to a power of two, at most 32; a warp holds 32/L
//     groups, each on its own positions);
//   - each group takes U (4, or 2 with 8 members) consecutive positions at once, all
//     their K rows loaded before any is used, so enough loads are in
//     flight to cover the memory latency;
//   - a row's dot product with every member's query (held in registers)
//     (in shared memory) is summed over the group's lanes with shuffles; the online softmax
//     (running max m, sum l) is kept per group and member, each lane
//     holding the output dimensions its vectors cover;
//   - at the end the groups of a warp merge through shuffles, the warps of
//     a block through shared memory, and the block writes either the
//     finished rows (one split) or (m, l, acc) for bk_attn_combine.
//
// Differences from ref: float32 scores, exp and sums (ref uses float64).
// NaN in K or V reaches the output as in ref (a poisoned read stays
// visible: merges multiply by a zero factor rather than skip, so a NaN
// survives them); a position past a member's limit is never read for it.
#pragma once
#include "common.cuh"

#define BK_ATTN_THREADS 128
#define BK_ATTN_WARPS (BK_ATTN_THREADS / 32)
#define BK_ATTN_MAX_MEMBERS 8
#define BK_ATTN_MAX_HD 256
#define BK_ATTN_LANE_DIMS 8    // output dimensions per lane: 256 / 32
#define BK_ATTN_ITEM_FIELDS 6  // int32: seq, kv head, first row, rows, first head, heads
#define BK_ATTN_SEQ_FIELDS 4   // int64: page-table offset, first q row, QLen, KVLen

// KV element types: the pool's dtype, BK_F32, BK_F16, BK_BF16 or BK_E4M3.
// vec is the elements of a lane's vector: 16 bytes of the wider types, 8
// of fp8 (so a lane's dimensions stay at most BK_ATTN_LANE_DIMS).
template <int KT>
struct bk_kv_elem {
  typedef uint16_t type;
  enum { vec = 8 };
};
template <>
struct bk_kv_elem<BK_F32> {
  typedef float type;
  enum { vec = 4 };
};
template <>
struct bk_kv_elem<BK_E4M3> {
  typedef uint8_t type;
  enum { vec = 8 };
};

template <int KT>
__device__ __forceinline__ float bk_kv_load1(const typename bk_kv_elem<KT>::type* p) {
  if (KT == BK_F32) return (float)p[0];
  if (KT == BK_F16) return bk_h2f((uint32_t)p[0]);
  if (KT == BK_E4M3) return bk_e4m32f((uint32_t)p[0]);
  return bk_bf2f((uint32_t)p[0]);
}

// bk_kv_vec loads the elements [j, j+vec) of a row into d (zeros past hd).
// vec16: the row is aligned to the vector's bytes and hd a multiple of
// vec, so the vector is one load (or wholly past the row).
template <int KT>
__device__ __forceinline__ void bk_kv_vec(float* d, const typename bk_kv_elem<KT>::type* row, int64_t j, int64_t hd,
                                          bool vec16) {
  const int V = bk_kv_elem<KT>::vec;
  if (vec16) {
    if (j >= hd) {
#pragma unroll
      for (int e = 0; e < V; e++) d[e] = 0.f;
      return;
    }
    if (KT == BK_F32) {
      const float4 f = *reinterpret_cast<const float4*>(row + j);
      d[0] = f.x;
      d[1] = f.y;
      d[2] = f.z;
      d[3] = f.w;
    } else if (KT == BK_E4M3) {
      const uint2 u = *reinterpret_cast<const uint2*>(row + j);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        d[e] = bk_e4m32f((u.x >> (8 * e)) & 0xffu);
        d[4 + e] = bk_e4m32f((u.y >> (8 * e)) & 0xffu);
      }
    } else {
      const uint4 u = *reinterpret_cast<const uint4*>(row + j);
      const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int e = 0; e < 4; e++) {
        if (KT == BK_F16) {
          d[2 * e] = bk_h2f(w[e] & 0xffff);
          d[2 * e + 1] = bk_h2f(w[e] >> 16);
        } else {
          d[2 * e] = bk_bf2f(w[e] & 0xffff);
          d[2 * e + 1] = bk_bf2f(w[e] >> 16);
        }
      }
    }
    return;
  }
#pragma unroll
  for (int e = 0; e < V; e++) d[e] = j + e < hd ? bk_kv_load1<KT>(row + j + e) : 0.f;
}

// bk_attn_merge folds (mo, lo, ao) into (m, l, a): the softmax state of
// two disjoint position ranges. A side with no position (m = -inf)
// contributes through a zero factor, so a NaN it carries still shows.
__device__ __forceinline__ float bk_attn_factor(float m, float mx) { return m == BK_NEG_INF ? 0.f : expf(m - mx); }

// Launch: grid (items, splits), block BK_ATTN_THREADS, dynamic shared
// memory (BK_ATTN_WARPS * BK_ATTN_MAX_MEMBERS * (hd + 2) + BK_ATTN_MAX_MEMBERS * hd)
// floats. q is [nrows][heads][hd]
// (rows of all sequences, in sequence order); with one split the block
// writes out ([nrows][heads][hd]), else part ([splits][nrows][heads][hd+2]).
// pe is one page's elements (layers * 2 * ps * rf); lanes is L.
template <int KT, int NV, int MM>
__device__ void bk_attn_body(float* out, float* part, const float* q, const typename bk_kv_elem<KT>::type* kv,
                             const int32_t* pages, const int64_t* seqs, const int32_t* items, int64_t nrows,
                             int64_t heads, int64_t hd, int64_t ps, int64_t pe, int64_t rf, int64_t layer, float scale,
                             int lanes, bool vec16) {
  typedef typename bk_kv_elem<KT>::type T;
  const int V = bk_kv_elem<KT>::vec;
  const int D = NV * V;  // dimensions per lane (<= BK_ATTN_LANE_DIMS)
  // Positions per group at once: as many as the registers allow.
  const int U = MM > 4 ? 2 : 4;
  BK_DYN_SMEM(float, smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane % lanes;          // lane within its row group
  const int rpw = 32 / lanes;          // row groups per warp
  const int grp = warp * rpw + lane / lanes;  // row group within the block
  const int ngrp = BK_ATTN_WARPS * rpw;

  const int32_t* it = items + (int64_t)blockIdx.x * BK_ATTN_ITEM_FIELDS;
  const int64_t si = it[0], kh = it[1], r0 = it[2];
  const int rn = it[3], h0 = it[4], hn = it[5];
  const int M = rn * hn;
  const int64_t* sd = seqs + si * BK_ATTN_SEQ_FIELDS;
  const int64_t pageOff = sd[0], rowStart = sd[1], qlen = sd[2], kvlen = sd[3];
  const int64_t base = kvlen - qlen;   // position of the sequence's first query row
  const int64_t len = base + r0 + rn;  // positions [0, len) are read
  const int64_t nsplit = gridDim.y, split = blockIdx.y;
  const int64_t chunk = (len + nsplit - 1) / nsplit;
  const int64_t p0 = bk_min64(len, split * chunk), p1 = bk_min64(len, p0 + chunk);

  // The members' query rows, scaled, in shared memory ([member][hd],
  // before the warps' merge area): registers hold the running sums.
  float* qs = smem + (int64_t)BK_ATTN_WARPS * BK_ATTN_MAX_MEMBERS * (hd + 2);
  for (int64_t e = tid; e < (int64_t)M * hd; e += BK_ATTN_THREADS) {
    const int mm = (int)(e / hd);
    const int64_t row = rowStart + r0 + mm / hn, h = h0 + mm % hn;
    qs[e] = q[(row * heads + h) * hd + e % hd];
  }
  // Dimension d of this lane is j(d) = (v*lanes + g)*V + d%V, v = d/V.
  float acc[MM][D];
  float m[MM], l[MM];
#pragma unroll
  for (int mm = 0; mm < MM; mm++) {
    m[mm] = BK_NEG_INF;
    l[mm] = 0.f;
#pragma unroll
    for (int d = 0; d < D; d++) acc[mm][d] = 0.f;
  }
  __syncthreads();

  // K row of (page, slot): kvl + page*pe + slot*rf; its V row is ps*rf further.
  const T* kvl = kv + layer * 2 * ps * rf + kh * hd;
  for (int64_t t0 = p0; t0 < p1; t0 += (int64_t)ngrp * U) {
    const int64_t pg = t0 + (int64_t)grp * U;  // this group's first position
    float kd[U][D];
    const T* rows[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int64_t p = pg + u;
      rows[u] = p < p1 ? kvl + (int64_t)pages[pageOff + p / ps] * pe + (p % ps) * rf : nullptr;
#pragma unroll
      for (int v = 0; v < NV; v++) {
        if (rows[u]) {
          bk_kv_vec<KT>(&kd[u][v * V], rows[u], (int64_t)(v * lanes + g) * V, hd, vec16);
        } else {
#pragma unroll
          for (int e = 0; e < V; e++) kd[u][v * V + e] = 0.f;
        }
      }
    }
    // Scores, summed over the group's lanes (every lane of the warp takes
    // part in the shuffles, whatever its positions).
    float s[MM][U];
#pragma unroll
    for (int mm = 0; mm < MM; mm++) {
      if (mm < M) {
        float qv[D];
#pragma unroll
        for (int d = 0; d < D; d++) {
          const int64_t j = (int64_t)((d / V) * lanes + g) * V + d % V;
          qv[d] = j < hd ? qs[mm * hd + j] : 0.f;
        }
        const int64_t lim = base + r0 + mm / hn;  // the member's causal limit (inclusive)
#pragma unroll
        for (int u = 0; u < U; u++) {
          float dot = 0.f;
#pragma unroll
          for (int d = 0; d < D; d++) dot += qv[d] * kd[u][d];
          for (int o = 1; o < lanes; o <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
          s[mm][u] = rows[u] && pg + u <= lim ? dot * scale : BK_NEG_INF;
        }
      }
    }
    // V rows, loaded once for every member.
#pragma unroll
    for (int u = 0; u < U; u++) {
#pragma unroll
      for (int v = 0; v < NV; v++) {
        if (rows[u]) {
          bk_kv_vec<KT>(&kd[u][v * V], rows[u] + ps * rf, (int64_t)(v * lanes + g) * V, hd, vec16);
        }
      }
    }
#pragma unroll
    for (int mm = 0; mm < MM; mm++) {
      if (mm < M) {
        const int64_t lim = base + r0 + mm / hn;
        float mx = m[mm];
#pragma unroll
        for (int u = 0; u < U; u++) mx = fmaxf(mx, s[mm][u]);
        const float f = bk_attn_factor(m[mm], mx);
        l[mm] *= f;
#pragma unroll
        for (int d = 0; d < D; d++) acc[mm][d] *= f;
#pragma unroll
        for (int u = 0; u < U; u++) {
          if (rows[u] && pg + u <= lim) {
            const float e = s[mm][u] == BK_NEG_INF ? 0.f : expf(s[mm][u] - mx);  // a NaN score stays NaN
            l[mm] += e;
#pragma unroll
            for (int d = 0; d < D; d++) acc[mm][d] += e * kd[u][d];
          }
        }
        m[mm] = mx;
      }
    }
  }

  // Merge the row groups of each warp: lanes g of every group hold the
  // same dimensions.
  for (int o = lanes; o < 32; o <<= 1) {
#pragma unroll
    for (int mm = 0; mm < MM; mm++) {
      if (mm < M) {
        const float mo = __shfl_xor_sync(0xffffffffu, m[mm], o);
        const float lo = __shfl_xor_sync(0xffffffffu, l[mm], o);
        const float mx = fmaxf(m[mm], mo);
        const float fa = bk_attn_factor(m[mm], mx), fb = bk_attn_factor(mo, mx);
        l[mm] = l[mm] * fa + lo * fb;
#pragma unroll
        for (int d = 0; d < D; d++) {
          const float ao = __shfl_xor_sync(0xffffffffu, acc[mm][d], o);
          acc[mm][d] = acc[mm][d] * fa + ao * fb;
        }
        m[mm] = mx;
      }
    }
  }
  // Then the warps, through shared memory: [warp][member][m, l, acc[hd]].
  const int64_t stride = hd + 2;
  if (lane < lanes) {
#pragma unroll
    for (int mm = 0; mm < MM; mm++) {
      if (mm < M) {
        float* w = smem + ((int64_t)warp * M + mm) * stride;
        if (lane == 0) {
          w[0] = m[mm];
          w[1] = l[mm];
        }
#pragma unroll
        for (int d = 0; d < D; d++) {
          const int64_t j = (int64_t)((d / V) * lanes + g) * V + d % V;
          if (j < hd) w[2 + j] = acc[mm][d];
        }
      }
    }
  }
  __syncthreads();
  for (int64_t e = tid; e < (int64_t)M * (hd + 1); e += BK_ATTN_THREADS) {
    const int mm = (int)(e / (hd + 1));
    const int64_t j = e % (hd + 1) - 1;  // -1: the statistics
    float mx = BK_NEG_INF;
    for (int w = 0; w < BK_ATTN_WARPS; w++) mx = fmaxf(mx, smem[((int64_t)w * M + mm) * stride]);
    float lt = 0.f, a = 0.f;
    for (int w = 0; w < BK_ATTN_WARPS; w++) {
      const float* src = smem + ((int64_t)w * M + mm) * stride;
      const float f = bk_attn_factor(src[0], mx);
      lt += src[1] * f;
      if (j >= 0) a += src[2 + j] * f;
    }
    const int64_t row = rowStart + r0 + mm / hn, h = h0 + mm % hn;
    if (nsplit == 1) {
      if (j >= 0) out[(row * heads + h) * hd + j] = a / lt;
    } else {
      float* o = part + ((split * nrows + row) * heads + h) * (hd + 2);
      if (j < 0) {
        o[0] = mx;
        o[1] = lt;
      } else {
        o[2 + j] = a;
      }
    }
  }
}

template <int KT, int MM>
__device__ void bk_attn(float* out, float* part, const float* q, const typename bk_kv_elem<KT>::type* kv,
                        const int32_t* pages, const int64_t* seqs, const int32_t* items, int64_t nrows, int64_t heads,
                        int64_t hd, int64_t ps, int64_t pe, int64_t rf, int64_t layer, float scale, int64_t lanes,
                        int64_t vec16) {
  // Vectors per lane: two only for f32 rows of more than 128 dimensions.
  if ((int64_t)lanes * bk_kv_elem<KT>::vec < hd) {
    bk_attn_body<KT, 2, MM>(out, part, q, kv, pages, seqs, items, nrows, heads, hd, ps, pe, rf, layer, scale,
                            (int)lanes, vec16 != 0);
  } else {
    bk_attn_body<KT, 1, MM>(out, part, q, kv, pages, seqs, items, nrows, heads, hd, ps, pe, rf, layer, scale,
                            (int)lanes, vec16 != 0);
  }
}

// One kernel per KV dtype and member bound (4 or 8 members an item): the
// registers a thread needs grow with both, and a kernel is given the
// registers of its largest path.
#define BK_ATTN_KERNEL(name, KT, MM)                                                                                  \
  extern "C" __global__ void __launch_bounds__(BK_ATTN_THREADS)                                                      \
      name(float* out, float* part, const float* q, const bk_kv_elem<KT>::type* kv, const int32_t* pages,           \
           const int64_t* seqs, const int32_t* items, int64_t nrows, int64_t heads, int64_t hd, int64_t ps, int64_t pe, \
           int64_t rf, int64_t layer, float scale, int64_t lanes, int64_t vec16) {                                   \
    bk_attn<KT, MM>(out, part, q, kv, pages, seqs, items, nrows, heads, hd, ps, pe, rf, layer, scale, lanes, vec16); \
  }

BK_ATTN_KERNEL(bk_attn_f32_m4, BK_F32, 4)
BK_ATTN_KERNEL(bk_attn_f16_m4, BK_F16, 4)
BK_ATTN_KERNEL(bk_attn_bf16_m4, BK_BF16, 4)
BK_ATTN_KERNEL(bk_attn_f32_m8, BK_F32, 8)
BK_ATTN_KERNEL(bk_attn_f16_m8, BK_F16, 8)
BK_ATTN_KERNEL(bk_attn_bf16_m8, BK_BF16, 8)
BK_ATTN_KERNEL(bk_attn_e4m3_m4, BK_E4M3, 4)
BK_ATTN_KERNEL(bk_attn_e4m3_m8, BK_E4M3, 8)

// bk_attn_combine merges the splits of each (row, head): out = Σ acc·e^(m-M)
// / Σ l·e^(m-M), a split with no position weighing zero. Launch: grid
// nrows*heads, block a multiple of 32.
extern "C" __global__ void bk_attn_combine(float* out, const float* part, int64_t nrh, int64_t hd, int64_t nsplit) {
  const int64_t rh = blockIdx.x;
  if (rh >= nrh) return;
  const int64_t stride = nrh * (hd + 2);
  const float* p = part + rh * (hd + 2);
  float mx = BK_NEG_INF;
  for (int64_t s = 0; s < nsplit; s++) mx = fmaxf(mx, p[s * stride]);
  float l = 0.f;
  for (int64_t s = 0; s < nsplit; s++) l += p[s * stride + 1] * bk_attn_factor(p[s * stride], mx);
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0.f;
    for (int64_t s = 0; s < nsplit; s++) o += p[s * stride + 2 + j] * bk_attn_factor(p[s * stride], mx);
    out[rh * hd + j] = o / l;
  }
}
