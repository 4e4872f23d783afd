// sample.cuh: picking the next token where the logits are
// (kernels.RowSampler, sample.go), so that only the choices come back to
// the host.
//
// One block a row. The row's raw logits give the NaN flag and the
// log-sum-exp of the logprobs; the row the choice is made from is the raw
// one with the request's edits (bias, penalties), allow mask and bans
// applied, in a scratch row of its own. A greedy choice is the argmax,
// bit for bit the CPU's (the edits use the same float32 operations, kept
// from contraction into FMAs). A draw keeps the CPU's candidates (top-k,
// min-p, top-p over the tokens in descending order, ties by lower id)
// without sorting: top-k is a radix select of the k-th key, top-p a
// bisection over the keys on the probability mass, and the draw walks the
// candidates in id order (the order changes which token a given u picks,
// not the distribution). Every float sum is a fixed-order reduction, so a
// row gives the same token for the same u whatever else is in the batch.
//
// Block: a multiple of 32 threads, at most BK_SAMPLE_THREADS.
#pragma once
#include "common.cuh"

#define BK_SAMPLE_THREADS 512
#define BK_SAMPLE_MAX_TOP 20  // kernels.MaxTopLogprobs

// One row's choice: mirrors sampleDesc in sample.go (8-byte fields).
struct bk_sample_desc {
  int64_t row;            // the logit row
  int64_t work;           // scratch row (adjusted logits, then a draw's probabilities); < 0: none
  int64_t edits, nedits;  // the row's edits
  int64_t bans, nbans;    // the row's bans
  int64_t allow, nallow;  // the row's allow bitset (words); nallow < 0: no mask
  int64_t draw, topk, ntop;
  double temp, topp, minp, u, rep;
};

// kernels.LogitEdit: v += bias; if rep, v /= rep (v > 0) or v *= rep; v -= pen.
struct bk_logit_edit {
  int32_t id;
  float bias, pen;
  int32_t rep;
};

// One row's answer: mirrors sampleOut in sample.go.
struct bk_sample_out {
  int32_t id;
  float lp;
  int32_t nan, ntop;
  int32_t top_id[BK_SAMPLE_MAX_TOP];
  float top_lp[BK_SAMPLE_MAX_TOP];
};

// Correctly rounded float operations nvcc does not fuse, so that the edits
// round as the Go code's do.
#ifdef BK_EMU
__device__ __forceinline__ float bk_fadd(float a, float b) { return a + b; }
__device__ __forceinline__ float bk_fsub(float a, float b) { return a - b; }
__device__ __forceinline__ float bk_fmul(float a, float b) { return a * b; }
__device__ __forceinline__ float bk_fdiv(float a, float b) { return a / b; }
// The fibers of the emulation run one at a time: a plain increment is atomic.
__device__ __forceinline__ unsigned bk_atomic_inc(unsigned* p) { return (*p)++; }
#else
__device__ __forceinline__ float bk_fadd(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float bk_fsub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float bk_fmul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float bk_fdiv(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ unsigned bk_atomic_inc(unsigned* p) { return atomicAdd(p, 1u); }
#endif

// bk_asc_key orders floats: a < b exactly when key(a) < key(b) (-0 and +0
// get one key); bk_desc_key is the reverse (model.descKey).
__device__ __forceinline__ uint32_t bk_asc_key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ uint32_t bk_desc_key(float f) { return ~bk_asc_key(f); }

// Block reductions: every thread calls them and gets the result; the
// partial values are combined in a fixed order, so sums are reproducible.
// red holds 32 values of 8 bytes.
template <typename T, typename Op>
__device__ __forceinline__ T bk_block_reduce(T v, T* red, Op op) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // red may still be read by the previous reduction
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = v;
  __syncthreads();
  T t = red[0];
  for (unsigned w = 1; w < blockDim.x / 32; w++) t = op(t, red[w]);
  return t;
}

struct bk_sum_op {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct bk_max_op {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
  __device__ __forceinline__ uint64_t operator()(uint64_t a, uint64_t b) const { return a > b ? a : b; }
};

// Shared memory of one block.
struct bk_sample_smem {
  union {  // bk_block_reduce's, by type
    double d[32];
    float f[32];
    int64_t i[32];
    uint64_t u[32];
  } red;
  unsigned hist[256];
  int64_t pick[2];
  double chunk[BK_SAMPLE_THREADS];
  unsigned ntop;
  uint32_t top_key[BK_SAMPLE_MAX_TOP];
  int32_t top_id[BK_SAMPLE_MAX_TOP];
};

// bk_select is the k-th smallest (1-based, k <= their count) of key(i)
// over the i < n with pred(i), by radix select on 8 bits at a time;
// *less is how many of them are smaller.
template <typename Key, typename Pred>
__device__ uint32_t bk_select(int64_t n, int64_t k, Key key, Pred pred, bk_sample_smem* sm, int64_t* less) {
  uint32_t prefix = 0, mask = 0;
  int64_t below = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) sm->hist[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      if (!pred(i)) continue;
      const uint32_t kv = key(i);
      if ((kv & mask) == prefix) bk_atomic_inc(&sm->hist[(kv >> shift) & 255u]);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t c = below;
      int d = 0;
      for (; d < 255 && c + sm->hist[d] < k; d++) c += sm->hist[d];
      sm->pick[0] = d;
      sm->pick[1] = c;
    }
    __syncthreads();
    prefix |= (uint32_t)sm->pick[0] << shift;
    mask |= 255u << shift;
    below = sm->pick[1];
  }
  *less = below;
  return prefix;
}

// bk_cut is the first tokens of a row in (key, id) order: those with a
// smaller key, and those with this key up to id.
struct bk_cut {
  uint32_t key;
  int64_t id;
  __device__ __forceinline__ bool has(uint32_t k, int64_t i) const { return k < key || (k == key && i <= id); }
};

// bk_first_k is the cut holding exactly the k first of the i with pred(i)
// in (key, id) order (k <= their count).
template <typename Key, typename Pred>
__device__ bk_cut bk_first_k(int64_t n, int64_t k, Key key, Pred pred, bk_sample_smem* sm) {
  int64_t less;
  const uint32_t t = bk_select(n, k, key, pred, sm, &less);
  int64_t ties = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ties += pred(i) && key(i) == t;
  ties = bk_block_reduce(ties, sm->red.i, bk_sum_op());
  if (ties <= k - less) return bk_cut{t, INT64_MAX};
  auto id = [](int64_t i) { return (uint32_t)i; };
  auto tie = [&](int64_t i) { return pred(i) && key(i) == t; };
  int64_t unused;
  return bk_cut{t, (int64_t)bk_select(n, k - less, id, tie, sm, &unused)};
}

// bk_sample_draw draws from w (no NaN) as model.Sampler.dist and pick do.
// pr (a scratch row, which may be w itself) receives each token's
// unnormalised probability, 0 outside the candidates, so that the passes
// after the top-k cut read one float a token and compute no exponential.
__device__ int32_t bk_sample_draw(const float* w, float* pr, int64_t vocab, const bk_sample_desc& d, bk_sample_smem* sm) {
  float top = BK_NEG_INF;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) top = fmaxf(top, w[i]);
  top = bk_block_reduce(top, sm->red.f, bk_max_op());
  const float temp = (float)d.temp, minp = (float)d.minp;
  auto all = [](int64_t) { return true; };
  // Top-k: the k first in (descending logit, id) order.
  bk_cut k = {0xffffffffu, INT64_MAX};
  if (d.topk > 0 && d.topk < vocab) {
    auto key = [&](int64_t i) { return bk_desc_key(w[i]); };
    k = bk_first_k(vocab, d.topk, key, all, sm);
  }
  // Min-p: probability at least min_p times the largest (whose e is 1).
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float e = expf((w[i] - top) / temp);
    pr[i] = k.has(bk_desc_key(w[i]), i) && (minp <= 0.0f || e >= minp) ? e : 0.0f;
  }
  __syncthreads();
  // From here the order is by probability, which follows the logit's
  // (tokens whose distinct logits round to one probability tie by id).
  auto key = [&](int64_t i) { return bk_desc_key(pr[i]); };
  auto mass = [&](bk_cut c) {
    double s = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (c.has(key(i), i)) s += pr[i];
    }
    return bk_block_reduce(s, sm->red.d, bk_sum_op());
  };
  // Top-p: the shortest run of candidates from the top whose mass reaches
  // top_p of theirs: the least key whose run does, by bisection, then
  // among that key's ties (equal probabilities) as many as it takes.
  bk_cut p = {0xffffffffu, INT64_MAX};
  if (d.topp > 0 && d.topp < 1) {
    const double target = d.topp * mass(p);
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      if (mass(bk_cut{mid, INT64_MAX}) >= target) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    const double before = lo > 0 ? mass(bk_cut{lo - 1, INT64_MAX}) : 0.0;
    auto tie = [&](int64_t i) { return key(i) == lo; };
    int64_t ties = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) ties += tie(i);
    ties = bk_block_reduce(ties, sm->red.i, bk_sum_op());
    const float et = __uint_as_float(~lo ^ 0x80000000u);  // the ties' probability (>= 0: the key's inverse)
    int64_t need = et > 0 ? (int64_t)ceil((target - before) / et) : ties;
    need = bk_max64(1, bk_min64(need, ties));
    p = bk_cut{lo, INT64_MAX};
    if (need < ties) {
      auto id = [](int64_t i) { return (uint32_t)i; };
      int64_t unused;
      p.id = bk_select(vocab, need, id, tie, sm, &unused);
    }
  }
  // The draw: each thread sums a contiguous chunk of the row, the chunks
  // are scanned in order, and the thread whose chunk holds u times the
  // total walks it.
  auto in = [&](int64_t i) { return pr[i] > 0 && p.has(key(i), i); };
  const int64_t per = (vocab + blockDim.x - 1) / blockDim.x;
  const int64_t lo = threadIdx.x * per, hi = bk_min64(vocab, lo + per);
  double s = 0;
  for (int64_t i = lo; i < hi; i++) {
    if (in(i)) s += pr[i];
  }
  __syncthreads();
  sm->chunk[threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (unsigned t = 0; t < blockDim.x; t++) total += sm->chunk[t];
    double r = d.u * total;
    int64_t at = -1;
    for (unsigned t = 0; t < blockDim.x; t++) {
      if (sm->chunk[t] > 0) at = t;  // the last chunk with a candidate, if rounding runs past the end
      if (sm->chunk[t] > 0 && r <= sm->chunk[t]) break;
      r -= sm->chunk[t];
    }
    sm->pick[0] = at;
    sm->red.d[0] = r;
  }
  __syncthreads();
  if ((int64_t)threadIdx.x == sm->pick[0]) {
    double r = sm->red.d[0];
    int64_t last = -1;
    for (int64_t i = lo; i < hi; i++) {
      if (!in(i)) continue;
      last = i;
      r -= pr[i];
      if (r <= 0) break;
    }
    sm->pick[1] = last;
  }
  __syncthreads();
  return (int32_t)sm->pick[1];
}

// bk_sample: one block per row of desc (grid nrows); see the file's top.
// work has a vocab-long row for each desc whose work >= 0: every row that
// is adjusted or drawn.
extern "C" __global__ void __launch_bounds__(BK_SAMPLE_THREADS)
    bk_sample(bk_sample_out* out, const float* logits, float* work, const bk_sample_desc* descs,
              const bk_logit_edit* edits, const int32_t* bans, const uint64_t* allow, int64_t nrows, int64_t vocab) {
  __shared__ bk_sample_smem sm;
  if ((int64_t)blockIdx.x >= nrows) return;  // uniform over the block
  const bk_sample_desc d = descs[blockIdx.x];
  bk_sample_out* o = out + blockIdx.x;
  const float* raw = logits + d.row * vocab;

  // The raw row: NaN, then the logprobs' normaliser.
  int64_t nan = 0;
  float mx = BK_NEG_INF;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = raw[i];
    if (x != x) {
      nan = 1;
    } else {
      mx = fmaxf(mx, x);
    }
  }
  nan = bk_block_reduce(nan, sm.red.i, bk_sum_op());
  if (nan) {
    if (threadIdx.x == 0) {
      o->id = 0;
      o->lp = 0;
      o->nan = 1;
      o->ntop = 0;
    }
    return;  // uniform
  }
  mx = bk_block_reduce(mx, sm.red.f, bk_max_op());
  double s = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) s += expf(raw[i] - mx);
  const double logZ = (double)mx + log(bk_block_reduce(s, sm.red.d, bk_sum_op()));

  // The row chosen from: the mask, the edits of allowed tokens, the bans.
  const float* w = raw;
  float* wr = d.work >= 0 ? work + d.work * vocab : nullptr;
  if (d.nedits > 0 || d.nbans > 0 || d.nallow >= 0) {
    const uint64_t* al = allow + d.allow;
    auto allowed = [&](int64_t id) {
      return d.nallow < 0 || ((id >> 6) < d.nallow && ((al[id >> 6] >> (id & 63)) & 1));
    };
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) wr[i] = allowed(i) ? raw[i] : BK_NEG_INF;
    __syncthreads();
    const float rep = (float)d.rep;
    for (int64_t j = threadIdx.x; j < d.nedits; j += blockDim.x) {
      const bk_logit_edit ed = edits[d.edits + j];
      if (!allowed(ed.id)) continue;
      float v = bk_fadd(raw[ed.id], ed.bias);
      if (ed.rep) v = v > 0 ? bk_fdiv(v, rep) : bk_fmul(v, rep);
      wr[ed.id] = bk_fsub(v, ed.pen);
    }
    __syncthreads();
    for (int64_t j = threadIdx.x; j < d.nbans; j += blockDim.x) wr[bans[d.bans + j]] = BK_NEG_INF;
    __syncthreads();
    w = wr;
  }

  // The choice: the argmax (highest key, then lowest id), or a draw.
  uint64_t best = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint64_t kv = (uint64_t)bk_asc_key(w[i]) << 32 | (uint32_t)~(uint32_t)i;
    best = best > kv ? best : kv;
  }
  best = bk_block_reduce(best, sm.red.u, bk_max_op());
  int32_t chosen = (int32_t)~(uint32_t)best;
  if (d.draw && (uint32_t)(best >> 32) != bk_asc_key(BK_NEG_INF)) chosen = bk_sample_draw(w, wr, vocab, d, &sm);
  if (threadIdx.x == 0) {
    o->id = chosen;
    o->lp = (float)((double)raw[chosen] - logZ);
    o->nan = 0;
    o->ntop = (int32_t)d.ntop;
  }
  if (d.ntop <= 0) return;  // uniform

  // The top logprobs: the ntop first of the raw row in (descending logit,
  // id) order, gathered, then sorted by one thread.
  auto key = [&](int64_t i) { return bk_desc_key(raw[i]); };
  auto all = [](int64_t) { return true; };
  const bk_cut c = bk_first_k(vocab, d.ntop, key, all, &sm);
  if (threadIdx.x == 0) sm.ntop = 0;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint32_t k = key(i);
    if (!c.has(k, i)) continue;
    const unsigned at = bk_atomic_inc(&sm.ntop);
    if (at < BK_SAMPLE_MAX_TOP) {
      sm.top_key[at] = k;
      sm.top_id[at] = (int32_t)i;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int n = (int)bk_min64(sm.ntop, d.ntop);
    for (int a = 1; a < n; a++) {
      const uint32_t k = sm.top_key[a];
      const int32_t id = sm.top_id[a];
      int b = a;
      for (; b > 0 && (sm.top_key[b - 1] > k || (sm.top_key[b - 1] == k && sm.top_id[b - 1] > id)); b--) {
        sm.top_key[b] = sm.top_key[b - 1];
        sm.top_id[b] = sm.top_id[b - 1];
      }
      sm.top_key[b] = k;
      sm.top_id[b] = id;
    }
    for (int a = 0; a < n; a++) {
      o->top_id[a] = sm.top_id[a];
      o->top_lp[a] = (float)((double)raw[sm.top_id[a]] - logZ);
    }
  }
}
