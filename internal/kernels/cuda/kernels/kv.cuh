// kv.cuh: the paged KV pool on the device (kernels.PagedKV's layout).
//
// Page p holds, for every layer l, a K block then a V block, each
// [ps][rf] elements (rf = KVHeads*HeadDim) of the pool's dtype: f32, f16,
// bf16 or fp8 e4m3 (BK_F32, BK_F16, BK_BF16, BK_E4M3). pe is one page in
// elements.
#pragma once
#include "common.cuh"
#include "elementwise.cuh"

__device__ __forceinline__ int64_t bk_k_off(int64_t page, int64_t layer, int64_t slot, int64_t ps, int64_t pe, int64_t rf) {
  return page * pe + (layer * 2 * ps + slot) * rf;
}

// bk_kv_put stores v at element off of a pool of dtype dt, rounded to
// nearest even for a narrower pool (kernels.PagedKV.StoreRow).
__device__ __forceinline__ void bk_kv_put(void* kv, int64_t off, float v, int64_t dt) {
  if (dt == BK_F32) {
    static_cast<float*>(kv)[off] = v;
  } else if (dt == BK_F16) {
    static_cast<uint16_t*>(kv)[off] = bk_f2h(v);
  } else if (dt == BK_BF16) {
    static_cast<uint16_t*>(kv)[off] = bk_f2bf(v);
  } else {
    static_cast<uint8_t*>(kv)[off] = bk_f2e4m3(v);
  }
}

// bk_store_kv writes n rows of k and v into the pool at slots
// (slot = page*ps + offset) of one layer, rounded to nearest even for a
// half-width pool (kernels.PagedKV.StoreRow). Launch: one thread per
// element.
extern "C" __global__ void bk_store_kv(void* kv, const int32_t* slots, const float* k, const float* v, int64_t n,
                                       int64_t layer, int64_t ps, int64_t pe, int64_t rf, int64_t dt) {
  const int64_t total = n * rf;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / rf, j = e % rf;
    const int64_t s = slots[i];
    const int64_t ko = bk_k_off(s / ps, layer, s % ps, ps, pe, rf) + j;
    bk_kv_put(kv, ko, k[e], dt);
    bk_kv_put(kv, ko + ps * rf, v[e], dt);
  }
}

// bk_rope_store_kv is bk_rope over q and over k followed by bk_store_kv of
// k and v, in one launch (kernels.RoPEStoreKV): each rotated pair of k is
// written to the pool by the thread that rotated it. Threads cover, in
// order, q's (token, pair, head) triples, k's, then every element of v
// (with k's dimensions past the rotated ones, stored as they are).
extern "C" __global__ void bk_rope_store_kv(float* q, float* k, const float* v, const int32_t* pos, int64_t ntok,
                                            int64_t heads, int64_t kvHeads, int64_t hd, int64_t half, int64_t neox,
                                            double posScale, const double* freq, void* kv, const int32_t* slots,
                                            int64_t layer, int64_t ps, int64_t pe, int64_t dt) {
  const int64_t rf = kvHeads * hd;
  const int64_t nq = ntok * half * heads, nk = ntok * half * kvHeads, total = nq + nk + ntok * rf;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    if (e < nq + nk) {
      const bool isK = e >= nq;
      const int64_t f = isK ? e - nq : e, nh = isK ? kvHeads : heads;
      const int64_t h = f % nh, i = f / nh % half, t = f / nh / half;
      double s, c;
      sincos((double)pos[t] * posScale * freq[i], &s, &c);
      float* row = (isK ? k : q) + (t * nh + h) * hd;
      int64_t a, b;
      bk_rope_pair(row, i, half, neox, s, c, a, b);
      if (isK) {
        const int64_t sl = slots[t], ko = bk_k_off(sl / ps, layer, sl % ps, ps, pe, rf) + h * hd;
        bk_kv_put(kv, ko + a, row[a], dt);
        bk_kv_put(kv, ko + b, row[b], dt);
      }
    } else {
      const int64_t f = e - nq - nk, t = f / rf, j = f % rf;
      const int64_t sl = slots[t], ko = bk_k_off(sl / ps, layer, sl % ps, ps, pe, rf) + j;
      bk_kv_put(kv, ko + ps * rf, v[f], dt);
      if (j % hd >= 2 * half) bk_kv_put(kv, ko, k[f], dt);
    }
  }
}

// bk_page_pack copies the first tokens slots of a page, for every layer
// its K rows then its V rows, to dst: internal/transfer.Pack's layout
// (little-endian elements on the host). bk_page_unpack is the inverse.
// They move 2-byte units, so one kernel serves every dtype: eu is the
// units of an element (2 for f32, 1 for f16 and bf16); an fp8 pool comes
// as a pool of half the elements a row and a page, each one unit (an
// even head dim makes both whole). Launch: one thread per unit of
// layers*2*tokens*rf*eu.
extern "C" __global__ void bk_page_pack(uint16_t* dst, const uint16_t* kv, int64_t page, int64_t tokens, int64_t layers,
                                        int64_t ps, int64_t pe, int64_t rf, int64_t eu) {
  const int64_t blk = tokens * rf * eu, total = layers * 2 * blk;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t lk = e / blk, j = e % blk;  // lk = layer*2 + (0 for K, 1 for V)
    dst[e] = kv[(page * pe + lk * ps * rf) * eu + j];
  }
}

extern "C" __global__ void bk_page_unpack(uint16_t* kv, const uint16_t* src, int64_t page, int64_t tokens, int64_t layers,
                                          int64_t ps, int64_t pe, int64_t rf, int64_t eu) {
  const int64_t blk = tokens * rf * eu, total = layers * 2 * blk;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t lk = e / blk, j = e % blk;
    kv[(page * pe + lk * ps * rf) * eu + j] = src[e];
  }
}

// bk_sum_term is kernels.SumTerm: splitmix64's finaliser of i<<16 | u.
__device__ __forceinline__ unsigned long long bk_sum_term(int64_t i, uint16_t u) {
  unsigned long long x = ((unsigned long long)i << 16) | u;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// bk_page_sum adds to out[b] the sum of bk_sum_term over the 2-byte units
// of page pages[b]'s first tokens[b] slots in packed order (bk_page_pack's
// layout), i the unit's index there: kernels.PageSum without its unit
// count term, which the host adds. Sums wrap mod 2^64 and do not depend on
// the order of the terms, so blocks combine by atomics. Launch: grid
// (x, pages), blockDim a multiple of 32 (at most 1024); out zeroed first.
extern "C" __global__ void bk_page_sum(unsigned long long* out, const uint16_t* kv, const int32_t* pages,
                                       const int32_t* tokens, int64_t layers, int64_t ps, int64_t pe, int64_t rf,
                                       int64_t eu) {
  __shared__ unsigned long long part[32];
  const int b = blockIdx.y;
  const int64_t page = pages[b], blk = (int64_t)tokens[b] * rf * eu, total = layers * 2 * blk;
  unsigned long long acc = 0;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t lk = e / blk, j = e % blk;
    acc += bk_sum_term(e, kv[(page * pe + lk * ps * rf) * eu + j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long s = 0;
    for (unsigned w = 0; w < blockDim.x / 32; w++) s += part[w];
#ifdef BK_EMU
    out[b] += s;  // the emulation's fibers run one at a time
#else
    atomicAdd(&out[b], s);
#endif
  }
}
