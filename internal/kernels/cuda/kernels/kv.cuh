// kv.cuh: the paged KV pool on the device (kernels.PagedKV's layout).
//
// Page p holds, for every layer l, a K block then a V block, each
// [ps][rf] float32 (rf = KVHeads*HeadDim); pf is one page in floats.
#pragma once
#include "common.cuh"

__device__ __forceinline__ int64_t bk_k_off(int64_t page, int64_t layer, int64_t slot, int64_t ps, int64_t pf, int64_t rf) {
  return page * pf + (layer * 2 * ps + slot) * rf;
}

// bk_store_kv writes n rows of k and v into the pool at slots
// (slot = page*ps + offset) of one layer. Launch: one thread per element.
extern "C" __global__ void bk_store_kv(float* kv, const int32_t* slots, const float* k, const float* v, int64_t n,
                                       int64_t layer, int64_t ps, int64_t pf, int64_t rf) {
  const int64_t total = n * rf;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = e / rf, j = e % rf;
    const int64_t s = slots[i];
    const int64_t ko = bk_k_off(s / ps, layer, s % ps, ps, pf, rf) + j;
    kv[ko] = k[e];
    kv[ko + ps * rf] = v[e];
  }
}

// bk_page_pack copies the first tokens slots of a page, for every layer
// its K rows then its V rows, to dst: internal/transfer.Pack's layout
// (as float32; little-endian bytes on the host). bk_page_unpack is the
// inverse. Launch: one thread per element of layers*2*tokens*rf.
extern "C" __global__ void bk_page_pack(float* dst, const float* kv, int64_t page, int64_t tokens, int64_t layers,
                                        int64_t ps, int64_t pf, int64_t rf) {
  const int64_t blk = tokens * rf, total = layers * 2 * blk;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t lk = e / blk, j = e % blk;  // lk = layer*2 + (0 for K, 1 for V)
    dst[e] = kv[page * pf + lk * ps * rf + j];
  }
}

extern "C" __global__ void bk_page_unpack(float* kv, const float* src, int64_t page, int64_t tokens, int64_t layers,
                                          int64_t ps, int64_t pf, int64_t rf) {
  const int64_t blk = tokens * rf, total = layers * 2 * blk;
  for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (int64_t)gridDim.x * blockDim.x) {
    const int64_t lk = e / blk, j = e % blk;
    kv[page * pf + lk * ps * rf + j] = src[e];
  }
}
