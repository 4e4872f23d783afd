package scheduler

import (
	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/kvpool"
)

// findLower continues r's prefix lookup below the pool, after the hit
// pages found there.
func (e *Engine) findLower(r *Request, hit int) []hicache.Found {
	t := e.cfg.Tiers
	if t == nil {
		return nil
	}
	limit := max(0, len(r.Prompt)-1) / e.pool.PageSize()
	return t.Find(r.Params.Tenant, r.Prompt, hit, limit)
}

// startLoads loads found into the fresh pages of a that follow its hit
// pinned ones, and returns how many it started (0 if it could not; the
// pages are then computed). done, if set, closes when they all ended; the
// loop is poked either way.
func (e *Engine) startLoads(a kvpool.Allocation, hit int, found []hicache.Found, done chan struct{}) int {
	t := e.cfg.Tiers
	n := min(len(found), len(a.Pages)-hit)
	if t == nil || n <= 0 {
		return 0
	}
	for _, f := range found[:n] {
		tier := "l2"
		if f.Tier == hicache.L3 {
			tier = "l3"
		}
		e.m.HiCacheHits.WithLabelValues(tier).Inc()
	}
	end := func() {
		if done != nil {
			close(done)
		}
		e.poke()
	}
	if err := t.Load(a.Owner, a.Pages[hit:hit+n], found[:n], end); err != nil {
		return 0
	}
	return n
}

// loadsEnded is the scheduler's wait: may r step, all its loads ended?
func loadsEnded(e *Engine, r *Request) bool { return e.cfg.Guards.LoadWait(e, r) }

func (e *Engine) loadsEnded(r *Request) bool {
	from := r.cached / e.pool.PageSize()
	return e.pool.Loading(r.pages[from:from+r.loading]) == 0
}

// loaded takes r's ended loads into account: the leading pages that
// became shared are read from the cache like the ones it found there; the
// first that did not, and every one after it, r computes.
func (e *Engine) loaded(r *Request) {
	ps := e.pool.PageSize()
	from := r.cached / ps
	k := 0
	for _, id := range r.pages[from : from+r.loading] {
		st := e.pool.Info(id).State
		// A page still loading counts only when the wait was switched off
		// (faults build): the read gate is then what stands in the way.
		if st != kvpool.PageShared && st != kvpool.PageLoading {
			break
		}
		k++
	}
	r.loading = 0
	if k == 0 {
		return
	}
	old := r.cached
	r.cached += k * ps
	r.computed = r.cached
	if c := e.cfg.PrefixCache; c != nil {
		c.Count(0, k*ps)
		e.m.PrefixCacheHit.Add(float64(k * ps))
	}
	if r.OnChunk != nil {
		r.OnChunk(e.pool.KV(), r.pages, old, r.cached)
	}
}

// LoadsDone is closed once the pages a decode request holds from its
// cache's lower tiers all ended their loads (at once when none load); nil
// before Reserve.
func (r *Request) LoadsDone() <-chan struct{} { return r.loadsDone }
