// attn_mma.cuh: causal attention for prompt chunks on the tensor cores
// (FlashAttention-2 style), over KV stored as f16 or bf16 (or fp8 e4m3,
// converted to f16 as its tiles are gathered), head dims 64, 128 and 256.
// The host sends here the sequences of a call with QLen >= 16;
// decode rows, short chunks, f32 pools and other head dims use
// attention.cuh.
//
// One block is one sequence, one query head and a tile of BK_MMA_ROWS (64)
// query rows, 16 a warp. The block walks the positions [0, pend) the tile
// reads (pend = 1 + the causal limit of its last row; the earlier pages
// of a chunked prefill or a prefix-cache hit included) in tiles of POS
// positions (BK_MMA_POS, 64; 32 at head dim 256, see below): the K rows of a tile are gathered through the page
// table into shared memory as stored ([pos][hd]), the V rows transposed
// ([hd][pos]), so that every mma B fragment is one 32-bit shared load.
// Each warp then
//   - multiplies S = Q·Kᵀ (16 rows x POS positions) with
//     mma.sync.m16n8k16 (f32 accumulators, the inputs the pool's half
//     type: Q is rounded to it once, held as A fragments);
//   - scales, masks (position p is seen by row i iff p <= KVLen-QLen+i),
//     and updates the online softmax (m, l) of its rows: a row's values of
//     an n8 block sit on the 4 lanes of a quad, reduced with shuffles;
//   - multiplies O += P·V: the S accumulators of two adjacent n8 blocks,
//     rounded to the half type, are the A fragment of a k16 step. A step
//     some of whose positions are past the limit of some of the warp's
//     rows runs on the CUDA cores instead (the quad's P values gathered by
//     shuffles, float32), skipping those positions, so a NaN in V there
//     does not reach a row that must not see it; a step past every row's
//     limit is skipped.
// At the end each row is O / l (l summed over the quad).
//
// Differences from ref: q and P rounded to the half type (the mma's
// inputs), float32 accumulation in the tensor cores' order, float32
// softmax. NaN in K or V reaches the rows that read it: a NaN score wins
// no max (fmaxf) but makes its row's l and P NaN; a NaN V element makes
// the products of the rows that read it NaN.
//
// Head dim 256 walks the positions 32 at a time: a lane holds its Q
// fragments (64 registers) and O accumulators (128) for the whole walk,
// and with 64 positions the S tile's 32 more pushed ptxas far into
// spills; the shared tiles stay under the 48 KB a launch gets without
// cuFuncSetAttribute (37 KB, against 70 KB at 64 positions).
//
// Emulation (BK_EMU): the mma runs through bk_emu_mma_m16n8k16 (bk_emu.h),
// which computes each lane's D elements from the whole warp's fragments
// as the PTX ISA lays them out, so the fragment bookkeeping here is
// tested on the CPU.
#pragma once
#include "attention.cuh"

#define BK_MMA_THREADS 128
#define BK_MMA_ROWS 64  // query rows a block: 16 a warp
#define BK_MMA_POS 64   // positions a K/V tile (head dims 64, 128)
#define BK_MMA_POS_HD256 32
#define BK_MMA_PAD 8    // halves of padding a shared row: fragment loads hit distinct banks
#define BK_MMA_TILE_FIELDS 2  // int32: sequence, first row

// d += a·b: one m16n8k16 mma of the warp (every lane must call it).
__device__ __forceinline__ void bk_mma_m16n8k16_f16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef BK_EMU
  bk_emu_mma_m16n8k16<false>(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

__device__ __forceinline__ void bk_mma_m16n8k16_bf16(float d[4], const uint32_t a[4], const uint32_t b[2]) {
#ifdef BK_EMU
  bk_emu_mma_m16n8k16<true>(d, a, b);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

template <int KT>
__device__ __forceinline__ void bk_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  if (KT == BK_BF16) {
    bk_mma_m16n8k16_bf16(d, a, b);
  } else {
    bk_mma_m16n8k16_f16(d, a, b);
  }
}

// Two floats as a register of two halves (lo in the low 16 bits).
template <int KT>
__device__ __forceinline__ uint32_t bk_pack2(float lo, float hi) {
  if (KT == BK_BF16) return (uint32_t)bk_f2bf(lo) | (uint32_t)bk_f2bf(hi) << 16;
  return (uint32_t)bk_f2h(lo) | (uint32_t)bk_f2h(hi) << 16;
}

template <int KT>
__device__ __forceinline__ float bk_half2f(uint16_t h) {
  return KT == BK_BF16 ? bk_bf2f(h) : bk_h2f(h);
}

// Launch: grid (tiles, heads), block BK_MMA_THREADS, dynamic shared memory
// 2 * (POS * (HD + BK_MMA_PAD) + HD * (POS + BK_MMA_PAD))
// bytes. tiles holds (sequence, first row) per tile; seqs and pages are
// attention.cuh's tables; q and out are [nrows][heads][HD], half out's
// rounded copy by half_kind (bk_half_out, for the output projection);
// group is heads per KV head.
// bk_mma_row8 reads elements [c, c+8) of a K or V row as 8 halves of the
// tile's type: as stored for f16 and bf16; an fp8 pool's, converted to f16
// (exact: every e4m3 value is an f16 one), so its tiles multiply as f16.
template <int KT>
__device__ __forceinline__ uint4 bk_mma_row8(const typename bk_kv_elem<KT>::type* row) {
  if (KT != BK_E4M3) return *reinterpret_cast<const uint4*>(row);
  const uint2 u = *reinterpret_cast<const uint2*>(row);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t b = i < 2 ? u.x >> (16 * i) : u.y >> (16 * (i - 2));
    w[i] = (uint32_t)bk_f2h(bk_e4m32f(b & 0xffu)) | (uint32_t)bk_f2h(bk_e4m32f((b >> 8) & 0xffu)) << 16;
  }
  return uint4{w[0], w[1], w[2], w[3]};
}

template <int KT, int HD, int POS>
__device__ void bk_attn_mma_body(float* out, const float* q, const void* kvp, const int32_t* pages,
                                 const int64_t* seqs, const int32_t* tiles, int64_t heads, int64_t group, int64_t ps,
                                 int64_t pe, int64_t rf, int64_t layer, float scale, uint16_t* half,
                                 int64_t half_kind) {
  const int KS = HD + BK_MMA_PAD;          // K row stride in shared memory (halves)
  const int VS = POS + BK_MMA_PAD;  // transposed V row stride
  const int NK = HD / 16;                  // k16 steps of Q·Kᵀ
  const int NO = HD / 8;                   // n8 blocks of O
  BK_DYN_SMEM(uint4, bk_mma_smem);
  uint16_t* Ks = reinterpret_cast<uint16_t*>(bk_mma_smem);
  uint16_t* Vt = Ks + POS * KS;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;

  const int32_t* tl = tiles + (int64_t)blockIdx.x * BK_MMA_TILE_FIELDS;
  const int64_t si = tl[0], r0 = tl[1];
  const int64_t h = blockIdx.y, kh = h / group;
  const int64_t* sd = seqs + si * BK_ATTN_SEQ_FIELDS;
  const int64_t pageOff = sd[0], rowStart = sd[1], qlen = sd[2], kvlen = sd[3];
  const int64_t base = kvlen - qlen;
  const int64_t pend = base + bk_min64(r0 + BK_MMA_ROWS, qlen);  // positions [0, pend) are read
  const int64_t wr = r0 + warp * 16;                             // the warp's first row
  const bool live = wr < qlen;                                   // the same for all its lanes
  const int64_t lmin = base + wr, lmax = lmin + 15;              // its first and last rows' limits
  const int64_t lim0 = lmin + g, lim1 = lim0 + 8;                // this lane's rows g and g+8

  // Q as A fragments: qa[k][*] covers dimensions [16k, 16k+16).
  uint32_t qa[NK][4];
  {
    const int64_t ra = wr + g, rb = ra + 8;
    const float* qra = ra < qlen ? q + ((rowStart + ra) * heads + h) * HD : nullptr;
    const float* qrb = rb < qlen ? q + ((rowStart + rb) * heads + h) * HD : nullptr;
#pragma unroll
    for (int k = 0; k < NK; k++) {
      const int c = 16 * k + 2 * t;
      qa[k][0] = qra ? bk_pack2<KT>(qra[c], qra[c + 1]) : 0u;
      qa[k][1] = qrb ? bk_pack2<KT>(qrb[c], qrb[c + 1]) : 0u;
      qa[k][2] = qra ? bk_pack2<KT>(qra[c + 8], qra[c + 9]) : 0u;
      qa[k][3] = qrb ? bk_pack2<KT>(qrb[c + 8], qrb[c + 9]) : 0u;
    }
  }
  // O accumulators: o[j] is the n8 block of dimensions [8j, 8j+8).
  float o[NO][4];
#pragma unroll
  for (int j = 0; j < NO; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
  float m0 = BK_NEG_INF, m1 = BK_NEG_INF, l0 = 0.f, l1 = 0.f;

  // K row of (page, slot): kvl + page*pe + slot*rf; its V row is ps*rf further.
  typedef typename bk_kv_elem<KT>::type T;
  const T* kvl = static_cast<const T*>(kvp) + layer * 2 * ps * rf + kh * HD;
  for (int64_t pt = 0; pt < pend; pt += POS) {
    __syncthreads();  // the last tile's readers are done
    for (int e = tid; e < POS * (HD / 8); e += BK_MMA_THREADS) {
      const int pi = e / (HD / 8), c = e % (HD / 8) * 8;
      const int64_t p = pt + pi;
      uint4 kx = {0u, 0u, 0u, 0u}, vx = {0u, 0u, 0u, 0u};
      if (p < pend) {
        const T* row = kvl + (int64_t)pages[pageOff + p / ps] * pe + (p % ps) * rf + c;
        kx = bk_mma_row8<KT>(row);
        vx = bk_mma_row8<KT>(row + ps * rf);
      }
      *reinterpret_cast<uint4*>(Ks + pi * KS + c) = kx;
      const uint32_t vw[4] = {vx.x, vx.y, vx.z, vx.w};
#pragma unroll
      for (int i = 0; i < 4; i++) {
        Vt[(c + 2 * i) * VS + pi] = (uint16_t)(vw[i] & 0xffffu);
        Vt[(c + 2 * i + 1) * VS + pi] = (uint16_t)(vw[i] >> 16);
      }
    }
    __syncthreads();
    if (!live || pt > lmax) continue;  // the whole warp alike

    // S = Q·Kᵀ: s[j] is the n8 block of positions pt + [8j, 8j+8).
    float s[POS / 8][4];
#pragma unroll
    for (int j = 0; j < POS / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int k = 0; k < NK; k++) {
#pragma unroll
      for (int j = 0; j < POS / 8; j++) {
        const uint16_t* kr = Ks + (8 * j + g) * KS + 16 * k + 2 * t;
        const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8)};
        bk_mma<KT>(s[j], qa[k], b);
      }
    }
    // Scale and mask; the rows' maxima over the quad.
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int j = 0; j < POS / 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int64_t p = pt + 8 * j + 2 * t + e;
        s[j][e] = p <= lim0 ? s[j][e] * scale : BK_NEG_INF;
        s[j][2 + e] = p <= lim1 ? s[j][2 + e] * scale : BK_NEG_INF;
        mx0 = fmaxf(mx0, s[j][e]);
        mx1 = fmaxf(mx1, s[j][2 + e]);
      }
    }
#pragma unroll
    for (int x = 1; x < 4; x <<= 1) {
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, x));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, x));
    }
    const float f0 = bk_attn_factor(m0, mx0), f1 = bk_attn_factor(m1, mx1);
    m0 = mx0;
    m1 = mx1;
    l0 *= f0;
    l1 *= f1;
#pragma unroll
    for (int j = 0; j < NO; j++) {
      o[j][0] *= f0;
      o[j][1] *= f0;
      o[j][2] *= f1;
      o[j][3] *= f1;
    }
    // P in place of S (a masked position weighs 0; a NaN score stays NaN).
#pragma unroll
    for (int j = 0; j < POS / 8; j++) {
#pragma unroll
      for (int e = 0; e < 2; e++) {
        s[j][e] = s[j][e] == BK_NEG_INF ? 0.f : expf(s[j][e] - mx0);
        s[j][2 + e] = s[j][2 + e] == BK_NEG_INF ? 0.f : expf(s[j][2 + e] - mx1);
        l0 += s[j][e];
        l1 += s[j][2 + e];
      }
    }
    // O += P·V, a k16 step (16 positions) at a time.
#pragma unroll
    for (int kk = 0; kk < POS / 16; kk++) {
      const int64_t pk = pt + 16 * kk;
      if (pk > lmax) break;  // past every row's limit
      if (pk + 15 <= lmin) {
        // Every row sees all 16: the tensor cores.
        const uint32_t pa[4] = {bk_pack2<KT>(s[2 * kk][0], s[2 * kk][1]), bk_pack2<KT>(s[2 * kk][2], s[2 * kk][3]),
                                bk_pack2<KT>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                bk_pack2<KT>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < NO; j++) {
          const uint16_t* vr = Vt + (8 * j + g) * VS + 16 * kk + 2 * t;
          const uint32_t b[2] = {*reinterpret_cast<const uint32_t*>(vr), *reinterpret_cast<const uint32_t*>(vr + 8)};
          bk_mma<KT>(o[j], pa, b);
        }
      } else {
        // The diagonal: each lane adds the positions its rows see, with
        // the P values of its quad (lane t^x holds positions 2(t^x),
        // 2(t^x)+1, 8+2(t^x), 9+2(t^x) of rows g and g+8).
#pragma unroll
        for (int x = 0; x < 4; x++) {
          float v[8] = {s[2 * kk][0], s[2 * kk][1], s[2 * kk + 1][0], s[2 * kk + 1][1],
                        s[2 * kk][2], s[2 * kk][3], s[2 * kk + 1][2], s[2 * kk + 1][3]};
          if (x) {
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = __shfl_xor_sync(0xffffffffu, v[i], x);
          }
          const int tp = t ^ x;
#pragma unroll
          for (int i = 0; i < 4; i++) {
            const int qp = (i / 2) * 8 + 2 * tp + i % 2;  // position within the step
            const int64_t p = pk + qp;
            const bool see0 = p <= lim0, see1 = p <= lim1;
            if (!see0 && !see1) continue;
            const uint16_t* vc = Vt + 16 * kk + qp;
#pragma unroll
            for (int j = 0; j < NO; j++) {
#pragma unroll
              for (int c = 0; c < 2; c++) {
                const float vv = bk_half2f<KT>(vc[(8 * j + 2 * t + c) * VS]);
                if (see0) o[j][c] += v[i] * vv;
                if (see1) o[j][2 + c] += v[4 + i] * vv;
              }
            }
          }
        }
      }
    }
  }
  if (!live) return;
#pragma unroll
  for (int x = 1; x < 4; x <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, x);
    l1 += __shfl_xor_sync(0xffffffffu, l1, x);
  }
  const int64_t ra = wr + g, rb = ra + 8;
#pragma unroll
  for (int j = 0; j < NO; j++) {
#pragma unroll
    for (int c = 0; c < 2; c++) {
      const int d = 8 * j + 2 * t + c;
      const int64_t ia = ((rowStart + ra) * heads + h) * HD + d, ib = ((rowStart + rb) * heads + h) * HD + d;
      const float va = o[j][c] / l0, vb = o[j][2 + c] / l1;
      if (ra < qlen) {
        out[ia] = va;
        bk_half_out(half, half_kind, ia, va);
      }
      if (rb < qlen) {
        out[ib] = vb;
        bk_half_out(half, half_kind, ib, vb);
      }
    }
  }
}

// One kernel per KV dtype and head dim (the fragments are registers
// sized by the head dim and the position tile).
#define BK_ATTN_MMA_KERNEL(name, KT, HD, POS)                                                                       \
  extern "C" __global__ void __launch_bounds__(BK_MMA_THREADS)                                                      \
      name(float* out, const float* q, const void* kv, const int32_t* pages, const int64_t* seqs,                   \
           const int32_t* tiles, int64_t heads, int64_t group, int64_t ps, int64_t pe, int64_t rf, int64_t layer,   \
           float scale, uint16_t* half, int64_t half_kind) {                                                       \
    bk_attn_mma_body<KT, HD, POS>(out, q, kv, pages, seqs, tiles, heads, group, ps, pe, rf, layer, scale, half,     \
                                  half_kind);                                                                       \
  }

BK_ATTN_MMA_KERNEL(bk_attn_mma_f16_hd64, BK_F16, 64, BK_MMA_POS)
BK_ATTN_MMA_KERNEL(bk_attn_mma_bf16_hd64, BK_BF16, 64, BK_MMA_POS)
BK_ATTN_MMA_KERNEL(bk_attn_mma_f16_hd128, BK_F16, 128, BK_MMA_POS)
BK_ATTN_MMA_KERNEL(bk_attn_mma_bf16_hd128, BK_BF16, 128, BK_MMA_POS)
BK_ATTN_MMA_KERNEL(bk_attn_mma_f16_hd256, BK_F16, 256, BK_MMA_POS_HD256)
BK_ATTN_MMA_KERNEL(bk_attn_mma_bf16_hd256, BK_BF16, 256, BK_MMA_POS_HD256)
BK_ATTN_MMA_KERNEL(bk_attn_mma_e4m3_hd64, BK_E4M3, 64, BK_MMA_POS)
BK_ATTN_MMA_KERNEL(bk_attn_mma_e4m3_hd128, BK_E4M3, 128, BK_MMA_POS)
BK_ATTN_MMA_KERNEL(bk_attn_mma_e4m3_hd256, BK_E4M3, 256, BK_MMA_POS_HD256)
