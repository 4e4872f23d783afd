// Package hicache is the hierarchical KV cache: the tiers below the pool's
// shared pages. L1 is the pool (prefixcache indexes it); L2 is a region of
// host memory holding packed pages; L3 is a Store (files on local disk).
// A shared page eviction takes from the pool goes down to L2 (at eviction
// under write_back, already there from its publish under write_through);
// L2 evicts into L3. A prompt whose prefix runs on past L1 into L2/L3 gets
// those pages back by loads into fresh pool pages of its own, which stay
// PageLoading (unreadable) until their load landed and the landed bytes
// have the checksum recorded when the page was first cached.
//
// Loads run on loader goroutines, never on the engine loop: a request's
// pages load one after another, in page order, while the engine steps
// other requests. The first page that fails (gone from its tier, checksum
// mismatch) and every page after it end as the request's own unwritten
// pages, which it computes: a load is a miss, never wrong KV.
//
// Tenants: every page keeps the hash of its tenant's salt beside its key,
// and a lookup compares it (L2) or the store does (L3), besides the key
// itself being chained from the salt.
package hicache

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
)

// Store is L3: pages by cache key, each with its tenant's salt hash and the
// checksum recorded at publish. internal/hicache/filestore's *Store is one
// (files under a directory, carrying the model fingerprint, layout and
// dtype of Meta).
type Store interface {
	// Put keeps page (packed bytes) under key; it may evict older pages.
	Put(key [2]uint64, saltHash [16]byte, page []byte, checksum uint64) error
	// Get fills dst (exactly one packed page) with the page under key,
	// only if it was put with saltHash and its bytes match its checksum.
	Get(key [2]uint64, saltHash [16]byte, dst []byte) (checksum uint64, ok bool)
	// Has reports whether a page is kept under key.
	Has(key [2]uint64) bool
}

// Meta is what an L3 store must agree with for its pages to be this
// pool's: the model fingerprint (prefixcache's), the KV page layout and
// the dtype.
type Meta struct {
	Fingerprint, Layout, DType string
}

// MetaOf describes pool's pages for model fingerprint.
func MetaOf(pool *kvpool.Pool, fingerprint string) Meta {
	c := pool.Config()
	return Meta{
		Fingerprint: fingerprint,
		Layout:      fmt.Sprintf("page %d layers %d kv heads %d head dim %d", c.PageSize, c.Layers, c.KVHeads, c.HeadDim),
		DType:       c.KVDType.String(),
	}
}

// Policy is when a published page is copied to L2.
type Policy string

// Write policies (SGLang's names).
const (
	// WriteThrough copies a page to L2 (and on to L3) when it is published.
	WriteThrough Policy = "write_through"
	// WriteBack copies it only when the pool evicts it.
	WriteBack Policy = "write_back"
)

// ParsePolicy checks a --hicache-write-policy value.
func ParsePolicy(s string) (Policy, error) {
	switch Policy(s) {
	case WriteThrough, WriteBack:
		return Policy(s), nil
	}
	return "", fmt.Errorf("hicache write policy %q: want write_through or write_back", s)
}

// Config sets the tiers up.
type Config struct {
	Pool  *kvpool.Pool
	Cache *prefixcache.Cache
	// HostBytes is L2's size; it holds HostBytes / packed page size pages.
	HostBytes int64
	Policy    Policy
	// Store is L3 (nil: none). StoreBytes, if set, reports its size for
	// the usage gauge.
	Store      Store
	StoreBytes func() int64
	// Loaders is how many requests' loads run at once (default 2).
	Loaders int
	Metrics *metrics.Set
	// Faults are injected only by the faults build's command; the zero
	// value injects none.
	Faults Faults
}

// Faults are faults only the faults build's command injects
// (cmd/baton/guards_faults.go, BATON_FAULTS); a nil field injects none.
type Faults struct {
	// Fetch runs before each page is read from its tier (load_delay, load_jitter).
	Fetch func()
	// Landed sees each page's bytes before they are checked and written to the pool (load_corrupt).
	Landed func([]byte)
}

// Tier names where a page was found.
type Tier uint8

// Tiers below the pool.
const (
	L2 Tier = 2
	L3 Tier = 3
)

// Found is one page a lookup found below the pool.
type Found struct {
	prefixcache.Page
	Tier Tier
}

// Tiers are L2 and L3 of one pool's cache. Safe for concurrent use.
type Tiers struct {
	cfg       Config
	pool      *kvpool.Pool
	kv        kernels.PagedKV
	ps        int
	pageBytes int
	m         *metrics.Set

	mu      sync.Mutex
	region  []byte // L2: slots of pageBytes
	free    []int32
	l2      map[kvpool.CacheKey]*list.Element // of *slot
	lru     *list.List                        // front: most recently used
	pending map[kvpool.SharedRef][]byte       // demoted bytes, until the index says what they were
	closed  bool

	// closeMu orders Load's sends against Close.
	closeMu sync.RWMutex
	shut    bool

	jobs  chan *job
	l3q   chan l3put
	wg    sync.WaitGroup // L3's writer
	lw    sync.WaitGroup // the loaders
	stats Stats
}

type slot struct {
	id int32
	prefixcache.Page
	saltHash [16]byte
}

type l3put struct {
	key      kvpool.CacheKey
	saltHash [16]byte
	data     []byte
	sum      uint64
}

// Stats are the tiers' counters.
type Stats struct {
	L2Pages       int
	L2Puts        uint64 // pages copied into L2
	L2Evictions   uint64 // pages L2 let go of (into L3 when there is one)
	L3Puts        uint64
	L3Dropped     uint64 // pages L2 evicted that L3 never got (its queue was full, or Put failed)
	Loads         uint64 // pages loaded into the pool and shared
	LoadFailures  uint64 // pages whose load ended as a miss
	ChecksumFails uint64 // of them, because the landed bytes differed
}

// ErrClosed is returned by Load after Close.
var ErrClosed = errors.New("hicache: closed")

// New sets the tiers up under cfg.Cache: its pool's evictions come down
// here, and its pages' checksums are recorded at publish.
func New(cfg Config) (*Tiers, error) {
	if cfg.Pool == nil || cfg.Cache == nil {
		return nil, errors.New("hicache: a pool and its prefix cache are needed")
	}
	if cfg.Policy == "" {
		cfg.Policy = WriteThrough
	}
	if _, err := ParsePolicy(string(cfg.Policy)); err != nil {
		return nil, err
	}
	if cfg.Loaders <= 0 {
		cfg.Loaders = 2
	}
	if cfg.Faults.Fetch == nil {
		cfg.Faults.Fetch = func() {}
	}
	if cfg.Faults.Landed == nil {
		cfg.Faults.Landed = func([]byte) {}
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.ForModel("standalone", "")
	}
	kv := cfg.Pool.KV()
	ps := cfg.Pool.PageSize()
	t := &Tiers{
		cfg: cfg, pool: cfg.Pool, kv: kv, ps: ps, pageBytes: kv.PackedBytes(ps), m: cfg.Metrics,
		l2: map[kvpool.CacheKey]*list.Element{}, lru: list.New(), pending: map[kvpool.SharedRef][]byte{},
		jobs: make(chan *job, 1024), l3q: make(chan l3put, 256),
	}
	n := cfg.HostBytes / int64(t.pageBytes)
	if n < 0 || n > 1<<31-1 {
		return nil, fmt.Errorf("hicache: %d bytes of host memory is out of range", cfg.HostBytes)
	}
	// L2 is a region of its own in host memory, apart from the pool's
	// (which may be a GPU's): packed pages, in the pool's dtype.
	t.region = make([]byte, int(n)*t.pageBytes)
	for i := int32(n) - 1; i >= 0; i-- {
		t.free = append(t.free, i)
	}
	cfg.Cache.SetChecksum(t.checksum)
	cfg.Cache.SetLower(t)
	cfg.Pool.SetDemoteHook(t.demote)
	for range cfg.Loaders {
		t.lw.Add(1)
		go t.loader()
	}
	if cfg.Store != nil {
		t.wg.Add(1)
		go t.writer()
	}
	t.gauges()
	return t, nil
}

// Close stops the loaders once the loads queued are done, then writes to
// L3 what L2 holds and L3 does not (so that a restart over the same L3
// finds it), and stops L3's writer.
func (t *Tiers) Close() {
	t.closeMu.Lock()
	if t.shut {
		t.closeMu.Unlock()
		return
	}
	t.shut = true
	close(t.jobs)
	t.closeMu.Unlock()
	t.lw.Wait() // loads done: nothing more comes from them
	t.mu.Lock()
	var keep []l3put
	if t.cfg.Store != nil {
		for e := t.lru.Back(); e != nil; e = e.Prev() {
			s := e.Value.(*slot)
			keep = append(keep, l3put{key: s.Ref.Key, saltHash: s.saltHash, data: append([]byte(nil), t.slot(s.id)...), sum: s.Sum})
		}
	}
	t.closed = true
	close(t.l3q)
	t.mu.Unlock()
	t.wg.Wait()
	for _, w := range keep {
		t.putL3(w)
	}
}

// Stats returns the tiers' counters.
func (t *Tiers) Stats() Stats {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.stats
	s.L2Pages = len(t.l2)
	return s
}

// Checksum is xxh3 of a page's packed contents, as the prefix cache
// records it at publish and as decode's Commit check computes it.
func Checksum(packed []byte) uint64 { return xxh3.Hash(packed) }

// SaltHash is what the tiers compare of a tenant: a hash of its salt,
// never the salt the process matches requests with. It is unkeyed, so a
// Store must not write it as it is where others can read it (a guess of
// the API key could be tested against it); the file store keeps an HMAC
// of it under its own key.
func SaltHash(s prefixcache.Salt) [16]byte {
	b := append([]byte("baton hicache tenant\x00"), s[:]...)
	return xxh3.Hash128(b).Bytes()
}

func (t *Tiers) readPage(id int32, dst []byte) ([]byte, error) {
	if t.kv.Device != nil {
		return t.kv.Device.ReadPage(id, t.ps, dst)
	}
	return kernels.PackPage(t.kv, id, t.ps, dst), nil
}

func (t *Tiers) writePage(id int32, src []byte) error {
	if t.kv.Device != nil {
		return t.kv.Device.WritePage(id, t.ps, src)
	}
	return kernels.UnpackPage(t.kv, id, t.ps, src)
}

func (t *Tiers) checksum(id int32) ([]byte, uint64, error) {
	b, err := t.readPage(id, nil)
	return b, Checksum(b), err
}

// Published is the prefix cache telling of a page just shared, with the
// packed contents its checksum was taken over: under write_through they
// are copied to L2 now.
func (t *Tiers) Published(p prefixcache.Page, packed []byte) {
	if t.cfg.Policy != WriteThrough {
		return
	}
	if packed == nil {
		var err error
		if packed, err = t.readPage(p.Ref.Page, nil); err != nil {
			return
		}
	}
	t.put(p, packed)
}

// demote is the pool's hook as it evicts a page, under its lock, while
// the contents are still there: they are kept aside until the index says
// (Evicted) which tenant and tokens they were.
func (t *Tiers) demote(ref kvpool.SharedRef) {
	t.mu.Lock()
	_, have := t.l2[ref.Key]
	t.mu.Unlock()
	if have {
		return // written through at publish
	}
	b, err := t.readPage(ref.Page, nil)
	if err != nil {
		return
	}
	t.mu.Lock()
	t.pending[ref] = b
	t.mu.Unlock()
}

// Evicted is the prefix cache telling of a page eviction took.
func (t *Tiers) Evicted(ref kvpool.SharedRef, p prefixcache.Page, found bool) {
	t.mu.Lock()
	b, ok := t.pending[ref]
	delete(t.pending, ref)
	if !ok || !found {
		if e, in := t.l2[ref.Key]; in && found {
			t.lru.MoveToFront(e) // still wanted: it was in L1 until now
		}
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	t.put(p, b)
}

// put copies packed page b into L2, making room by evicting the least
// recently used pages (into L3).
func (t *Tiers) put(p prefixcache.Page, b []byte) {
	if len(b) != t.pageBytes {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.l2[p.Ref.Key]; ok {
		t.lru.MoveToFront(e)
		return
	}
	if len(t.free) == 0 && !t.evictL2() {
		// No L2 at all: straight to L3.
		t.toL3(p, SaltHash(p.Salt), append([]byte(nil), b...))
		return
	}
	id := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	copy(t.slot(id), b)
	p.Tokens = append([]int32(nil), p.Tokens...)
	t.l2[p.Ref.Key] = t.lru.PushFront(&slot{id: id, Page: p, saltHash: SaltHash(p.Salt)})
	t.stats.L2Puts++
	if t.cfg.Policy == WriteThrough {
		// Through to L3 too, as it is cached, rather than only when L2
		// lets it go.
		t.toL3(p, SaltHash(p.Salt), append([]byte(nil), b...))
	}
	t.gaugesLocked()
}

func (t *Tiers) slot(id int32) []byte {
	o := int(id) * t.pageBytes
	return t.region[o : o+t.pageBytes : o+t.pageBytes]
}

// evictL2 frees the least recently used L2 slot, handing its page to L3.
// Callers hold t.mu.
func (t *Tiers) evictL2() bool {
	e := t.lru.Back()
	if e == nil {
		return false
	}
	s := e.Value.(*slot)
	t.lru.Remove(e)
	delete(t.l2, s.Ref.Key)
	t.toL3(s.Page, s.saltHash, append([]byte(nil), t.slot(s.id)...))
	t.free = append(t.free, s.id)
	t.stats.L2Evictions++
	return true
}

// toL3 queues a page for L3's writer; file writes never run under t.mu or
// on the engine loop. Callers hold t.mu.
func (t *Tiers) toL3(p prefixcache.Page, saltHash [16]byte, b []byte) {
	if t.cfg.Store == nil || t.closed {
		return
	}
	select {
	case t.l3q <- l3put{key: p.Ref.Key, saltHash: saltHash, data: b, sum: p.Sum}:
	default:
		t.stats.L3Dropped++
		t.m.HiCacheL3Dropped.Inc()
	}
}

func (t *Tiers) writer() {
	defer t.wg.Done()
	for w := range t.l3q {
		t.putL3(w)
	}
}

func (t *Tiers) putL3(w l3put) {
	k := [2]uint64{w.key.Hi, w.key.Lo}
	if t.cfg.Store.Has(k) {
		return
	}
	err := t.cfg.Store.Put(k, w.saltHash, w.data, w.sum)
	t.mu.Lock()
	if err != nil {
		t.stats.L3Dropped++
		t.m.HiCacheL3Dropped.Inc()
	} else {
		t.stats.L3Puts++
	}
	t.gaugesLocked()
	t.mu.Unlock()
}

func (t *Tiers) gauges() {
	t.mu.Lock()
	t.gaugesLocked()
	t.mu.Unlock()
}

func (t *Tiers) gaugesLocked() {
	t.m.HiCacheBytes.WithLabelValues("l2").Set(float64(len(t.l2) * t.pageBytes))
	if f := t.cfg.StoreBytes; f != nil {
		t.m.HiCacheBytes.WithLabelValues("l3").Set(float64(f()))
	}
}

// Find continues a prefix lookup below the pool: after the first from
// full pages of prompt (found in L1), the run of pages L2 or L3 holds for
// salt, up to limit pages. L2 entries are compared by key, parent, tokens
// and tenant; L3 by key here, by tenant and checksum when it is read.
func (t *Tiers) Find(salt prefixcache.Salt, prompt []int32, from, limit int) []Found {
	if from >= limit {
		return nil
	}
	keys := t.cfg.Cache.Keys(salt, prompt[:limit*t.ps])
	sh := SaltHash(salt)
	var out []Found
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := from; i < limit; i++ {
		parent := t.cfg.Cache.Root(salt)
		if i > 0 {
			parent = keys[i-1]
		}
		toks := prompt[i*t.ps : (i+1)*t.ps]
		p := prefixcache.Page{Ref: kvpool.SharedRef{Page: -1, Key: keys[i]}, Parent: parent, Tokens: toks, Salt: salt}
		if e, ok := t.l2[keys[i]]; ok {
			s := e.Value.(*slot)
			if s.saltHash == sh && s.Parent == parent && equal(s.Tokens, toks) {
				p.Sum = s.Sum
				out = append(out, Found{Page: p, Tier: L2})
				continue
			}
		}
		if t.cfg.Store != nil && t.cfg.Store.Has([2]uint64{keys[i].Hi, keys[i].Lo}) {
			out = append(out, Found{Page: p, Tier: L3})
			continue
		}
		break
	}
	return out
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// job is one request's loads, in page order.
type job struct {
	owner kvpool.Owner
	pages []int32
	found []Found
	done  func()
}

// Load starts loading found (from Find) into pages, fresh pages of
// owner's; it puts them in PageLoading first, so that nothing reads them
// before the loads end. done runs on the loader goroutine once every page
// ended (shared, or owner's own unwritten page). On error nothing started
// and the pages are as they were.
func (t *Tiers) Load(owner kvpool.Owner, pages []int32, found []Found, done func()) error {
	if len(pages) != len(found) {
		return fmt.Errorf("hicache: %d pages for %d loads", len(pages), len(found))
	}
	keys := make([]kvpool.CacheKey, len(found))
	for i, f := range found {
		keys[i] = f.Ref.Key
	}
	// Not under t.mu: the pool's lock comes first (its demote hook takes
	// t.mu under it).
	t.closeMu.RLock()
	defer t.closeMu.RUnlock()
	if t.shut {
		return ErrClosed
	}
	if err := t.pool.BeginLoad(owner, pages, keys); err != nil {
		return err
	}
	j := &job{owner: owner, pages: pages, found: found, done: done}
	select {
	case t.jobs <- j:
	default:
		// The queue is full: end the loads at once, as misses, on a
		// goroutine of their own so that the caller never waits.
		t.lw.Add(1)
		go func() { defer t.lw.Done(); t.fail(j, 0, "gone") }()
	}
	return nil
}

func (t *Tiers) loader() {
	defer t.lw.Done()
	for j := range t.jobs {
		t.run(j)
	}
}

// run loads one request's pages in order.
func (t *Tiers) run(j *job) {
	start := time.Now()
	buf := make([]byte, t.pageBytes)
	var back []byte
	for i, f := range j.found {
		id := j.pages[i]
		data, sum, ok := t.fetch(f, buf)
		if !ok {
			t.fail(j, i, "gone")
			return
		}
		t.cfg.Faults.Landed(data)
		if err := t.writePage(id, data); err != nil {
			t.fail(j, i, "gone")
			return
		}
		// The checksum of what landed in the pool, not of what was sent.
		var err error
		if back, err = t.readPage(id, back); err != nil || Checksum(back) != sum {
			t.mu.Lock()
			t.stats.ChecksumFails++
			t.mu.Unlock()
			t.fail(j, i, "checksum")
			return
		}
		f.Ref.Page, f.Sum = id, sum
		if shared, err := t.cfg.Cache.Adopt(j.owner, f.Page); err != nil || !shared {
			// Released meanwhile: the page went back to the free list; the
			// rest need not load.
			t.endRest(j, i+1)
			return
		}
		t.mu.Lock()
		t.stats.Loads++
		t.mu.Unlock()
		t.m.HiCacheLoadedBytes.Add(float64(len(data)))
	}
	t.m.HiCacheLoadSeconds.Observe(time.Since(start).Seconds())
	j.done()
}

// fetch reads f's bytes from its tier into buf, with the checksum kept
// from publish.
func (t *Tiers) fetch(f Found, buf []byte) ([]byte, uint64, bool) {
	t.cfg.Faults.Fetch()
	if f.Tier == L2 {
		t.mu.Lock()
		defer t.mu.Unlock()
		e, ok := t.l2[f.Ref.Key]
		if !ok {
			return nil, 0, false
		}
		s := e.Value.(*slot)
		if s.saltHash != SaltHash(f.Salt) {
			return nil, 0, false
		}
		t.lru.MoveToFront(e)
		copy(buf, t.slot(s.id))
		return buf, s.Sum, true
	}
	sum, ok := t.cfg.Store.Get([2]uint64{f.Ref.Key.Hi, f.Ref.Key.Lo}, SaltHash(f.Salt), buf)
	return buf, sum, ok
}

// fail ends page i and every later page of j as misses.
func (t *Tiers) fail(j *job, i int, reason string) {
	t.mu.Lock()
	t.stats.LoadFailures += uint64(len(j.pages) - i)
	t.mu.Unlock()
	t.m.HiCacheLoadFailures.WithLabelValues(reason).Add(float64(len(j.pages) - i))
	t.endRest(j, i)
}

func (t *Tiers) endRest(j *job, i int) {
	for _, id := range j.pages[i:] {
		_, _ = t.pool.EndLoad(j.owner, id, false)
	}
	j.done()
}
