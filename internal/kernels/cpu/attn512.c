// The AVX-512 attention (see bk_attention in cpu.c): the same work items,
// chunks and online softmax as the AVX2 code, with scores, exponentials
// and the V sums 16 lanes wide, and the K/V rows of the chunk ahead
// prefetched through the page table. Compiled with a target attribute
// like the AVX-512 gemm and chosen at run time.
#include "attnspan.h"
#include "cpu.h"
#include "vexp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && !defined(BK_NO_SIMD)
#include <immintrin.h>
#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define AVX512_INLINE                                                                         \
  static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

// Positions per chunk, as in cpu.c (the rows of a head sit a KV row apart
// and share a few L1 sets; 32 positions of K and V stay in L1).
#define ZCHUNK 32

typedef struct {
  float *qs;  // members x hd: q*scale
  float *acc; // members x hd
  float mx[BK_ATTN_MAX_MEMBERS], l[BK_ATTN_MAX_MEMBERS];
  int64_t last[BK_ATTN_MAX_MEMBERS];
  float *outp[BK_ATTN_MAX_MEMBERS];
  float sc[ZCHUNK + 16];
  // Rows of the chunk: the stored rows, or float32 copies when packed.
  const void *kp[ZCHUNK + 16], *vp[ZCHUNK + 16];
  // The next chunk's K and V rows (ncnt of them, rb bytes a head), which
  // the kernels prefetch as they go; see cpu.c.
  const char *nk[ZCHUNK], *nv[ZCHUNK];
  int64_t ncnt, rb;
  // Elements from a chunk row to the member's head (a run of heads).
  int64_t koff[BK_ATTN_MAX_MEMBERS];
} zattn;

AVX512_INLINE __m512 zld_f32(const float *p) { return _mm512_loadu_ps(p); }
AVX512_INLINE __m512 zld_f16(const uint16_t *p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
AVX512_INLINE __m512 zld_bf16(const uint16_t *p) {
  __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

BK_VEXP(zexp16, AVX512_INLINE, __m512, 512, _mm512, _mm512_roundscale_ps)

// Halves of a and b added: lanes 0-7 hold the 8-lane partial sums of a,
// lanes 8-15 those of b (and so on for the narrower steps).
AVX512_INLINE __m512 zfold256(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
}
AVX512_INLINE __m512 zfold128(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd));
}
AVX512_INLINE __m512 zfold64(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x44), _mm512_shuffle_ps(a, b, 0xee));
}
AVX512_INLINE __m512 zfold32(__m512 a, __m512 b) {
  return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xdd));
}

// Sixteen sums in one vector: lane i is the sum of v[i]. The inputs are
// paired in the order that leaves the sums in lane order.
AVX512_INLINE __m512 zhsum16x16(const __m512 *v) {
  __m512 a0 = zfold256(v[0], v[4]), a1 = zfold256(v[2], v[6]), a2 = zfold256(v[1], v[5]),
         a3 = zfold256(v[3], v[7]), a4 = zfold256(v[8], v[12]), a5 = zfold256(v[10], v[14]),
         a6 = zfold256(v[9], v[13]), a7 = zfold256(v[11], v[15]);
  __m512 b0 = zfold128(a0, a4), b1 = zfold128(a1, a5), b2 = zfold128(a2, a6),
         b3 = zfold128(a3, a7);
  return zfold32(zfold64(b0, b2), zfold64(b1, b3));
}

// Requires hd % 16 == 0. KT is the stored element type and LD16(p) loads
// sixteen of them as float32.
#define DEF_CHUNK512(NAME, KT, LD16)                                                          \
  AVX512 static void NAME(zattn *s, int m, int64_t hd, int64_t cnt) {                          \
    const float *q = s->qs + m * hd;                                                          \
    float *acc = s->acc + m * hd;                                                             \
    const int64_t ko = s->koff[m];                                                            \
    for (int64_t j0 = 0; j0 < cnt; j0 += 16) {                                                \
      const KT *k[16];                                                                        \
      for (int t = 0; t < 16; t++) k[t] = (const KT *)s->kp[j0 + t < cnt ? j0 + t : cnt - 1] + ko; \
      for (int64_t t = j0; t < j0 + 16 && t < s->ncnt; t++)                                   \
        bk_prefetch(s->nk[t] + ko * (int64_t)sizeof(KT), s->rb);                              \
      __m512 v[16];                                                                           \
      for (int t = 0; t < 16; t++) v[t] = _mm512_setzero_ps();                                \
      for (int64_t d = 0; d < hd; d += 16) {                                                  \
        __m512 qv = _mm512_loadu_ps(q + d);                                                   \
        for (int t = 0; t < 16; t++) v[t] = _mm512_fmadd_ps(qv, LD16(k[t] + d), v[t]);        \
      }                                                                                       \
      _mm512_storeu_ps(s->sc + j0, zhsum16x16(v));                                            \
    }                                                                                         \
    __m512 mv = _mm512_set1_ps(-INFINITY);                                                    \
    for (int64_t j0 = 0; j0 < cnt; j0 += 16) {                                                \
      __mmask16 k = cnt - j0 >= 16 ? 0xffff : (__mmask16)((1u << (cnt - j0)) - 1);            \
      mv = _mm512_mask_max_ps(mv, k, mv, _mm512_loadu_ps(s->sc + j0));                        \
    }                                                                                         \
    float cmax = _mm512_reduce_max_ps(mv);                                                    \
    float nm = s->mx[m] > cmax ? s->mx[m] : cmax;                                             \
    if (nm != s->mx[m]) {                                                                     \
      float f = expf(s->mx[m] - nm);                                                          \
      s->l[m] *= f;                                                                           \
      __m512 fv = _mm512_set1_ps(f);                                                          \
      for (int64_t d = 0; d < hd; d += 16)                                                    \
        _mm512_storeu_ps(acc + d, _mm512_mul_ps(fv, _mm512_loadu_ps(acc + d)));               \
      s->mx[m] = nm;                                                                          \
    }                                                                                         \
    __m512 nmv = _mm512_set1_ps(nm), sum = _mm512_setzero_ps();                               \
    for (int64_t j0 = 0; j0 < cnt; j0 += 16) {                                                \
      __mmask16 k = cnt - j0 >= 16 ? 0xffff : (__mmask16)((1u << (cnt - j0)) - 1);            \
      __m512 p = _mm512_maskz_mov_ps(k, zexp16(_mm512_sub_ps(_mm512_loadu_ps(s->sc + j0), nmv))); \
      _mm512_storeu_ps(s->sc + j0, p);                                                        \
      sum = _mm512_add_ps(sum, p);                                                            \
    }                                                                                         \
    s->l[m] += _mm512_reduce_add_ps(sum);                                                     \
    for (int64_t t = 0; t < s->ncnt; t++) bk_prefetch(s->nv[t] + ko * (int64_t)sizeof(KT), s->rb); \
    /* acc += Σ p_j v_j, 64 dims at a time in two sets of sums (even and odd */              \
    /* positions) so that two FMA chains run per register. */                                 \
    int64_t d = 0;                                                                            \
    for (; d + 64 <= hd; d += 64) {                                                           \
      __m512 a0 = _mm512_loadu_ps(acc + d), a1 = _mm512_loadu_ps(acc + d + 16),               \
             a2 = _mm512_loadu_ps(acc + d + 32), a3 = _mm512_loadu_ps(acc + d + 48);          \
      __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;                             \
      int64_t j = 0;                                                                          \
      for (; j + 2 <= cnt; j += 2) {                                                          \
        __m512 p = _mm512_set1_ps(s->sc[j]), r = _mm512_set1_ps(s->sc[j + 1]);                \
        const KT *v = (const KT *)s->vp[j] + ko + d, *w = (const KT *)s->vp[j + 1] + ko + d;  \
        a0 = _mm512_fmadd_ps(p, LD16(v), a0);                                                 \
        a1 = _mm512_fmadd_ps(p, LD16(v + 16), a1);                                            \
        a2 = _mm512_fmadd_ps(p, LD16(v + 32), a2);                                            \
        a3 = _mm512_fmadd_ps(p, LD16(v + 48), a3);                                            \
        b0 = _mm512_fmadd_ps(r, LD16(w), b0);                                                 \
        b1 = _mm512_fmadd_ps(r, LD16(w + 16), b1);                                            \
        b2 = _mm512_fmadd_ps(r, LD16(w + 32), b2);                                            \
        b3 = _mm512_fmadd_ps(r, LD16(w + 48), b3);                                            \
      }                                                                                       \
      if (j < cnt) {                                                                          \
        __m512 p = _mm512_set1_ps(s->sc[j]);                                                  \
        const KT *v = (const KT *)s->vp[j] + ko + d;                                          \
        a0 = _mm512_fmadd_ps(p, LD16(v), a0);                                                 \
        a1 = _mm512_fmadd_ps(p, LD16(v + 16), a1);                                            \
        a2 = _mm512_fmadd_ps(p, LD16(v + 32), a2);                                            \
        a3 = _mm512_fmadd_ps(p, LD16(v + 48), a3);                                            \
      }                                                                                       \
      _mm512_storeu_ps(acc + d, _mm512_add_ps(a0, b0));                                       \
      _mm512_storeu_ps(acc + d + 16, _mm512_add_ps(a1, b1));                                  \
      _mm512_storeu_ps(acc + d + 32, _mm512_add_ps(a2, b2));                                  \
      _mm512_storeu_ps(acc + d + 48, _mm512_add_ps(a3, b3));                                  \
    }                                                                                         \
    for (; d < hd; d += 16) {                                                                 \
      __m512 a0 = _mm512_loadu_ps(acc + d);                                                   \
      for (int64_t j = 0; j < cnt; j++)                                                       \
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(s->sc[j]), LD16((const KT *)s->vp[j] + ko + d), a0); \
      _mm512_storeu_ps(acc + d, a0);                                                          \
    }                                                                                         \
  }

DEF_CHUNK512(zchunk_f32, float, zld_f32)
DEF_CHUNK512(zchunk_f16, uint16_t, zld_f16)
DEF_CHUNK512(zchunk_bf16, uint16_t, zld_bf16)

// Members in lanes, for items of more than 8 members (prefill rows): lane
// m of every vector is member m (its scaled q transposed into qT, its sums
// in aT, both HD x 16), so a score is an FMA per dimension with the K
// element broadcast from memory, and the softmax's maximum, exponentials
// and rescaling are vector ops over the members instead of one member at a
// time with horizontal sums. Lanes past a member's last position are
// masked out of the maximum, the weights and the V sums, so a NaN or an
// infinity there reaches no member that does not read it. HD is a
// constant so the 16 rows' offsets are immediates. A 512-position causal
// prefill, 12 heads of 64, 2 threads (BenchmarkAttention prefill512),
// medians of three interleaved rounds: 82 -> 129 GFLOP/s; in a 1.1B F16
// 512-token prefill, attention went from 2.46 to 1.62 s of samples over
// five passes.
#define DEF_BLOCK512(NAME, HD)                                                                \
  AVX512 static void NAME(const float *qT, float *aT, __m512 *mx, __m512 *l, __m512i lastv,    \
                          const float *kw, const float *vw, int64_t c0, int64_t cnt,           \
                          float *pb) {                                                         \
    __mmask16 mk[ZCHUNK];                                                                      \
    for (int64_t j = 0; j < cnt; j++)                                                          \
      mk[j] = _mm512_cmp_epi32_mask(_mm512_set1_epi32((int)(c0 + j)), lastv, _MM_CMPINT_LE);   \
    /* Scores, 16 positions at a time; rows past cnt are read, not used. */                    \
    for (int64_t g = 0; g < cnt; g += 16) {                                                    \
      const float *kg = kw + g * HD;                                                           \
      __m512 sc[16];                                                                           \
      for (int t = 0; t < 16; t++) sc[t] = _mm512_setzero_ps();                                \
      for (int d = 0; d < HD; d++) {                                                           \
        __m512 qd = _mm512_loadu_ps(qT + 16 * d);                                              \
        for (int t = 0; t < 16; t++)                                                           \
          sc[t] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kg[t * HD + d]), sc[t]);                  \
      }                                                                                        \
      for (int t = 0; t < 16; t++) _mm512_storeu_ps(pb + 16 * (g + t), sc[t]);                 \
    }                                                                                          \
    __m512 cm = _mm512_set1_ps(-INFINITY);                                                     \
    for (int64_t j = 0; j < cnt; j++)                                                          \
      cm = _mm512_mask_max_ps(cm, mk[j], cm, _mm512_loadu_ps(pb + 16 * j));                    \
    /* max_ps returns its second operand when either is NaN. */                                \
    __m512 nm = _mm512_max_ps(*mx, cm);                                                        \
    if (_mm512_cmp_ps_mask(nm, *mx, _CMP_NEQ_UQ)) {                                            \
      __m512 f = zexp16(_mm512_sub_ps(*mx, nm));                                               \
      *l = _mm512_mul_ps(*l, f);                                                               \
      for (int d = 0; d < HD; d++)                                                             \
        _mm512_storeu_ps(aT + 16 * d, _mm512_mul_ps(f, _mm512_loadu_ps(aT + 16 * d)));         \
      *mx = nm;                                                                                \
    }                                                                                          \
    __m512 sum = _mm512_setzero_ps();                                                          \
    for (int64_t j = 0; j < cnt; j++) {                                                        \
      __m512 p = _mm512_maskz_mov_ps(mk[j], zexp16(_mm512_sub_ps(_mm512_loadu_ps(pb + 16 * j), nm))); \
      _mm512_storeu_ps(pb + 16 * j, p);                                                        \
      sum = _mm512_add_ps(sum, p);                                                             \
    }                                                                                          \
    *l = _mm512_add_ps(*l, sum);                                                               \
    for (int dg = 0; dg < HD; dg += 16) {                                                      \
      __m512 a[16];                                                                            \
      for (int i = 0; i < 16; i++) a[i] = _mm512_loadu_ps(aT + 16 * (dg + i));                 \
      for (int64_t j = 0; j < cnt; j++) {                                                      \
        __m512 p = _mm512_loadu_ps(pb + 16 * j);                                               \
        const float *vr = vw + j * HD + dg;                                                    \
        for (int i = 0; i < 16; i++)                                                           \
          a[i] = _mm512_mask3_fmadd_ps(p, _mm512_set1_ps(vr[i]), a[i], mk[j]);                 \
      }                                                                                        \
      for (int i = 0; i < 16; i++) _mm512_storeu_ps(aT + 16 * (dg + i), a[i]);                 \
    }                                                                                          \
  }

DEF_BLOCK512(zblock64, 64)
DEF_BLOCK512(zblock128, 128)

// Widens (or copies) n stored elements to float32; n % 16 == 0.
AVX512 static void zwiden(float *dst, const void *src, int64_t n, int dtype) {
  if (dtype == BK_F32) {
    memcpy(dst, src, sizeof(float) * n);
    return;
  }
  const uint16_t *h = src;
  if (dtype == BK_F16)
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, zld_f16(h + i));
  else
    for (int64_t i = 0; i < n; i += 16) _mm512_storeu_ps(dst + i, zld_bf16(h + i));
}

AVX512 int bk_attention_avx512(float *out, const float *q, const void *kv, const int32_t *pages,
                               const int64_t *seqs, const int32_t *items, int64_t it0, int64_t it1,
                               const bk_attn_geom *g) {
  const int64_t hd = g->head_dim, ps = g->page_size, rf = g->row_floats;
  const int64_t es = g->kv_dtype == BK_F32 ? 4 : 2;
  const char *kvb = kv;
  zattn s;
  // Zeroed: the block path reads whole groups of 16 rows of kw.
  s.qs = calloc((size_t)((2 * BK_ATTN_MAX_MEMBERS + 2 * ZCHUNK) * hd + 16 * ZCHUNK), sizeof(float));
  if (!s.qs) return -1;
  s.acc = s.qs + BK_ATTN_MAX_MEMBERS * hd;
  float *kw = s.acc + BK_ATTN_MAX_MEMBERS * hd, *vw = kw + ZCHUNK * hd, *pb = vw + ZCHUNK * hd;
  s.rb = hd * es;
  bk_span next = {0};
  if (it0 < it1) next = bk_item_span(seqs, pages, items + it0 * BK_ITEM_FIELDS, g);
  for (int64_t it = it0, run = 1; it < it1; it += run) {
    const int32_t *item = items + it * BK_ITEM_FIELDS;
    const int64_t *seq = seqs + item[BK_IT_SEQ] * BK_SEQ_FIELDS;
    int64_t qstart = seq[BK_SEQ_QSTART], qlen = seq[BK_SEQ_QLEN], kvlen = seq[BK_SEQ_KVLEN];
    // A run of heads (bk_head_run) is worked as one item.
    run = bk_head_run(items, it, it1);
    int members = run > 1 ? (int)run : item[BK_IT_NROWS] * item[BK_IT_NH];
    const bk_span cur = next;
    if (it + run < it1) next = bk_item_span(seqs, pages, items + (it + run) * BK_ITEM_FIELDS, g);
    for (int m = 0; m < members; m++) {
      int64_t r, h;
      bk_member(items, it, run, m, &r, &h);
      int64_t row = qstart + r;
      const float *qm = q + (row * g->heads + h) * hd;
      __m512 sv = _mm512_set1_ps(g->scale);
      for (int64_t d = 0; d < hd; d += 16) {
        _mm512_storeu_ps(s.qs + m * hd + d, _mm512_mul_ps(sv, _mm512_loadu_ps(qm + d)));
        _mm512_storeu_ps(s.acc + m * hd + d, _mm512_setzero_ps());
      }
      s.mx[m] = -INFINITY;
      s.l[m] = 0;
      s.last[m] = kvlen - qlen + r;
      s.outp[m] = out + (row * g->heads + h) * hd;
      s.koff[m] = run > 1 ? m * hd : 0;
    }
    const int64_t maxlast = cur.maxlast, width = run * hd;
    // As on the AVX2 path, several members read the chunk from contiguous
    // float32 copies; one member, or a run of heads, reads the rows in
    // place.
    const int pack = run == 1 && members >= 4;
    const int block = run == 1 && members > 8 && (hd == 64 || hd == 128);
    __m512 bmx = _mm512_set1_ps(-INFINITY), bl = _mm512_setzero_ps();
    __m512i blast = _mm512_setzero_si512();
    if (block) {
      // Lanes past the members repeat member 0; their sums are dropped.
      int32_t last[16];
      for (int m = 0; m < 16; m++) {
        int src = m < members ? m : 0;
        last[m] = (int32_t)s.last[src];
        for (int64_t d = 0; d < hd; d++) s.acc[16 * d + m] = 0;
        for (int64_t d = 0; d < hd; d++) kw[16 * d + m] = s.qs[src * hd + d];
      }
      memcpy(s.qs, kw, sizeof(float) * 16 * hd); // qT
      blast = _mm512_loadu_si512(last);
    }
    if (it == it0) bk_prefetch_rows(kvb, es, &cur, 0, ZCHUNK - 1, width, g);
    for (int64_t c0 = 0; c0 <= maxlast; c0 += ZCHUNK) {
      int64_t c1 = c0 + ZCHUNK <= maxlast + 1 ? c0 + ZCHUNK : maxlast + 1;
      // The next chunk, or the next item's first, is on its way while
      // this one is worked on.
      s.ncnt = bk_ahead(s.nk, s.nv, kvb, es, &cur, it + run < it1 ? &next : NULL, c1, ZCHUNK,
                        !pack && !block, width, g);
      for (int64_t p = c0; p < c1; p++) {
        int64_t off = bk_row_off(&cur, p, g);
        const char *k = kvb + off * es, *v = kvb + (off + ps * rf) * es;
        if (pack) {
          float *kd = kw + (p - c0) * hd, *vd = vw + (p - c0) * hd;
          zwiden(kd, k, hd, g->kv_dtype);
          zwiden(vd, v, hd, g->kv_dtype);
          s.kp[p - c0] = kd;
          s.vp[p - c0] = vd;
        } else {
          s.kp[p - c0] = k;
          s.vp[p - c0] = v;
        }
      }
      if (block) {
        if (hd == 64)
          zblock64(s.qs, s.acc, &bmx, &bl, blast, kw, vw, c0, c1 - c0, pb);
        else
          zblock128(s.qs, s.acc, &bmx, &bl, blast, kw, vw, c0, c1 - c0, pb);
        continue;
      }
      const int64_t ncnt = s.ncnt;
      for (int m = 0; m < members; m++) {
        int64_t e = s.last[m] + 1 < c1 ? s.last[m] + 1 : c1;
        if (e <= c0) continue;
        // Members of one KV head share the rows: the first prefetches them.
        s.ncnt = run > 1 || m == 0 ? ncnt : 0;
        if (pack || g->kv_dtype == BK_F32)
          zchunk_f32(&s, m, hd, e - c0);
        else if (g->kv_dtype == BK_F16)
          zchunk_f16(&s, m, hd, e - c0);
        else
          zchunk_bf16(&s, m, hd, e - c0);
      }
    }
    if (block) {
      float inv[16];
      _mm512_storeu_ps(inv, _mm512_div_ps(_mm512_set1_ps(1.0f), bl));
      for (int m = 0; m < members; m++)
        for (int64_t d = 0; d < hd; d++) s.outp[m][d] = s.acc[16 * d + m] * inv[m];
      continue;
    }
    for (int m = 0; m < members; m++) {
      __m512 inv = _mm512_set1_ps(1.0f / s.l[m]);
      for (int64_t d = 0; d < hd; d += 16)
        _mm512_storeu_ps(s.outp[m] + d, _mm512_mul_ps(inv, _mm512_loadu_ps(s.acc + m * hd + d)));
    }
  }
  free(s.qs);
  return 0;
}

#else
// Without x86 SIMD bk_attention never calls it.
int bk_attention_avx512(float *out, const float *q, const void *kv, const int32_t *pages,
                        const int64_t *seqs, const int32_t *items, int64_t it0, int64_t it1,
                        const bk_attn_geom *g) {
  (void)out, (void)q, (void)kv, (void)pages, (void)seqs, (void)items, (void)it0, (void)it1,
      (void)g;
  return -1;
}
#endif
