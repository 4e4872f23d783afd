package kvpool

import "fmt"

// Loads: a lower tier of the cache (host memory, files) keeps pages the
// pool evicted, and a request whose prefix is found there gets it back by
// a load into fresh pages of its own. While the load runs the page is
// PageLoading: allocated to the request that waits for it, held by the
// load as by a writer (a Release quarantines it until the load ends), and
// readable by nobody: the read gate refuses it (ErrLoading, counted as a
// read before ready), it cannot be pinned or evicted, and a step cannot
// write it. EndLoad makes it shared (pinned by its request, like a page it
// published) only when the loader says the contents landed and matched
// the checksum kept when the page was first cached; otherwise it is the
// request's own, unwritten page, and the request computes it.

// BeginLoad puts pages of owner's (allocated, nothing written, no writer)
// into PageLoading for the cache keys they will hold, all or none.
func (p *Pool) BeginLoad(owner Owner, ids []int32, keys []CacheKey) error {
	if len(ids) != len(keys) {
		return fmt.Errorf("%w: %d pages, %d keys", ErrBadArg, len(ids), len(keys))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextStamp()
	for _, id := range ids {
		if err := p.owned(owner, id); err != nil {
			return err
		}
		if p.visit(id) {
			return fmt.Errorf("%w: page %d named twice", ErrBadArg, id)
		}
		if pg := &p.pages[id]; pg.written != 0 || pg.writer {
			return fmt.Errorf("%w: page %d of %v is written or has a writer; a load needs a fresh page", ErrBadArg, id, owner)
		}
	}
	for i, id := range ids {
		pg := &p.pages[id]
		pg.state, pg.key, pg.loadHeld = PageLoading, keys[i], true
	}
	p.stats.Loading += len(ids)
	return nil
}

// EndLoad ends the load of page id for owner. ok says the contents
// landed whole and their checksum matched: the page becomes shared under
// its key with owner's pin, complete. Otherwise it becomes owner's own
// page with nothing written (poisoned under Config.Poison). If owner
// released it meanwhile (it is quarantined), it is freed. It reports
// whether the page is now shared.
func (p *Pool) EndLoad(owner Owner, id int32, ok bool) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id < 0 || int(id) >= len(p.pages) {
		return false, fmt.Errorf("%w: page %d (pool has %d)", ErrBadPage, id, len(p.pages))
	}
	pg := &p.pages[id]
	if !pg.loadHeld || pg.room != owner.Room || pg.epoch != owner.Epoch {
		p.stats.ReleaseErrors++
		return false, fmt.Errorf("%w: EndLoad of page %d (%s) by %v", ErrLoading, id, pg.state, owner)
	}
	pg.loadHeld = false
	switch {
	case pg.state == PageQuarantined:
		p.stats.Quarantined--
		p.freePage(id)
		return false, nil
	case !ok:
		p.stats.Loading--
		p.stats.LoadsRefused++
		pg.state, pg.key, pg.written = PageAllocated, CacheKey{}, 0
		if p.cfg.Poison {
			if err := p.poison([]int32{id}); err != nil {
				panic(err)
			}
		}
		return false, nil
	}
	p.stats.Loading--
	p.stats.Allocated--
	p.stats.Shared++
	p.stats.Loaded++
	p.lastEpoch++
	*pg = page{room: CacheRoom, epoch: p.lastEpoch, written: int32(p.cfg.PageSize), state: PageShared, key: pg.key, refs: 1, prev: -1, next: -1}
	p.pins[pin{id, owner}] = struct{}{}
	return true, nil
}

// Loading reports how many of pages are still loading.
func (p *Pool) Loading(pages []int32) int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	n := 0
	for _, id := range pages {
		if id >= 0 && int(id) < len(p.pages) && p.pages[id].state == PageLoading {
			n++
		}
	}
	return n
}

// SetDemoteHook sets what is told about a shared page eviction is about
// to free, while its contents are still there: a lower tier copies them
// (write-back). It runs under the pool's lock, so it must not call the
// pool; it may read the page's memory (KV, PageData).
func (p *Pool) SetDemoteHook(f func(SharedRef)) {
	p.mu.Lock()
	p.onDemote = f
	p.mu.Unlock()
}
