//go:build faults

package kvpool

import "github.com/batonlm/baton/internal/faults"

func init() {
	// With BATON_GUARDS_OFF=cache_complete any page of its owner's can be
	// shared, written or not, held by a writer or not.
	if !faults.On(faults.GuardCacheComplete) {
		shareable = func(*Pool, int32, Owner) error { return nil }
	}
	// With BATON_GUARDS_OFF=load_ready the read gate lets a step read a
	// page of its own that is still loading.
	if !faults.On(faults.GuardLoadReady) {
		loadGuard = false
	}
	// With BATON_GUARDS_OFF=cache_pin eviction counts every shared page as
	// spare and takes pinned ones first: what a pool that forgot its
	// readers would do.
	if !faults.On(faults.GuardCachePin) {
		spare = func(p *Pool) int { return p.stats.Shared }
		victim = func(p *Pool) int32 {
			for id := range p.pages {
				if pg := &p.pages[id]; pg.state == PageShared && pg.refs > 0 {
					for pn := range p.pins {
						if pn.page == int32(id) {
							delete(p.pins, pn)
						}
					}
					pg.refs = 0
					p.lruPush(int32(id))
					p.stats.Cached++
					return int32(id)
				}
			}
			return p.lruHead
		}
	}
}
