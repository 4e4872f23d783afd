//go:build faults

package scheduler

import (
	"sync/atomic"

	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kvpool"
)

// rewrote makes cache_rewrite fault one request only, so that the ones
// after it show whether the shared page survived.
var rewrote atomic.Bool

func init() {
	// With BATON_GUARDS_OFF=cache_write a step stores KV wherever its page
	// table points, shared pages included.
	if !faults.On(faults.GuardCacheWrite) {
		writable = func(*Engine, *Request, int, int) error { return nil }
	}
	sp := faults.Active()
	if sp == nil || (!sp.CacheRewrite && !sp.CachePublishEarly) {
		return
	}
	alloc := allocate
	allocate = func(e *Engine, r *Request) (kvpool.Allocation, int, error) {
		a, cached, err := alloc(e, r)
		if err != nil {
			return a, cached, err
		}
		ps := e.pool.PageSize()
		if sp.CacheRewrite && cached > 0 && rewrote.CompareAndSwap(false, true) {
			// Start one page early, over other tokens: the step would
			// store their KV into the last cached page, which others read.
			cached -= ps
			p := append([]int32(nil), r.Prompt...)
			for i := cached; i < cached+ps; i++ {
				p[i] = int32((int(p[i]) + 7) % e.model.Config.Vocab)
			}
			r.Prompt = p
		}
		if sp.CachePublishEarly && e.cfg.PrefixCache != nil {
			// Offer the prompt's pages before any of them is written.
			_, _ = e.cfg.PrefixCache.Publish(r.Params.Tenant, a.Owner, a.Pages, r.Prompt)
		}
		return a, cached, nil
	}
}
