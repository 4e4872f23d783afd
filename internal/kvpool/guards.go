package kvpool

// Guards are the pool's isolation checks. A nil function field is the
// real check and a false switch leaves the check on, so the zero value
// (what every build but the faults one passes) keeps every check; only the
// faults build's command (cmd/baton/guards_faults.go, BATON_GUARDS_OFF)
// sets a field, to what a pool without the check would do.
type Guards struct {
	// Shareable refuses to publish page id unless it is written to its last slot and has no writer (cache_complete).
	Shareable func(id int32, pg PageInfo, pageSize int) error
	// Loading says the read gate refuses a page in this state as read before ready: still loading (load_ready).
	Loading func(PageState) bool
	// EvictPinned, set only by the faults build (cache_pin off), makes eviction take shared pages others pin.
	// It is a switch, not a function, because what a pool without the pin rule does reaches into the
	// pool's own lock-held state; the pool reads it once, in New.
	EvictPinned bool
}

// guards are Guards as the pool calls them: the eviction rule (spare,
// victim) is chosen once, in New.
type guards struct {
	Guards
	spare  func(*Pool) int
	victim func(*Pool) int32
}

func (g Guards) withChecks() guards {
	if g.Shareable == nil {
		g.Shareable = shareable
	}
	if g.Loading == nil {
		g.Loading = func(s PageState) bool { return s == PageLoading }
	}
	if g.EvictPinned {
		return guards{g, spareShared, victimPinned}
	}
	return guards{g, spare, victim}
}

// spareShared and victimPinned are eviction without the pin rule (cache_pin
// off, faults build only): every shared page counts as spare and pinned
// ones go first, their pins forgotten, as a pool that forgot its readers
// would do. Callers hold p.mu.
func spareShared(p *Pool) int { return p.stats.Shared }

func victimPinned(p *Pool) int32 {
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
