// attention.cuh: paged attention for decode steps and prefill chunks
// (kernels.AttnSeq with QLen >= 1), grouped-query heads, causal.
//
// The host cuts the work into items: one sequence, one KV head, and up to
// BK_ATTN_MAX_MEMBERS (query row, query head) members that share them (a
// GQA group of one row, or for prefill several rows of a small group), so
// every K/V row read serves all members. An item reads positions
// [0, len) with len = 1 + the last member's causal limit; blockIdx.y
// splits that range into gridDim.y parts (split-K, so a few long
// sequences still fill the GPU). Each block walks its part in tiles of
// BK_ATTN_TILE positions with an online softmax:
//   1. one thread per position computes q·k·scale for every member
//      (positions past a member's limit are -inf);
//   2. one warp per member takes the tile's max, rescales the running sum
//      and turns scores into exp(s - m);
//   3. each thread owns output dimensions j = tid, tid+128 and adds
//      e·v over the tile (V rows are read coalesced).
// It writes (m, l, acc[hd]) per member and split; bk_attn_combine merges
// the splits and divides by the sum.
//
// Differences from ref: float32 scores, exp and sums (ref uses float64).
// NaN in K or V reaches the output as in ref (a poisoned read stays
// visible); a position past a member's limit is never read for it.
#pragma once
#include "common.cuh"

#define BK_ATTN_THREADS 128
#define BK_ATTN_MAX_MEMBERS 8
#define BK_ATTN_TILE BK_ATTN_THREADS
#define BK_ATTN_JC 2  // output dimensions per thread: head dim <= 256
#define BK_ATTN_MAX_HD (BK_ATTN_JC * BK_ATTN_THREADS)
#define BK_ATTN_ITEM_FIELDS 6  // int32: seq, kv head, first row, rows, first head, heads
#define BK_ATTN_SEQ_FIELDS 4   // int64: page-table offset, first q row, QLen, KVLen

// Shared memory (floats): q[8][hd], scores[8][TILE], fac[8], m[8], l[8].
// The host sizes it as (8*hd + 8*TILE + 24) * 4 bytes.

// Launch: grid (items, splits), block BK_ATTN_THREADS. q is [nrows][heads][hd]
// (rows of all sequences, in sequence order); part is
// [splits][nrows][heads][hd + 2].
extern "C" __global__ void __launch_bounds__(BK_ATTN_THREADS)
bk_attention(float* part, const float* q, const float* kv, const int32_t* pages, const int64_t* seqs,
             const int32_t* items, int64_t nrows, int64_t heads, int64_t hd, int64_t ps, int64_t pf, int64_t rf,
             int64_t layer, float scale) {
  BK_DYN_SMEM(float, smem);
  const int tid = threadIdx.x;
  const int32_t* it = items + (int64_t)blockIdx.x * BK_ATTN_ITEM_FIELDS;
  const int64_t si = it[0], kh = it[1], r0 = it[2];
  const int rn = it[3], h0 = it[4], hn = it[5];
  const int M = rn * hn;
  const int64_t* sd = seqs + si * BK_ATTN_SEQ_FIELDS;
  const int64_t pageOff = sd[0], rowStart = sd[1], qlen = sd[2], kvlen = sd[3];
  const int64_t base = kvlen - qlen;  // position of the sequence's first query row
  const int64_t len = base + r0 + rn;  // positions [0, len) are read
  const int64_t nsplit = gridDim.y, split = blockIdx.y;
  const int64_t chunk = (len + nsplit - 1) / nsplit;
  const int64_t p0 = bk_min64(len, split * chunk), p1 = bk_min64(len, p0 + chunk);

  float* qs = smem;
  float* sc = qs + BK_ATTN_MAX_MEMBERS * hd;
  float* fac = sc + BK_ATTN_MAX_MEMBERS * BK_ATTN_TILE;
  float* mrun = fac + BK_ATTN_MAX_MEMBERS;
  float* lrun = mrun + BK_ATTN_MAX_MEMBERS;

  for (int64_t e = tid; e < (int64_t)M * hd; e += BK_ATTN_THREADS) {
    const int mm = (int)(e / hd);
    const int64_t j = e % hd;
    const int64_t row = rowStart + r0 + mm / hn, h = h0 + mm % hn;
    qs[e] = q[(row * heads + h) * hd + j];
  }
  if (tid < BK_ATTN_MAX_MEMBERS) {
    mrun[tid] = BK_NEG_INF;
    lrun[tid] = 0.f;
    fac[tid] = 0.f;
  }
  int64_t last[BK_ATTN_MAX_MEMBERS];  // causal limit of each member (inclusive)
  float acc[BK_ATTN_MAX_MEMBERS][BK_ATTN_JC];
#pragma unroll
  for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
    last[mm] = mm < M ? base + r0 + mm / hn : -1;
#pragma unroll
    for (int c = 0; c < BK_ATTN_JC; c++) acc[mm][c] = 0.f;
  }
  __syncthreads();

  // K row of (page, slot): kvl + page*pf + slot*rf; its V row is ps*rf further.
  const float* kvl = kv + layer * 2 * ps * rf + kh * hd;
  const int warp = tid / 32, lane = tid % 32;

  for (int64_t t0 = p0; t0 < p1; t0 += BK_ATTN_TILE) {
    const int64_t tn = bk_min64(BK_ATTN_TILE, p1 - t0);

    // 1. Scores.
    if (tid < tn) {
      const int64_t p = t0 + tid;
      const float* kr = kvl + (int64_t)pages[pageOff + p / ps] * pf + (p % ps) * rf;
      float d[BK_ATTN_MAX_MEMBERS];
#pragma unroll
      for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) d[mm] = 0.f;
      if (hd % 4 == 0) {
        for (int64_t j = 0; j < hd; j += 4) {
          const float4 k4 = *reinterpret_cast<const float4*>(kr + j);
#pragma unroll
          for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
            if (mm < M) {
              const float* qm = qs + mm * hd + j;
              d[mm] += qm[0] * k4.x + qm[1] * k4.y + qm[2] * k4.z + qm[3] * k4.w;
            }
          }
        }
      } else {
        for (int64_t j = 0; j < hd; j++) {
          const float kj = kr[j];
#pragma unroll
          for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
            if (mm < M) d[mm] += qs[mm * hd + j] * kj;
          }
        }
      }
#pragma unroll
      for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
        if (mm < M) sc[mm * BK_ATTN_TILE + tid] = p <= last[mm] ? d[mm] * scale : BK_NEG_INF;
      }
    } else {
      for (int mm = 0; mm < M; mm++) sc[mm * BK_ATTN_TILE + tid] = BK_NEG_INF;
    }
    __syncthreads();

    // 2. Softmax statistics, one warp per member.
    for (int mm = warp; mm < M; mm += BK_ATTN_THREADS / 32) {
      float* s = sc + mm * BK_ATTN_TILE;
      float mx = BK_NEG_INF;
      for (int i = lane; i < BK_ATTN_TILE; i += 32) mx = fmaxf(mx, s[i]);
      mx = bk_warp_max(mx);
      const float mold = mrun[mm], mnew = fmaxf(mold, mx);
      float sum = 0.f;
      for (int i = lane; i < BK_ATTN_TILE; i += 32) {
        const float v = s[i];
        const float e = v == BK_NEG_INF ? 0.f : expf(v - mnew);  // a NaN score stays NaN
        s[i] = e;
        sum += e;
      }
      sum = bk_warp_sum(sum);
      if (lane == 0) {
        const float f = mold == BK_NEG_INF ? 0.f : expf(mold - mnew);
        fac[mm] = f;
        lrun[mm] = lrun[mm] * f + sum;
        mrun[mm] = mnew;
      }
    }
    __syncthreads();

    // 3. Weighted V rows.
#pragma unroll
    for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
      if (mm < M) {
        const float f = fac[mm];
#pragma unroll
        for (int c = 0; c < BK_ATTN_JC; c++) acc[mm][c] *= f;
      }
    }
    for (int64_t i = 0; i < tn; i++) {
      const int64_t p = t0 + i;
      const float* vr = kvl + (int64_t)pages[pageOff + p / ps] * pf + (ps + p % ps) * rf;
#pragma unroll
      for (int c = 0; c < BK_ATTN_JC; c++) {
        const int64_t j = tid + c * BK_ATTN_THREADS;
        if (j < hd) {
          const float vj = vr[j];
#pragma unroll
          for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
            if (mm < M && p <= last[mm]) acc[mm][c] += sc[mm * BK_ATTN_TILE + i] * vj;
          }
        }
      }
    }
    __syncthreads();  // the next tile overwrites the scores
  }

#pragma unroll
  for (int mm = 0; mm < BK_ATTN_MAX_MEMBERS; mm++) {
    if (mm < M) {
      const int64_t row = rowStart + r0 + mm / hn, h = h0 + mm % hn;
      float* o = part + ((split * nrows + row) * heads + h) * (hd + 2);
      if (tid == 0) {
        o[0] = mrun[mm];
        o[1] = lrun[mm];
      }
#pragma unroll
      for (int c = 0; c < BK_ATTN_JC; c++) {
        const int64_t j = tid + c * BK_ATTN_THREADS;
        if (j < hd) o[2 + j] = acc[mm][c];
      }
    }
  }
}

// bk_attn_combine merges the splits of each (row, head): out = Σ acc·e^(m-M)
// / Σ l·e^(m-M). Launch: grid nrows*heads, block a multiple of 32.
extern "C" __global__ void bk_attn_combine(float* out, const float* part, int64_t nrh, int64_t hd, int64_t nsplit) {
  const int64_t rh = blockIdx.x;
  if (rh >= nrh) return;
  const int64_t stride = nrh * (hd + 2);
  const float* p = part + rh * (hd + 2);
  float mx = BK_NEG_INF;
  for (int64_t s = 0; s < nsplit; s++) mx = fmaxf(mx, p[s * stride]);
  float l = 0.f;
  for (int64_t s = 0; s < nsplit; s++) {
    const float m = p[s * stride];
    if (m != BK_NEG_INF) l += p[s * stride + 1] * expf(m - mx);
  }
  for (int64_t j = threadIdx.x; j < hd; j += blockDim.x) {
    float o = 0.f;
    for (int64_t s = 0; s < nsplit; s++) {
      const float m = p[s * stride];
      if (m != BK_NEG_INF) o += p[s * stride + 2 + j] * expf(m - mx);
    }
    out[rh * hd + j] = o / l;
  }
}
