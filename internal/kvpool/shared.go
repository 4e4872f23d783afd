package kvpool

import (
	"fmt"
	"math"

	"github.com/batonlm/baton/internal/request"
)

// Shared pages are the prefix cache's. A page becomes shared only when the
// request that owns it wrote it completely and no writer holds it
// (Publish); from then on nobody writes it again. Readers pin it (a pinned
// page is never evicted) and the read gate lets a request read it only
// while it holds a pin. A shared page nobody pins is "cached": it stays
// readable by the next request that finds its key, until eviction takes it
// back to the free list (poisoned under Config.Poison like any freed page).

// CacheRoom is the room of every shared page's owner tag: no request has
// it, so no request's tag ever matches a shared page.
const CacheRoom = math.MaxUint64

// CacheKey names the contents of a shared page: the prefix cache's chained
// hash of everything that determines them (tenant, model, layout, the
// tokens up to the end of the page).
type CacheKey = request.CacheKey

// SharedRef names a shared page by id and by the key it must hold, so that
// a page evicted and reused for something else is never mistaken for it.
type SharedRef struct {
	Page int32
	Key  CacheKey
}

// pin is one reader's hold on one shared page.
type pin struct {
	page  int32
	owner Owner
}

// SetEvictHook sets what is told about pages eviction took (the prefix
// cache's index, which drops their keys). It runs outside the pool's lock,
// after the allocation that evicted them.
func (p *Pool) SetEvictHook(f func([]SharedRef)) {
	p.mu.Lock()
	p.onEvict = f
	p.mu.Unlock()
}

// Available is how many pages an allocation could get now: the free ones
// and the cached ones eviction would take.
func (p *Pool) Available() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.free) + p.guards.spare(p)
}

// Publish makes a page of owner's shared under key: it must be allocated
// to owner, written to the last slot and held by no writer, so that what
// enters the cache is complete and nobody can still be writing it. owner
// keeps a pin on it (its page table still names it), and its later
// Release unpins it instead of freeing it.
func (p *Pool) Publish(owner Owner, id int32, key CacheKey) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.owned(owner, id); err != nil {
		return err
	}
	pg := &p.pages[id]
	if err := p.guards.Shareable(id, p.info(id), p.cfg.PageSize); err != nil {
		return err
	}
	p.lastEpoch++
	*pg = page{room: CacheRoom, epoch: p.lastEpoch, written: pg.written, state: PageShared, key: key, prev: -1, next: -1}
	pg.refs = 1
	p.pins[pin{id, owner}] = struct{}{}
	p.stats.Allocated--
	p.stats.Shared++
	p.stats.Published++
	return nil
}

// shareable is the publish rule: a page enters the cache only written to
// its last slot (pageSize tokens) and with no writer that could still
// change it.
func shareable(id int32, pg PageInfo, pageSize int) error {
	switch {
	case pg.Written != pageSize:
		return fmt.Errorf("%w: page %d of %v has %d of %d tokens written; only complete pages are shared",
			ErrNotWritten, id, pg.Owner, pg.Written, pageSize)
	case pg.Writer:
		return fmt.Errorf("%w: page %d of %v still has a writer; it cannot be shared", ErrWriterAttached, id, pg.Owner)
	}
	return nil
}

// checkRef validates a shared page named for pinning. Callers hold p.mu.
func (p *Pool) checkRef(r SharedRef) error {
	if r.Page < 0 || int(r.Page) >= len(p.pages) {
		return fmt.Errorf("%w: page %d (pool has %d)", ErrBadPage, r.Page, len(p.pages))
	}
	if pg := &p.pages[r.Page]; pg.state != PageShared || pg.key != r.Key {
		return fmt.Errorf("%w: page %d is %s", ErrStale, r.Page, pg.state)
	}
	return nil
}

// sharedPinned reports whether id is a shared page owner holds a pin on.
// Callers hold p.mu (read or write).
func (p *Pool) sharedPinned(owner Owner, id int32) bool {
	if id < 0 || int(id) >= len(p.pages) || p.pages[id].state != PageShared {
		return false
	}
	_, ok := p.pins[pin{id, owner}]
	return ok
}

// pinPage adds owner's pin to a validated shared page. Callers hold p.mu.
func (p *Pool) pinPage(id int32, owner Owner) {
	pg := &p.pages[id]
	if pg.refs == 0 {
		p.lruRemove(id)
		p.stats.Cached--
	}
	pg.refs++
	p.pins[pin{id, owner}] = struct{}{}
}

// unpinPage drops owner's pin (checked by the caller); a page left with
// none becomes cached, the most recently used. Callers hold p.mu.
func (p *Pool) unpinPage(id int32, owner Owner) {
	delete(p.pins, pin{id, owner})
	pg := &p.pages[id]
	pg.refs--
	if pg.refs == 0 {
		p.lruPush(id)
		p.stats.Cached++
	}
}

// evictable is the eviction rule for shared pages: nobody pins it and no
// writer holds it.
func evictable(pg *page) bool { return pg.state == PageShared && pg.refs == 0 && !pg.writer }

// The eviction rule as allocation sees it: spare is how many pages eviction
// may take (the cached ones, nobody's pin), victim the next to go (the least
// recently used cached page). Callers hold p.mu.
func spare(p *Pool) int    { return p.stats.Cached }
func victim(p *Pool) int32 { return p.lruHead }

// evictOne frees the next victim among cached pages. Callers hold p.mu
// and have checked that one exists.
func (p *Pool) evictOne() SharedRef {
	id := p.guards.victim(p)
	pg := &p.pages[id]
	if !evictable(pg) {
		panic(fmt.Sprintf("kvpool: page %d on the cached list is %s with %d pins", id, pg.state, pg.refs))
	}
	ref := SharedRef{Page: id, Key: pg.key}
	if p.onDemote != nil {
		p.onDemote(ref)
	}
	p.lruRemove(id)
	p.stats.Cached--
	p.stats.Shared--
	p.stats.Evictions++
	p.freePage(id)
	return ref
}

// EvictCached evicts up to n cached pages (all of them for n < 0), least
// recently used first, and returns how many went.
func (p *Pool) EvictCached(n int) int {
	p.mu.Lock()
	var evicted []SharedRef
	for (n < 0 || len(evicted) < n) && p.lruHead >= 0 {
		evicted = append(evicted, p.evictOne())
	}
	hook := p.onEvict
	p.mu.Unlock()
	if hook != nil && len(evicted) > 0 {
		hook(evicted)
	}
	return len(evicted)
}

func (p *Pool) lruPush(id int32) {
	pg := &p.pages[id]
	pg.prev, pg.next = p.lruTail, -1
	if p.lruTail >= 0 {
		p.pages[p.lruTail].next = id
	} else {
		p.lruHead = id
	}
	p.lruTail = id
}

func (p *Pool) lruRemove(id int32) {
	pg := &p.pages[id]
	if pg.prev >= 0 {
		p.pages[pg.prev].next = pg.next
	} else {
		p.lruHead = pg.next
	}
	if pg.next >= 0 {
		p.pages[pg.next].prev = pg.prev
	} else {
		p.lruTail = pg.prev
	}
	pg.prev, pg.next = -1, -1
}

// CheckWritable is the write gate, run before a step stores KV: positions
// [from, to) of the sequence whose page table is pages must all fall in
// pages allocated to owner. A shared page there is refused and counted:
// the step would overwrite KV that other requests read.
func (p *Pool) CheckWritable(owner Owner, pages []int32, from, to int) error {
	if from < 0 || to < from {
		return fmt.Errorf("%w: write of positions %d..%d", ErrBadArg, from, to)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	need, err := p.span(pages, to)
	if err != nil {
		return err
	}
	for _, id := range pages[from/p.cfg.PageSize : need] {
		if err := p.owned(owner, id); err != nil {
			return err
		}
	}
	return nil
}
