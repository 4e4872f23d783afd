package scheduler

import (
	"errors"

	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/kvpool"
)

// allocate takes r's pages at admission. With a prefix cache, the longest
// run of full pages of r's tenant that its prompt starts with is pinned
// and put first in its page table, and prefill starts after them; the
// fresh pages cover the rest of its whole sequence. It returns how many
// prompt positions the pinned pages hold (after the faults build's
// Faults.Admitted, which may change them).
func allocate(e *Engine, r *Request) (kvpool.Allocation, int, error) {
	a, cached, err := e.allocatePages(r)
	if err != nil {
		return a, cached, err
	}
	return a, e.cfg.Faults.Admitted(r, a, cached), nil
}

func (e *Engine) allocatePages(r *Request) (kvpool.Allocation, int, error) {
	need := e.needPages(r)
	var hit []kvpool.SharedRef
	var found []hicache.Found
	c := e.cfg.PrefixCache
	// Prompt logprobs need the logits of every prompt position, which a
	// cached prefix never computes here.
	if c != nil && r.traits().computesPrompts && !r.Params.PromptLogprobs {
		hit = c.Lookup(r.Params.Tenant, r.Prompt)
		found = e.findLower(r, len(hit))
		if e.prefixInFlight(r, len(hit)+len(found)) {
			return kvpool.Allocation{}, 0, errPrefixInFlight
		}
	}
	if need-len(hit) > e.pool.Available() {
		return kvpool.Allocation{}, 0, kvpool.ErrNoSpace
	}
	a, err := e.pool.AllocPinned(r.room, need-len(hit), hit)
	if errors.Is(err, kvpool.ErrStale) {
		// A page of the hit was evicted between lookup and pin: compute
		// the whole prompt rather than guess which part is still there.
		hit, found = nil, nil
		a, err = e.pool.AllocPinned(r.room, need, nil)
	}
	if err != nil {
		return kvpool.Allocation{}, 0, err
	}
	cached := len(hit) * e.pool.PageSize()
	if c != nil && r.traits().computesPrompts {
		c.Count(len(r.Prompt), cached)
		e.m.PrefixCacheQueried.Add(float64(len(r.Prompt)))
		e.m.PrefixCacheHit.Add(float64(cached))
		e.m.HiCacheHits.WithLabelValues("l1").Add(float64(len(hit)))
		r.loading = e.startLoads(a, len(hit), found, nil)
	}
	return a, cached, nil
}

// errPrefixInFlight holds a request at the head of the queue while another
// request of its tenant computes pages it could read.
var errPrefixInFlight = errors.New("scheduler: a running request is computing this prompt's prefix")

// prefixInFlight reports whether a running request of r's tenant is still
// prefilling a prompt that shares more full pages with r's than r found
// cached: r then waits for those pages to be published rather than compute
// the same KV alongside (SGLang's in-batch prefix check). The queue is
// FIFO, so r waits at its head; the running request needs nothing from r,
// so the wait ends when its prefill does.
func (e *Engine) prefixInFlight(r *Request, hitPages int) bool {
	ps := e.pool.PageSize()
	limit := max(0, len(r.Prompt)-1) / ps
	if limit <= hitPages {
		return false
	}
	for _, o := range e.running {
		if o.generated > 0 || o.computed >= len(o.Prompt) || o.Params.Tenant != r.Params.Tenant {
			continue
		}
		n := 0
		for n < len(o.Prompt) && n < len(r.Prompt) && o.Prompt[n] == r.Prompt[n] {
			n++
		}
		if min(n/ps, limit) > hitPages {
			return true
		}
	}
	return false
}

// writable is the write gate's question: do the positions [from, to) this
// step stores fall only in r's own pages, never in a shared page that
// other requests read?
func writable(e *Engine, r *Request, from, to int) error {
	return e.cfg.Guards.WriteGate(e, r, from, to)
}

func (e *Engine) checkWritable(r *Request, from, to int) error {
	return e.pool.CheckWritable(r.owner, r.pages, from, to)
}

// publish offers r's complete pages to the prefix cache: the full pages of
// the positions whose KV it holds (the prompt once prefilled, and at the
// end what it generated too, so that the next turn of a chat finds it).
// Pages the cache refuses stay private and are freed with r.
func (e *Engine) publish(r *Request) {
	c := e.cfg.PrefixCache
	if c == nil || r.pages == nil {
		return
	}
	n := min(r.computed, len(r.seq))
	_, _ = c.Publish(r.Params.Tenant, r.owner, r.pages, r.seq[:n])
}

// reservePages takes a decode request's pages at Reserve: with a prefix
// cache (decode keeps finished requests' pages), the longest run of full
// prompt pages of its tenant it holds is pinned first in the page table,
// and fresh pages cover the rest of the sequence.
func (e *Engine) reservePages(r *Request, room uint64) (kvpool.Allocation, []kvpool.SharedRef, error) {
	need := e.pool.PagesFor(e.maxSeqLen(r))
	c := e.cfg.PrefixCache
	var hit []kvpool.SharedRef
	var found []hicache.Found
	if c != nil {
		hit = c.Lookup(r.Params.Tenant, r.Prompt)
		found = e.findLower(r, len(hit))
	}
	a, err := e.pool.AllocPinned(room, need-len(hit), hit)
	if errors.Is(err, kvpool.ErrStale) {
		hit, found = nil, nil
		a, err = e.pool.AllocPinned(room, need, nil)
	}
	if err != nil {
		return a, nil, err
	}
	if c != nil {
		e.m.HiCacheHits.WithLabelValues("l1").Add(float64(len(hit)))
		// Pages loading from a lower tier are held like the cached ones:
		// prefill does not ship them, and Commit waits for their loads
		// (Request.LoadsDone) before it re-checks them.
		r.loadsDone = make(chan struct{})
		if n := e.startLoads(a, len(hit), found, r.loadsDone); n > 0 {
			base := len(hit)
			for i, f := range found[:n] {
				hit = append(hit, kvpool.SharedRef{Page: a.Pages[base+i], Key: f.Ref.Key})
			}
		} else {
			close(r.loadsDone)
		}
		held := len(hit) * e.pool.PageSize()
		c.Count(len(r.Prompt), held)
		e.m.PrefixCacheQueried.Add(float64(len(r.Prompt)))
		e.m.PrefixCacheHit.Add(float64(held))
	}
	return a, hit, nil
}

// Held are a decode request's prompt pages pinned from the prefix cache
// at Reserve, first in its page table; the writer ships only the others.
func (r *Request) Held() []kvpool.SharedRef { return r.held }

// shipCached hands a prefill request's cached pages to its hook as if a
// step had just computed them: decode holds none of them, so they travel
// like the pages prefill computes (read from the shared pages, which only
// their pin lets it read).
func (e *Engine) shipCached(r *Request) {
	if r.OnChunk != nil && r.cached > 0 {
		r.OnChunk(e.pool.KV(), r.pages, 0, r.cached)
	}
}

// SetCachedTokens tells a decode request how many of its prompt tokens its
// prefill read from a prefix cache, to go out with the first token; call
// it before Enqueue.
func (r *Request) SetCachedTokens(n int) { r.cached = n }
