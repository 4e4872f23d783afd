// Package kvpool is the paged KV pool: one block of float32 memory cut into
// pages (in Go memory, or a backend's own such as a GPU's), and the
// bookkeeping that decides who may read, write and free each page.
//
// The bookkeeping exists because of two incidents (see DESIGN.md): a decode
// worker attended over pages that still held another user's KV, and a decode
// worker handed pages to a new request while the old request's remote writes
// were still landing. So every page carries an owner tag that names one use of
// it (room and a pool-wide epoch), a written-token count that says how much of
// it holds real KV, and a second owner, the writer, that must let go before the
// page can be reused.
package kvpool

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/batonlm/baton/internal/kernels"
)

// Errors returned by Pool. Callers test them with errors.Is; the returned
// errors wrap them with the page and tags involved.
var (
	// ErrNoSpace: an allocation asked for more pages than are free. Nothing
	// was allocated.
	ErrNoSpace = errors.New("kvpool: not enough free pages")
	// ErrBadArg: a malformed call (non-positive page count, negative
	// position, a page table too short for the positions asked).
	ErrBadArg = errors.New("kvpool: bad argument")
	// ErrBadPage: a page id outside the pool.
	ErrBadPage = errors.New("kvpool: page id out of range")
	// ErrWrongOwner: the page is allocated, but to another use than the tag
	// given. A stale tag (a use whose pages were freed and reused) lands here.
	ErrWrongOwner = errors.New("kvpool: page owner tag does not match")
	// ErrNotAllocated: the page is free or quarantined, so nobody may read
	// or write it.
	ErrNotAllocated = errors.New("kvpool: page is not allocated")
	// ErrNotWritten: the page is the caller's, but its written count does
	// not cover the positions asked.
	ErrNotWritten = errors.New("kvpool: position not written")
	// ErrBadCount: a written count that would shrink or exceed the page size.
	ErrBadCount = errors.New("kvpool: bad written count")
	// ErrDoubleRelease: the page was already released by this owner (or is
	// free, or is named twice in one call). Always a bug in the caller.
	ErrDoubleRelease = errors.New("kvpool: page released twice")
	// ErrNoWriter: WriterDone or WriterClosed for a page with no writer
	// attached.
	ErrNoWriter = errors.New("kvpool: no writer attached to page")
	// ErrWriterAttached: AttachWriter for a page that already has a writer.
	ErrWriterAttached = errors.New("kvpool: writer already attached to page")
	// ErrNoProof: WriterClosed without a proof. A timeout is not a proof, so
	// the caller has to say what is.
	ErrNoProof = errors.New("kvpool: force reclaim needs a proof that no write can land")
	// ErrShared: a write, mark or writer attachment aimed at a shared
	// (prefix cache) page, which is read-only for its whole life; or a
	// read of one by a request that holds no pin on it.
	ErrShared = errors.New("kvpool: page is shared and read-only")
	// ErrLoading: a read of a page whose contents are still loading from a
	// lower tier of the cache (read-before-ready), or a load call about a
	// page that is not loading.
	ErrLoading = errors.New("kvpool: page is still loading")
	// ErrStale: a shared page named by a cache key it no longer holds (it
	// was evicted, maybe reused). Nothing was pinned or allocated.
	ErrStale = errors.New("kvpool: shared page no longer holds that key")
)

// Config sizes a pool.
type Config struct {
	NumPages int // pages in the pool; all of them are usable
	PageSize int // tokens per page
	Layers   int
	KVHeads  int
	HeadDim  int
	// KVDType is the element type pages are stored in: kernels.F32 (the
	// zero value), F16 or BF16, which take half the memory.
	KVDType kernels.DType
	// Poison fills freed pages (and the pool at start) with NaN so that a
	// read of KV nobody wrote shows up as NaN logits instead of someone
	// else's data.
	Poison bool
	// Data, if set, is the pool's memory (exactly NumPages pages of
	// kernels.PagedKV.PageFloats words) instead of a fresh Go
	// slice: for a transport that must allocate the memory it exposes
	// (ucx.AllocKV). The pool never reallocates it; the caller keeps it
	// valid for the pool's life. Config() returns it as nil.
	Data []float32
	// Device, if set, is the pool's memory instead: a backend's own (a
	// GPU's, from kernels.KVAllocator) of exactly NumPages pages. The
	// caller closes it after the pool's last use. Config() returns it as nil.
	Device kernels.DeviceKV
	// Guards are the pool's isolation checks (guards.go); the zero value
	// is every check. Config() returns it as the zero value.
	Guards Guards
}

// Owner names one use of a page: the request's room and the epoch of the
// allocation. The epoch is what makes a tag go stale when the page is freed
// and reused, even by the same room. The zero Owner never owns anything.
type Owner struct {
	Room  uint64
	Epoch uint64
}

func (o Owner) String() string { return fmt.Sprintf("(room %d, epoch %d)", o.Room, o.Epoch) }

// PageState is where a page is in its life. The zero value is PageInvalid so
// that a lookup of a page outside the pool cannot be mistaken for a real one.
type PageState uint8

// Page states.
const (
	PageInvalid     PageState = iota // not a page of this pool
	PageFree                         // on the free list
	PageAllocated                    // owned by a request (and maybe a writer)
	PageQuarantined                  // released by its request, a writer may still write
	PageShared                       // in the prefix cache: complete, read-only, pinned by its readers
	PageLoading                      // allocated to the request waiting for it, its cached contents still loading from a lower tier
)

func (s PageState) String() string {
	switch s {
	case PageFree:
		return "free"
	case PageAllocated:
		return "allocated"
	case PageQuarantined:
		return "quarantined"
	case PageShared:
		return "shared"
	case PageLoading:
		return "loading"
	}
	return "invalid"
}

// Allocation is the result of a successful Alloc: the tag every later call
// about these pages must present, and the pages in order (page i holds
// positions [i*PageSize, (i+1)*PageSize)).
type Allocation struct {
	Owner Owner
	Pages []int32
}

// PageInfo is a snapshot of one page's bookkeeping.
type PageInfo struct {
	Owner   Owner
	Written int
	State   PageState
	Writer  bool // a writer was attached and has not drained
	Refs    int  // shared pages: how many requests hold a pin
}

// Stats is a snapshot of the pool's gauges and counters.
type Stats struct {
	// Gauges, in pages. Free+Allocated+Quarantined+Shared == Total
	// always; Cached (shared pages nobody pins, evictable) is part of
	// Shared, so Free+Cached+Used() == Total too.
	Total       int
	Free        int
	Allocated   int
	Quarantined int
	Shared      int // prefix cache pages, pinned or not
	Cached      int // shared pages with no pin: the cache's evictable part
	WriterHeld  int // pages with a writer attached (allocated or quarantined)
	// Loading (part of Allocated) are pages a lower tier's load is still
	// filling: nobody reads them until the load ends (EndLoad).
	Loading int

	// Counters since the pool was made.
	Allocations   uint64 // successful Alloc calls
	AllocFailures uint64 // Alloc calls refused for lack of space
	Releases      uint64 // successful Release calls
	WritersDone   uint64 // successful WriterDone calls
	Reclaims      uint64 // successful WriterClosed calls
	PagesFreed    uint64 // pages returned to the free list
	// ReleaseErrors counts refused Release, WriterDone and WriterClosed
	// calls: double releases, wrong or stale tags, free pages, bad ids. Each
	// is a bug in a caller, so tests assert it stays zero.
	ReleaseErrors uint64

	Published uint64 // pages made shared
	Evictions uint64 // shared pages evicted back to the free list
	// SharedWriteRefusals counts writes, marks and writer attachments
	// refused because the page is shared. Each is a bug in a caller (or
	// a peer aiming at a cached page), so tests assert it stays zero.
	SharedWriteRefusals uint64
	// RollbackRefusals counts Rollback calls refused because a page they
	// would lower is not the caller's own private page. Each is a bug in a
	// caller, so tests assert it stays zero.
	RollbackRefusals uint64
	// Loaded counts pages that became shared when their load ended well;
	// LoadsRefused those whose load failed (they stay private, unwritten).
	Loaded, LoadsRefused uint64
	// ReadBeforeReady counts reads the read gate refused because a page
	// was still loading. Anything but 0 on the normal path is a bug: the
	// scheduler waits for a request's loads before it steps it.
	ReadBeforeReady uint64
}

// Used is how many pages someone holds: allocated, quarantined, or
// shared with a pin.
func (s Stats) Used() int { return s.Allocated + s.Quarantined + s.Shared - s.Cached }

// ReclaimRecord remembers one WriterClosed, so that an operator can see why
// quarantined pages were freed without their writer's word.
type ReclaimRecord struct {
	Owner Owner
	Pages []int32
	Freed int // how many of Pages went back to the free list (the rest were still held by the request)
	Proof string
}

// maxReclaimRecords bounds the reclaim log, which keeps the most recent
// proofs for diagnosis, not accounting (Stats counts them all).
const maxReclaimRecords = 64

// page is the bookkeeping of one page. Kept small and in one slice so that
// the per-step read gate walks contiguous memory.
type page struct {
	room, epoch uint64
	written     int32
	state       PageState
	writer      bool
	refs        int32 // shared: pins held
	// loadHeld: a load from a lower tier is writing the page (BeginLoad
	// until EndLoad); like a writer, it keeps the page out of the free
	// list until it ends.
	loadHeld bool
	key      CacheKey // shared: the prefix cache key of its contents
	// prev, next link a cached (shared, unpinned) page into the LRU list;
	// -1 ends it.
	prev, next int32
}

// Pool is a paged KV pool. Its methods are safe for concurrent use; the KV
// memory itself (KV, PageData) is not guarded: the bookkeeping decides who
// may touch which page, and that is the only thing the lock protects.
type Pool struct {
	cfg        Config
	pageFloats int
	data       []float32
	dev        kernels.DeviceKV // the memory, when a backend holds it (data is nil then)

	mu        sync.RWMutex
	pages     []page
	free      []int32 // stack; LIFO reuse makes stale-data bugs show up fast
	lastEpoch uint64
	stats     Stats
	reclaims  []ReclaimRecord

	// seen/stamp detect a page named twice in one call without allocating
	// a set: seen[p] == stamp means p was already visited by this call.
	seen  []uint64
	stamp uint64

	// pins are the (page, reader) pairs of shared pages: the read gate
	// lets a request read a shared page only while it holds one.
	pins map[pin]struct{}
	// lruHead is the least recently unpinned cached page, lruTail the
	// most; eviction takes from the head.
	lruHead, lruTail int32
	guards           guards // the checks, from Config.Guards
	onEvict          func([]SharedRef)
	onDemote         func(SharedRef)
	// sharedRefusals is counted from read-locked paths too, hence atomic.
	sharedRefusals atomic.Uint64
	// readBeforeReady too (the read gate holds the read lock).
	readBeforeReady atomic.Uint64
}

// New makes a pool. All NumPages pages are usable; page ids are 0..NumPages-1.
func New(cfg Config) (*Pool, error) {
	data, dev, g := cfg.Data, cfg.Device, cfg.Guards
	cfg.Data, cfg.Device, cfg.Guards = nil, nil, Guards{} // held in Pool; kept out of cfg so errors do not print them
	if cfg.NumPages <= 0 || cfg.PageSize <= 0 || cfg.Layers <= 0 || cfg.KVHeads <= 0 || cfg.HeadDim <= 0 {
		return nil, fmt.Errorf("%w: config %+v: every size must be positive", ErrBadArg, cfg)
	}
	if cfg.NumPages > math.MaxInt32 || cfg.PageSize > math.MaxInt32 {
		return nil, fmt.Errorf("%w: config %+v: page ids and counts are int32", ErrBadArg, cfg)
	}
	if !kernels.ValidKVDType(cfg.KVDType) {
		return nil, fmt.Errorf("%w: config %+v: KV dtype %s (want f32, f16, bf16 or fp8_e4m3)", ErrBadArg, cfg, cfg.KVDType)
	}
	kv := kernels.PagedKV{PageSize: cfg.PageSize, Layers: cfg.Layers, KVHeads: cfg.KVHeads, HeadDim: cfg.HeadDim, DType: cfg.KVDType}
	pe, ok := mulOK(cfg.Layers, 2, cfg.PageSize, cfg.KVHeads, cfg.HeadDim)
	pf := pe * kv.ElemBytes() / 4
	if !ok || pe != kv.PageElems() {
		return nil, fmt.Errorf("%w: config %+v: page size overflows", ErrBadArg, cfg)
	}
	if pe*kv.ElemBytes()%4 != 0 {
		return nil, fmt.Errorf("%w: config %+v: a page of %d %s elements is not a whole number of words (an odd head dim)", ErrBadArg, cfg, pe, cfg.KVDType)
	}
	total, ok := mulOK(pf, cfg.NumPages)
	if !ok || total > math.MaxInt/4 {
		return nil, fmt.Errorf("%w: config %+v: pool size overflows", ErrBadArg, cfg)
	}
	switch {
	case dev != nil && data != nil:
		return nil, fmt.Errorf("%w: config %+v: both Data and Device set", ErrBadArg, cfg)
	case dev != nil:
		if dev.Pages() != cfg.NumPages {
			return nil, fmt.Errorf("%w: config %+v: Device holds %d pages", ErrBadArg, cfg, dev.Pages())
		}
	case data == nil:
		data = make([]float32, total)
		prefault(data)
	case len(data) != total:
		return nil, fmt.Errorf("%w: config %+v: Data holds %d floats, the pool needs %d", ErrBadArg, cfg, len(data), total)
	}
	p := &Pool{
		cfg:        cfg,
		pageFloats: pf,
		data:       data,
		dev:        dev,
		pages:      make([]page, cfg.NumPages),
		free:       make([]int32, cfg.NumPages),
		seen:       make([]uint64, cfg.NumPages),
		pins:       map[pin]struct{}{},
		lruHead:    -1,
		lruTail:    -1,
		guards:     g.withChecks(),
	}
	for i := range p.pages {
		p.pages[i] = page{state: PageFree, prev: -1, next: -1}
		// Pushed in reverse so that a fresh pool hands out 0, 1, 2, ...
		p.free[i] = int32(cfg.NumPages - 1 - i)
	}
	if cfg.Poison {
		if err := p.poison(nil); err != nil {
			return nil, err
		}
	}
	p.stats.Total = cfg.NumPages
	p.stats.Free = cfg.NumPages
	return p, nil
}

func mulOK(xs ...int) (int, bool) {
	r := 1
	for _, x := range xs {
		if x != 0 && r > math.MaxInt/x {
			return 0, false
		}
		r *= x
	}
	return r, true
}

// poison fills pages (all for nil) with NaN, of the pool's dtype
// (kernels.KVNaN is NaN read as float32 or as halves).
func (p *Pool) poison(ids []int32) error {
	if p.dev != nil {
		if err := p.dev.Fill(ids, kernels.KVNaN); err != nil {
			return fmt.Errorf("kvpool: poisoning pages: %w", err)
		}
		return nil
	}
	if ids == nil {
		fillNaN(p.data)
	}
	for _, id := range ids {
		fillNaN(p.PageData(id))
	}
	return nil
}

func fillNaN(s []float32) {
	if len(s) == 0 {
		return
	}
	s[0] = kernels.KVNaN
	for i := 1; i < len(s); i *= 2 {
		copy(s[i:], s[:i])
	}
}

// KV exposes the pool memory for kernels.
func (p *Pool) KV() kernels.PagedKV {
	return kernels.PagedKV{Data: p.data, Device: p.dev, PageSize: p.cfg.PageSize, Layers: p.cfg.Layers, KVHeads: p.cfg.KVHeads, HeadDim: p.cfg.HeadDim, DType: p.cfg.KVDType}
}

// PageData is the memory of one page (all layers, K then V), the unit a
// transfer moves, for a pool in Go memory (nil for one in device memory).
// It panics on an id outside the pool, like a slice would.
func (p *Pool) PageData(id int32) []float32 {
	if p.dev != nil {
		return nil
	}
	o := int(id) * p.pageFloats
	return p.data[o : o+p.pageFloats : o+p.pageFloats]
}

// Config returns the configuration the pool was made with.
func (p *Pool) Config() Config { return p.cfg }

// PageBytes is the size of one page in bytes.
func (p *Pool) PageBytes() int { return p.pageFloats * 4 }

// NumPages is the number of pages in the pool.
func (p *Pool) NumPages() int { return p.cfg.NumPages }

// PageSize is the number of tokens a page holds.
func (p *Pool) PageSize() int { return p.cfg.PageSize }

// CapacityTokens is how many tokens the whole pool can hold; the server
// compares it with the configured context length at start-up.
func (p *Pool) CapacityTokens() int { return p.cfg.NumPages * p.cfg.PageSize }

// PagesFor is how many pages hold tokens positions.
func (p *Pool) PagesFor(tokens int) int {
	if tokens <= 0 {
		return 0
	}
	return (tokens + p.cfg.PageSize - 1) / p.cfg.PageSize
}

// Free is the number of free pages.
func (p *Pool) Free() int {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return len(p.free)
}

// Stats returns a snapshot of the gauges and counters.
func (p *Pool) Stats() Stats {
	p.mu.RLock()
	defer p.mu.RUnlock()
	s := p.stats
	s.SharedWriteRefusals = p.sharedRefusals.Load()
	s.ReadBeforeReady = p.readBeforeReady.Load()
	return s
}

// Reclaims returns the most recent WriterClosed records, oldest first.
func (p *Pool) Reclaims() []ReclaimRecord {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]ReclaimRecord, len(p.reclaims))
	copy(out, p.reclaims)
	return out
}

// Owner looks up one page: its tag, written count and state. A page outside
// the pool reports PageInvalid.
func (p *Pool) Owner(id int32) (Owner, int, PageState) {
	in := p.Info(id)
	return in.Owner, in.Written, in.State
}

// Info looks up one page, including whether a writer holds it.
func (p *Pool) Info(id int32) PageInfo {
	if id < 0 || int(id) >= len(p.pages) {
		return PageInfo{}
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.info(id)
}

// info is Info for a caller holding p.mu.
func (p *Pool) info(id int32) PageInfo {
	pg := &p.pages[id]
	return PageInfo{Owner: Owner{pg.room, pg.epoch}, Written: int(pg.written), State: pg.state, Writer: pg.writer, Refs: int(pg.refs)}
}

// Alloc takes n pages for room under a fresh epoch, or none at all: a
// request that cannot get all its pages must not hold some of them while it
// waits or is rejected. The pages start with written count 0. When the free
// list is short, cached pages nobody pins are evicted to make room.
func (p *Pool) Alloc(room uint64, n int) (Allocation, error) {
	if n <= 0 {
		return Allocation{}, fmt.Errorf("%w: alloc of %d pages", ErrBadArg, n)
	}
	return p.AllocPinned(room, n, nil)
}

// AllocPinned is Alloc for a request whose prefix is in the prefix cache:
// under one fresh tag it pins the shared pages refs (each must still hold
// its key) and takes n fresh pages, or does nothing. The allocation's page
// table is the shared pages then the fresh ones; Release of that table
// unpins the first and frees the others. Pinning comes before eviction, so
// making room never takes a page this request is about to read.
func (p *Pool) AllocPinned(room uint64, n int, refs []SharedRef) (Allocation, error) {
	if n < 0 || n+len(refs) == 0 {
		return Allocation{}, fmt.Errorf("%w: alloc of %d pages and %d shared", ErrBadArg, n, len(refs))
	}
	p.mu.Lock()
	var evicted []SharedRef
	defer func() {
		hook := p.onEvict
		p.mu.Unlock()
		// Outside the lock: the hook takes the index's lock, and the index
		// may call the pool while holding it.
		if hook != nil && len(evicted) > 0 {
			hook(evicted)
		}
	}()
	pinNow := 0 // refs that are cached now and stop being evictable
	p.nextStamp()
	for _, r := range refs {
		if err := p.checkRef(r); err != nil {
			return Allocation{}, err
		}
		if p.visit(r.Page) {
			return Allocation{}, fmt.Errorf("%w: shared page %d named twice", ErrBadArg, r.Page)
		}
		if p.pages[r.Page].refs == 0 {
			pinNow++
		}
	}
	if n > len(p.free)+p.guards.spare(p)-pinNow {
		p.stats.AllocFailures++
		return Allocation{}, fmt.Errorf("%w: room %d asked for %d pages, %d free and %d cached of %d", ErrNoSpace, room, n, len(p.free), p.stats.Cached-pinNow, len(p.pages))
	}
	p.lastEpoch++
	o := Owner{Room: room, Epoch: p.lastEpoch}
	ids := make([]int32, 0, len(refs)+n)
	for _, r := range refs {
		p.pinPage(r.Page, o)
		ids = append(ids, r.Page)
	}
	for len(p.free) < n {
		evicted = append(evicted, p.evictOne())
	}
	top := len(p.free)
	for i := range n {
		id := p.free[top-1-i]
		ids = append(ids, id)
		p.pages[id] = page{room: o.Room, epoch: o.Epoch, state: PageAllocated, prev: -1, next: -1}
	}
	p.free = p.free[:top-n]
	p.stats.Allocations++
	p.stats.Free -= n
	p.stats.Allocated += n
	return Allocation{Owner: o, Pages: ids}, nil
}

// owned checks that id is a page allocated to o. Callers hold p.mu.
func (p *Pool) owned(o Owner, id int32) error {
	if id < 0 || int(id) >= len(p.pages) {
		return fmt.Errorf("%w: page %d (pool has %d)", ErrBadPage, id, len(p.pages))
	}
	pg := &p.pages[id]
	if pg.state == PageShared {
		p.sharedRefusals.Add(1)
		return fmt.Errorf("%w: page %d is in the prefix cache, asked to write by %v", ErrShared, id, o)
	}
	if pg.state != PageAllocated {
		return fmt.Errorf("%w: page %d is %s, asked by %v", ErrNotAllocated, id, pg.state, o)
	}
	if pg.room != o.Room || pg.epoch != o.Epoch {
		return fmt.Errorf("%w: page %d belongs to %v, asked by %v", ErrWrongOwner, id, Owner{pg.room, pg.epoch}, o)
	}
	return nil
}

// MarkWritten records that the first tokens slots of page hold real KV for
// owner. The count only grows (a re-mark with the same count is a no-op), so
// a late or reordered message can never make written KV look unwritten or
// the other way round.
func (p *Pool) MarkWritten(owner Owner, id int32, tokens int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.owned(owner, id); err != nil {
		return err
	}
	pg := &p.pages[id]
	if tokens < int(pg.written) || tokens > p.cfg.PageSize {
		return fmt.Errorf("%w: page %d: mark %d tokens, written %d, page size %d", ErrBadCount, id, tokens, pg.written, p.cfg.PageSize)
	}
	pg.written = int32(tokens)
	return nil
}

// MarkPositions records that positions [0, positions) of the sequence whose
// page table is pages hold real KV: the standalone scheduler's way to say a
// prefill chunk or decode step was stored. Either every page is updated or
// none. Counts never shrink.
func (p *Pool) MarkPositions(owner Owner, pages []int32, positions int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	need, err := p.span(pages, positions)
	if err != nil {
		return err
	}
	for _, id := range pages[:need] {
		// A shared page the request reads is already complete: marking it
		// changes nothing and is allowed. Anything else about it is a write.
		if p.sharedPinned(owner, id) || p.loadingOwned(owner, id) {
			continue
		}
		if err := p.owned(owner, id); err != nil {
			return err
		}
	}
	for i, id := range pages[:need] {
		if st := p.pages[id].state; st == PageShared || st == PageLoading {
			continue
		}
		w := int32(min(p.cfg.PageSize, positions-i*p.cfg.PageSize))
		if pg := &p.pages[id]; pg.written < w {
			pg.written = w
		}
	}
	return nil
}

// span is how many leading entries of a page table cover positions.
func (p *Pool) span(pages []int32, positions int) (int, error) {
	if positions < 0 {
		return 0, fmt.Errorf("%w: %d positions", ErrBadArg, positions)
	}
	need := p.PagesFor(positions)
	if need > len(pages) {
		return 0, fmt.Errorf("%w: %d positions need %d pages, page table has %d", ErrBadArg, positions, need, len(pages))
	}
	return need, nil
}

// CheckReadable is the read gate, run when a batch is built, on every step:
// positions [0, positions) of a sequence may be attended over only if every
// page holding them is allocated to owner and written that far, or is a
// shared page (complete, read-only) on which owner holds a pin. It reads no
// KV, so a failure here means the request must abort before any kernel sees
// someone else's (or no one's) data.
func (p *Pool) CheckReadable(owner Owner, pages []int32, positions int) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	need, err := p.span(pages, positions)
	if err != nil {
		return err
	}
	for i, id := range pages[:need] {
		if id >= 0 && int(id) < len(p.pages) && p.pages[id].state == PageShared {
			if !p.sharedPinned(owner, id) {
				return fmt.Errorf("%w: page %d (index %d) is shared and %v holds no pin on it", ErrShared, id, i, owner)
			}
			continue // complete by construction: only full pages are published
		}
		if id >= 0 && int(id) < len(p.pages) && p.guards.Loading(p.pages[id].state) {
			p.readBeforeReady.Add(1)
			return fmt.Errorf("%w: page %d (index %d) of %v", ErrLoading, id, i, owner)
		}
		if p.loadingOwned(owner, id) {
			continue // only with the load guard off (faults build)
		}
		if err := p.owned(owner, id); err != nil {
			return err
		}
		want := min(p.cfg.PageSize, positions-i*p.cfg.PageSize)
		if w := int(p.pages[id].written); w < want {
			return fmt.Errorf("%w: page %d (index %d) of %v has %d tokens written, read needs %d (positions %d..%d)",
				ErrNotWritten, id, i, owner, w, want, i*p.cfg.PageSize+w, i*p.cfg.PageSize+want-1)
		}
	}
	return nil
}

// visit marks id as seen by the current call and reports whether it was
// already. Callers hold p.mu and call nextStamp once per call first.
func (p *Pool) visit(id int32) bool {
	dup := p.seen[id] == p.stamp
	p.seen[id] = p.stamp
	return dup
}

func (p *Pool) nextStamp() { p.stamp++ }

// AttachWriter records that a writer (a transfer peer) was given the address
// of these pages, so they have a second owner: Release alone will no longer
// free them. Call it before the address leaves the process, not after.
func (p *Pool) AttachWriter(owner Owner, pages []int32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextStamp()
	for _, id := range pages {
		if err := p.owned(owner, id); err != nil {
			return err
		}
		if p.visit(id) {
			return fmt.Errorf("%w: page %d named twice", ErrBadArg, id)
		}
		if p.pages[id].writer {
			return fmt.Errorf("%w: page %d of %v", ErrWriterAttached, id, owner)
		}
	}
	for _, id := range pages {
		p.pages[id].writer = true
	}
	p.stats.WriterHeld += len(pages)
	return nil
}

// Release is the request letting go of its pages (it reached a terminal
// state). A page no writer holds goes back to the free list; a page a writer
// still holds goes to quarantine until WriterDone or WriterClosed. The
// call is all-or-nothing: any page that is not allocated to owner (free,
// already released, someone else's, named twice) makes it change nothing and
// return an error, which is counted as a bug.
func (p *Pool) Release(owner Owner, pages []int32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nextStamp()
	for _, id := range pages {
		if err := p.checkRelease(owner, id); err != nil {
			p.stats.ReleaseErrors++
			return err
		}
	}
	// Shared pages are unpinned last page first, so that a prefix's pages
	// become evictable leaves before roots: the LRU takes the page whose
	// loss costs the fewest hits.
	for i := len(pages) - 1; i >= 0; i-- {
		if id := pages[i]; p.pages[id].state == PageShared {
			p.unpinPage(id, owner)
		}
	}
	for _, id := range pages {
		pg := &p.pages[id]
		if pg.state == PageShared {
			continue
		}
		if pg.state == PageLoading {
			p.stats.Loading--
		}
		if pg.writer || pg.loadHeld {
			pg.state = PageQuarantined
			p.stats.Allocated--
			p.stats.Quarantined++
		} else {
			p.stats.Allocated--
			p.freePage(id)
		}
	}
	p.stats.Releases++
	return nil
}

func (p *Pool) checkRelease(o Owner, id int32) error {
	if id < 0 || int(id) >= len(p.pages) {
		return fmt.Errorf("%w: release of page %d (pool has %d)", ErrBadPage, id, len(p.pages))
	}
	if p.visit(id) {
		return fmt.Errorf("%w: page %d named twice in one release by %v", ErrDoubleRelease, id, o)
	}
	pg := &p.pages[id]
	switch {
	case pg.state == PageShared:
		if !p.sharedPinned(o, id) {
			return fmt.Errorf("%w: shared page %d released by %v, which holds no pin on it", ErrDoubleRelease, id, o)
		}
		return nil
	case pg.state == PageFree:
		return fmt.Errorf("%w: page %d is already free, released by %v", ErrDoubleRelease, id, o)
	case pg.room != o.Room || pg.epoch != o.Epoch:
		return fmt.Errorf("%w: release of page %d by %v, page belongs to %v", ErrWrongOwner, id, o, Owner{pg.room, pg.epoch})
	case pg.state == PageQuarantined:
		return fmt.Errorf("%w: page %d already released by %v (quarantined, writer pending)", ErrDoubleRelease, id, o)
	}
	return nil
}

// loadingOwned reports whether id is a page loading for owner. Callers
// hold p.mu.
func (p *Pool) loadingOwned(owner Owner, id int32) bool {
	if id < 0 || int(id) >= len(p.pages) {
		return false
	}
	pg := &p.pages[id]
	return pg.state == PageLoading && pg.room == owner.Room && pg.epoch == owner.Epoch
}

// WriterDone is the writer's word (its Commit, or Drained after an abort)
// that no write to these pages is in flight and none will come. Pages
// their request already released leave quarantine and are freed; pages
// the request still holds just lose their second owner, so the request's
// Release frees them at once.
func (p *Pool) WriterDone(owner Owner, pages []int32) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkWriter(owner, pages); err != nil {
		p.stats.ReleaseErrors++
		return err
	}
	p.dropWriter(pages)
	p.stats.WritersDone++
	return nil
}

// WriterClosed drops the writer of these pages on the transport's proof
// that no write of it can land any more (connection closed and its
// receiver joined, endpoint flushed and destroyed, peer process gone):
// the normal end of a writer on a transport whose receiver writes the
// pages, and the way out after a crash. proof says which; it is kept in
// the reclaim log. A timeout is not a proof: without one the pages stay
// quarantined, because a late write into a reused page corrupts another
// request silently.
func (p *Pool) WriterClosed(owner Owner, pages []int32, proof string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if proof == "" {
		p.stats.ReleaseErrors++
		return fmt.Errorf("%w: %v", ErrNoProof, owner)
	}
	if err := p.checkWriter(owner, pages); err != nil {
		p.stats.ReleaseErrors++
		return err
	}
	freed := p.dropWriter(pages)
	p.stats.Reclaims++
	rec := ReclaimRecord{Owner: owner, Pages: append([]int32(nil), pages...), Freed: freed, Proof: proof}
	if len(p.reclaims) == maxReclaimRecords {
		copy(p.reclaims, p.reclaims[1:])
		p.reclaims = p.reclaims[:maxReclaimRecords-1]
	}
	p.reclaims = append(p.reclaims, rec)
	return nil
}

// checkWriter validates a writer-side call: every page is owner's (allocated
// or quarantined) and has a writer attached. Callers hold p.mu.
func (p *Pool) checkWriter(o Owner, pages []int32) error {
	p.nextStamp()
	for _, id := range pages {
		if id < 0 || int(id) >= len(p.pages) {
			return fmt.Errorf("%w: page %d (pool has %d)", ErrBadPage, id, len(p.pages))
		}
		if p.visit(id) {
			return fmt.Errorf("%w: page %d named twice by writer of %v", ErrDoubleRelease, id, o)
		}
		pg := &p.pages[id]
		if pg.state == PageFree {
			return fmt.Errorf("%w: page %d is free, writer of %v let go twice", ErrDoubleRelease, id, o)
		}
		if pg.room != o.Room || pg.epoch != o.Epoch {
			return fmt.Errorf("%w: writer of %v let go of page %d, page belongs to %v", ErrWrongOwner, o, id, Owner{pg.room, pg.epoch})
		}
		if !pg.writer {
			return fmt.Errorf("%w: page %d of %v", ErrNoWriter, id, o)
		}
		if pg.loadHeld {
			return fmt.Errorf("%w: page %d of %v is held by a load, not a transfer writer", ErrNoWriter, id, o)
		}
	}
	return nil
}

// dropWriter removes the writer from validated pages and frees those whose
// request already released them. Callers hold p.mu.
func (p *Pool) dropWriter(pages []int32) (freed int) {
	for _, id := range pages {
		pg := &p.pages[id]
		pg.writer = false
		p.stats.WriterHeld--
		if pg.state == PageQuarantined {
			p.stats.Quarantined--
			p.freePage(id)
			freed++
		}
	}
	return freed
}

// freePage returns a page that has no owner left to the free list: the one
// place a page is freed. A private page comes here when its request is
// terminal and its writer drained (Release, dropWriter); a shared page when
// it has no pin and is evicted (evictOne). The caller has already taken it
// out of its gauge.
func (p *Pool) freePage(id int32) {
	p.pages[id] = page{state: PageFree, prev: -1, next: -1}
	if p.cfg.Poison {
		// Under the lock on purpose: the page must not be handed out again
		// before it is poisoned, and poison is a test mode (where a device
		// that cannot be written is a failure to show at once).
		if err := p.poison([]int32{id}); err != nil {
			panic(err)
		}
	}
	p.free = append(p.free, id)
	p.stats.Free++
	p.stats.PagesFreed++
}

// Rollback lowers the written counts of the sequence whose page table is
// pages so that positions [0, positions) stay written and nothing beyond
// them does: speculative decoding stores the KV of draft tokens before the
// target has judged them, and the rejected ones must not read as written
// afterwards. Only pages allocated to owner are lowered; a page beyond
// positions that is shared (prefix cache), another owner's, or not
// allocated refuses the whole call, which changes nothing and is counted
// (Stats.RollbackRefusals). Owner tags are unchanged.
func (p *Pool) Rollback(owner Owner, pages []int32, positions int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if positions < 0 {
		p.stats.RollbackRefusals++
		return fmt.Errorf("%w: roll back to %d positions", ErrBadArg, positions)
	}
	ps := p.cfg.PageSize
	var lower []int32
	for i, id := range pages {
		keep := min(ps, max(0, positions-i*ps))
		if id >= 0 && int(id) < len(p.pages) && int(p.pages[id].written) <= keep {
			continue // nothing beyond positions to take back here
		}
		if err := p.owned(owner, id); err != nil {
			p.stats.RollbackRefusals++
			return fmt.Errorf("kvpool: rollback refused: %w", err)
		}
		lower = append(lower, int32(i))
	}
	for _, i := range lower {
		p.pages[pages[i]].written = int32(min(ps, max(0, positions-int(i)*ps)))
	}
	return nil
}
