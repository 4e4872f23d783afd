package hicache

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
	dto "github.com/prometheus/client_model/go"
)

const ps = 4

// memStore is an in-memory L3 with the file store's contract: a page
// comes back only under its salt hash and with its checksum.
type memStore struct {
	mu    sync.Mutex
	pages map[[2]uint64]memPage
	gets  int
}

type memPage struct {
	salt [16]byte
	data []byte
	sum  uint64
}

func newMemStore() *memStore { return &memStore{pages: map[[2]uint64]memPage{}} }

func (m *memStore) Put(k [2]uint64, salt [16]byte, page []byte, sum uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pages[k] = memPage{salt, append([]byte(nil), page...), sum}
	return nil
}

func (m *memStore) Get(k [2]uint64, salt [16]byte, dst []byte) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gets++
	p, ok := m.pages[k]
	if !ok || p.salt != salt || len(dst) != len(p.data) || Checksum(p.data) != p.sum {
		return 0, false
	}
	copy(dst, p.data)
	return p.sum, true
}

func (m *memStore) Has(k [2]uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.pages[k]
	return ok
}

func (m *memStore) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.pages)
}

type fixture struct {
	pool  *kvpool.Pool
	cache *prefixcache.Cache
	tiers *Tiers
	m     *metrics.Set
}

// setup makes a pool of pages pages, its prefix cache, and tiers with L2
// holding l2Pages pages and store as L3.
func setup(t *testing.T, pages, l2Pages int, policy Policy, store Store) *fixture {
	t.Helper()
	pool, err := kvpool.New(kvpool.Config{NumPages: pages, PageSize: ps, Layers: 2, KVHeads: 1, HeadDim: 4, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	cache := prefixcache.New(pool, "test model", prefixcache.Guards{})
	m := metrics.New("standalone")
	pb := pool.KV().PackedBytes(ps)
	tiers, err := New(Config{Pool: pool, Cache: cache, HostBytes: int64(l2Pages * pb), Policy: policy, Store: store, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tiers.Close)
	return &fixture{pool, cache, tiers, m}
}

// compute fills a request's pages with KV derived from its tokens (as a
// forward pass would: the same tokens give the same KV), publishes them
// and releases the request.
func (f *fixture) compute(t *testing.T, salt prefixcache.Salt, prompt []int32) {
	t.Helper()
	n := len(prompt) / ps
	a, err := f.pool.Alloc(1, n)
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range a.Pages {
		fillKV(f.pool, id, prompt[:(i+1)*ps])
	}
	if err := f.pool.MarkPositions(a.Owner, a.Pages, n*ps); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cache.Publish(salt, a.Owner, a.Pages, prompt); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
}

func fillKV(p *kvpool.Pool, id int32, prefix []int32) {
	d := p.PageData(id)
	var h float32
	for _, tk := range prefix {
		h = h*1.5 + float32(tk)
	}
	for i := range d {
		d[i] = h + float32(i)/64
	}
}

func prompt(base, pages int) []int32 {
	p := make([]int32, pages*ps+1)
	for i := range p {
		p[i] = int32(base*1000 + i)
	}
	return p
}

// load finds prompt below the pool after the hit pages L1 has, loads what
// it found into fresh pages and waits for the loads; it returns the
// allocation, the hit and found counts.
func (f *fixture) load(t *testing.T, salt prefixcache.Salt, prompt []int32) (kvpool.Allocation, int, []Found) {
	t.Helper()
	hit := f.cache.Lookup(salt, prompt)
	limit := (len(prompt) - 1) / ps
	found := f.tiers.Find(salt, prompt, len(hit), limit)
	a, err := f.pool.AllocPinned(2, limit-len(hit), hit)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if len(found) > 0 {
		if err := f.tiers.Load(a.Owner, a.Pages[len(hit):len(hit)+len(found)], found, func() { close(done) }); err != nil {
			t.Fatal(err)
		}
		<-done
	}
	return a, len(hit), found
}

// wantKV checks that the pages hold the KV computed for prompt, and are
// shared and readable by a.
func (f *fixture) wantKV(t *testing.T, a kvpool.Allocation, prompt []int32, pages int) {
	t.Helper()
	for i, id := range a.Pages[:pages] {
		if in := f.pool.Info(id); in.State != kvpool.PageShared {
			t.Fatalf("page %d (index %d) is %s", id, i, in.State)
		}
		got := f.pool.PageData(id)[0]
		var h float32
		for _, tk := range prompt[:(i+1)*ps] {
			h = h*1.5 + float32(tk)
		}
		if got != h {
			t.Fatalf("page %d (index %d) holds %v, want %v", id, i, got, h)
		}
	}
	if err := f.pool.CheckReadable(a.Owner, a.Pages, pages*ps); err != nil {
		t.Fatal(err)
	}
}

// With an L1 that holds one prompt at a time, the prompts computed earlier
// are found in L2 and loaded back, each page whole and shared; the pool and
// the tiers account for every page.
func TestEvictedPagesComeBackFromL2(t *testing.T) {
	for _, policy := range []Policy{WriteBack, WriteThrough} {
		t.Run(string(policy), func(t *testing.T) {
			f := setup(t, 4, 64, policy, nil)
			var salt prefixcache.Salt
			const n = 6
			for b := range n {
				f.compute(t, salt, prompt(b, 3))
			}
			want := n*3 - 4 // write-back: all but what the pool still holds
			if policy == WriteThrough {
				want = n * 3 // copied at publish
			}
			if st := f.tiers.Stats(); st.L2Pages != want {
				t.Fatalf("L2 holds %d pages after %d prompts went through a 4-page pool: %+v", st.L2Pages, n, st)
			}
			a, hit, found := f.load(t, salt, prompt(0, 3))
			if hit != 0 || len(found) != 3 || found[0].Tier != L2 {
				t.Fatalf("hit %d in L1, found %+v below", hit, found)
			}
			f.wantKV(t, a, prompt(0, 3), 3)
			if err := f.pool.Release(a.Owner, a.Pages); err != nil {
				t.Fatal(err)
			}
			st, ps := f.tiers.Stats(), f.pool.Stats()
			if st.Loads != 3 || st.LoadFailures != 0 || ps.Loaded != 3 || ps.ReleaseErrors != 0 || ps.Loading != 0 || ps.Free+ps.Cached != ps.Total {
				t.Fatalf("tiers %+v pool %+v", st, ps)
			}
			// Loaded pages are in the index again: the next lookup finds
			// them in L1.
			if got := f.cache.Lookup(salt, prompt(0, 3)); len(got) != 3 {
				t.Fatalf("L1 lookup after the load found %d pages", len(got))
			}
		})
	}
}

// Another tenant finds nothing below the pool either.
func TestLowerTiersKeepTenantsApart(t *testing.T) {
	st := newMemStore()
	f := setup(t, 4, 2, WriteBack, st)
	alice := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", "")
	bob := prefixcache.TenantSalt(prefixcache.ScopeKey, "bob", "")
	for b := range 4 {
		f.compute(t, alice, prompt(b, 3))
	}
	f.tiers.Close() // flushes L3's writer
	if got := f.tiers.Find(bob, prompt(0, 3), 0, 3); len(got) != 0 {
		t.Fatalf("bob found %d of alice's pages", len(got))
	}
	if got := f.tiers.Find(alice, prompt(0, 3), 0, 3); len(got) == 0 {
		t.Fatal("alice found none of her pages")
	}
}

// L2 evicts into L3; a prefix found there loads like one in L2.
func TestL2EvictsIntoL3(t *testing.T) {
	st := newMemStore()
	f := setup(t, 4, 2, WriteBack, st)
	var salt prefixcache.Salt
	for b := range 5 {
		f.compute(t, salt, prompt(b, 3))
	}
	f.tiers.Close() // flushes L3's writer
	if st.len() == 0 {
		t.Fatalf("nothing reached L3: %+v", f.tiers.Stats())
	}
	// Reopen over the same store (a restart keeps L3, not L2).
	f2 := setup(t, 4, 2, WriteBack, st)
	a, _, found := f2.load(t, salt, prompt(0, 3))
	if len(found) != 3 || found[0].Tier != L3 {
		t.Fatalf("found %+v", found)
	}
	f2.wantKV(t, a, prompt(0, 3), 3)
	if err := f2.pool.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
}

// refusingStore is an L3 whose every write fails (a full or read-only
// disk).
type refusingStore struct{ *memStore }

func (*refusingStore) Put([2]uint64, [16]byte, []byte, uint64) error {
	return errors.New("no space left on device")
}

// Pages L3 refused are counted where an operator sees them, and the
// lookup finds nothing below L2 for them.
func TestL3RefusedWritesAreCounted(t *testing.T) {
	st := &refusingStore{newMemStore()}
	f := setup(t, 4, 2, WriteBack, st)
	var salt prefixcache.Salt
	for b := range 5 {
		f.compute(t, salt, prompt(b, 3))
	}
	f.tiers.Close()
	dropped := f.tiers.Stats().L3Dropped
	if dropped == 0 {
		t.Fatalf("no refused write counted: %+v", f.tiers.Stats())
	}
	var m dto.Metric
	if err := f.m.HiCacheL3Dropped.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != float64(dropped) {
		t.Fatalf("baton_hicache_l3_dropped_pages_total = %v, stats say %d", got, dropped)
	}
}

// A page whose bytes changed on the way back is a miss: it and every page
// after it become the request's own, unwritten (poisoned) pages; the ones
// before it load.
func TestChecksumMismatchIsAMiss(t *testing.T) {
	f := setup(t, 4, 64, WriteThrough, nil)
	var salt prefixcache.Salt
	f.compute(t, salt, prompt(0, 3))
	f.pool.EvictCached(-1)
	// Corrupt the second page's copy in L2.
	keys := f.cache.Keys(salt, prompt(0, 3))
	f.tiers.mu.Lock()
	s := f.tiers.l2[keys[1]].Value.(*slot)
	f.tiers.slot(s.id)[5] ^= 0x40
	f.tiers.mu.Unlock()
	a, _, found := f.load(t, salt, prompt(0, 3))
	if len(found) != 3 {
		t.Fatalf("found %d", len(found))
	}
	f.wantKV(t, a, prompt(0, 3), 1)
	for _, id := range a.Pages[1:] {
		if in := f.pool.Info(id); in.State != kvpool.PageAllocated || in.Written != 0 {
			t.Fatalf("page %d after a failed load: %+v", id, in)
		}
		if v := f.pool.PageData(id)[0]; v == v {
			t.Fatalf("page %d holds %v after a failed load, want poison", id, v)
		}
	}
	if err := f.pool.CheckReadable(a.Owner, a.Pages, 2*ps); err == nil {
		t.Fatal("a page whose load failed reads as written")
	}
	st := f.tiers.Stats()
	if st.ChecksumFails != 1 || st.LoadFailures != 2 || st.Loads != 1 {
		t.Fatalf("stats %+v", st)
	}
	if err := f.pool.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
}

// A request that lets go of its pages while they load leaves nothing
// behind: the pages are freed when the loads end, and Close leaves no
// goroutine.
func TestReleaseWhileLoadingLeaksNothing(t *testing.T) {
	before := runtime.NumGoroutine()
	f := setup(t, 4, 64, WriteThrough, newMemStore())
	var salt prefixcache.Salt
	f.compute(t, salt, prompt(0, 3))
	f.pool.EvictCached(-1)
	found := f.tiers.Find(salt, prompt(0, 3), 0, 3)
	a, err := f.pool.Alloc(3, 3)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	f.tiers.cfg.Faults.Fetch = func() { <-gate }
	done := make(chan struct{})
	if err := f.tiers.Load(a.Owner, a.Pages, found, func() { close(done) }); err != nil {
		t.Fatal(err)
	}
	if err := f.pool.CheckReadable(a.Owner, a.Pages, 3*ps); err == nil {
		t.Fatal("a loading page reads")
	}
	if err := f.pool.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if st := f.pool.Stats(); st.Quarantined != 3 {
		t.Fatalf("pages released while loading: %+v", st)
	}
	close(gate)
	<-done
	if st := f.pool.Stats(); st.Free != st.Total || st.ReleaseErrors != 0 || st.Quarantined != 0 {
		t.Fatalf("after the loads ended: %+v", st)
	}
	f.tiers.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before", runtime.NumGoroutine(), before)
		}
		runtime.Gosched()
	}
}

// What L2 holds at Close goes to L3, so that tiers made again over the same
// store (a restart) find it there.
func TestCloseKeepsL2InL3(t *testing.T) {
	st := newMemStore()
	f := setup(t, 4, 64, WriteBack, st)
	var salt prefixcache.Salt
	for b := range 3 {
		f.compute(t, salt, prompt(b, 3))
	}
	if n := st.len(); n != 0 {
		t.Fatalf("L3 holds %d pages before L2 let any go", n)
	}
	f.tiers.Close()
	if n := st.len(); n != f.tiers.Stats().L2Pages || n == 0 {
		t.Fatalf("L3 holds %d pages after Close, L2 held %d", n, f.tiers.Stats().L2Pages)
	}
	f2 := setup(t, 4, 64, WriteBack, st)
	a, _, found := f2.load(t, salt, prompt(0, 3))
	if len(found) != 3 || found[0].Tier != L3 {
		t.Fatalf("found %+v", found)
	}
	f2.wantKV(t, a, prompt(0, 3), 3)
	if err := f2.pool.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
}

// Two requests that load the same prefix at once both read it; the index
// keeps one copy, and the other is evicted once let go, its page freed.
func TestSamePrefixLoadedTwice(t *testing.T) {
	f := setup(t, 8, 64, WriteThrough, nil)
	var salt prefixcache.Salt
	f.compute(t, salt, prompt(0, 2))
	f.pool.EvictCached(-1)
	found := f.tiers.Find(salt, prompt(0, 2), 0, 2)
	var allocs []kvpool.Allocation
	for room := uint64(5); room < 7; room++ {
		a, err := f.pool.Alloc(room, 2)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		if err := f.tiers.Load(a.Owner, a.Pages, found, func() { close(done) }); err != nil {
			t.Fatal(err)
		}
		<-done
		f.wantKV(t, a, prompt(0, 2), 2)
		allocs = append(allocs, a)
	}
	if st := f.cache.Stats(); st.Pages != 2 {
		t.Fatalf("index holds %d pages, want 2", st.Pages)
	}
	for _, a := range allocs {
		if err := f.pool.Release(a.Owner, a.Pages); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.pool.EvictCached(-1); n != 4 {
		t.Fatalf("evicted %d", n)
	}
	if st := f.pool.Stats(); st.Free != st.Total || st.ReleaseErrors != 0 {
		t.Fatalf("pool %+v", st)
	}
	if got := f.cache.Stats().Pages; got != 0 {
		t.Fatalf("index holds %d pages after every page was evicted", got)
	}
}
