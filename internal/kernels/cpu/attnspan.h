// Where one attention work item reads, and the prefetch of its K and V rows
// ahead of use; shared by the AVX2 (cpu.c) and AVX-512 (attn512.c) paths.
#ifndef BATON_ATTNSPAN_H
#define BATON_ATTNSPAN_H

#include "cpu.h"

// The page table of one item, the offset of its K rows within a page, and
// the last position any member reads.
typedef struct {
  const int32_t *pg;
  int64_t kbase, maxlast;
} bk_span;

static inline bk_span bk_item_span(const int64_t *seqs, const int32_t *pages,
                                   const int32_t *item, const bk_attn_geom *g) {
  const int64_t *seq = seqs + item[BK_IT_SEQ] * BK_SEQ_FIELDS;
  bk_span sp = {
      .pg = pages + seq[BK_SEQ_PAGEOFF],
      .kbase = g->layer * 2 * g->page_size * g->row_floats + item[BK_IT_KVH] * g->head_dim,
      .maxlast = seq[BK_SEQ_KVLEN] - seq[BK_SEQ_QLEN] + item[BK_IT_ROW0] + item[BK_IT_NROWS] - 1,
  };
  return sp;
}

// The offset (in elements) of position p's K row in a span; its V row is
// page_size rows further on.
static inline int64_t bk_row_off(const bk_span *sp, int64_t p, const bk_attn_geom *g) {
  return sp->kbase + (int64_t)sp->pg[p / g->page_size] * g->page_floats +
         (p % g->page_size) * g->row_floats;
}

// The length of the run of items from it (before it1) that have one
// member each, of one sequence and query row, over consecutive KV heads:
// a decode row of a model without GQA. The kernels work such a run as one
// item whose members read their own head's part of the same KV rows, so
// each chunk reads whole rows, where one head at a time read hd elements
// a KV row apart.
static inline int64_t bk_head_run(const int32_t *items, int64_t it, int64_t it1) {
  const int32_t *first = items + it * BK_ITEM_FIELDS;
  if (first[BK_IT_NROWS] != 1 || first[BK_IT_NH] != 1) return 1;
  int64_t run = 1;
  while (it + run < it1 && run < BK_ATTN_MAX_MEMBERS) {
    const int32_t *nx = items + (it + run) * BK_ITEM_FIELDS;
    if (nx[BK_IT_SEQ] != first[BK_IT_SEQ] || nx[BK_IT_ROW0] != first[BK_IT_ROW0] ||
        nx[BK_IT_NROWS] != 1 || nx[BK_IT_NH] != 1 || nx[BK_IT_KVH] != first[BK_IT_KVH] + run)
      break;
    run++;
  }
  return run;
}

// The query row (within its sequence) and the head of member m of the
// item at it, worked as a run of run items (bk_head_run): a run's members
// are its items' one member each; an item's own are its rows times its
// heads.
static inline void bk_member(const int32_t *items, int64_t it, int64_t run, int m, int64_t *r,
                             int64_t *h) {
  const int32_t *item = items + it * BK_ITEM_FIELDS;
  if (run > 1) {
    *r = item[BK_IT_ROW0];
    *h = items[(it + m) * BK_ITEM_FIELDS + BK_IT_H0];
    return;
  }
  *r = item[BK_IT_ROW0] + m / item[BK_IT_NH];
  *h = item[BK_IT_H0] + m % item[BK_IT_NH];
}

// The cache lines of bytes at p.
static inline void bk_prefetch(const char *p, int64_t bytes) {
  const char *e = p + bytes;
  for (p = (const char *)((uintptr_t)p & ~(uintptr_t)63); p < e; p += 64)
    __builtin_prefetch(p, 0, 3);
}

// Prefetches width elements (es bytes each) of the K and V rows of
// positions [p0, p1] of a span. The rows of a head are a KV row apart and pages are scattered,
// so the hardware prefetchers see a few rows per 4 KiB page and little of
// a stream.
static inline void bk_prefetch_rows(const char *kv, int64_t es, const bk_span *sp, int64_t p0,
                                    int64_t p1, int64_t width, const bk_attn_geom *g) {
  const int64_t rb = width * es;
  if (p1 > sp->maxlast) p1 = sp->maxlast;
  for (int64_t p = p0; p <= p1; p++) {
    int64_t off = bk_row_off(sp, p, g);
    bk_prefetch(kv + off * es, rb);
    bk_prefetch(kv + (off + g->page_size * g->row_floats) * es, rb);
  }
}

// The K and V rows (nk, nv) of positions p0 to p0+n-1 of a span, at most
// to its last position; returns how many. The kernels prefetch a member's
// part of them while they work on the chunk before.
static inline int64_t bk_next_rows(const char **nk, const char **nv, const char *kv, int64_t es,
                                   const bk_span *sp, int64_t p0, int64_t n,
                                   const bk_attn_geom *g) {
  int64_t p1 = p0 + n <= sp->maxlast + 1 ? p0 + n : sp->maxlast + 1;
  for (int64_t p = p0; p < p1; p++) {
    int64_t off = bk_row_off(sp, p, g);
    nk[p - p0] = kv + off * es;
    nv[p - p0] = kv + (off + g->page_size * g->row_floats) * es;
  }
  return p1 > p0 ? p1 - p0 : 0;
}

// What is on its way while a chunk ending before c1 of span cur is worked
// on: with rows read in place, the next chunk's rows go into nk and nv for
// the kernels to prefetch a head's part at a time (the count is returned);
// otherwise the next chunk's rows, or after the span's last chunk the next
// item's first (next, or NULL for none), are asked for at once.
static inline int64_t bk_ahead(const char **nk, const char **nv, const char *kv, int64_t es,
                               const bk_span *cur, const bk_span *next, int64_t c1, int64_t chunk,
                               int in_place, int64_t width, const bk_attn_geom *g) {
  if (c1 <= cur->maxlast) {
    if (in_place) return bk_next_rows(nk, nv, kv, es, cur, c1, chunk, g);
    bk_prefetch_rows(kv, es, cur, c1, c1 + chunk - 1, width, g);
  } else if (next) {
    bk_prefetch_rows(kv, es, next, 0, chunk - 1, width, g);
  }
  return 0;
}

#endif
