package kvpool

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
)

// published allocates n pages to room, writes them full and publishes
// them under keys 1..n (offset by base); the request still pins them.
func published(t *testing.T, p *Pool, room uint64, n int, base uint64) (Allocation, []SharedRef) {
	t.Helper()
	a := mustAlloc(t, p, room, n)
	if err := p.MarkPositions(a.Owner, a.Pages, n*p.PageSize()); err != nil {
		t.Fatal(err)
	}
	var refs []SharedRef
	for i, id := range a.Pages {
		k := CacheKey{Hi: base, Lo: uint64(i + 1)}
		if err := p.Publish(a.Owner, id, k); err != nil {
			t.Fatalf("publish page %d: %v", id, err)
		}
		refs = append(refs, SharedRef{Page: id, Key: k})
	}
	checkInvariants(t, p)
	return a, refs
}

func TestPublishOnlyCompletePages(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	if err := p.MarkPositions(a.Owner, a.Pages, 7); err != nil { // page 0 full, page 1 has 3 of 4
		t.Fatal(err)
	}
	wantErr(t, p.Publish(a.Owner, a.Pages[1], CacheKey{Lo: 2}), ErrNotWritten)
	if _, _, st := p.Owner(a.Pages[1]); st != PageAllocated {
		t.Fatalf("an incomplete page became %s", st)
	}
	other := mustAlloc(t, p, 2, 1)
	if err := p.MarkWritten(other.Owner, other.Pages[0], 4); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.Publish(a.Owner, other.Pages[0], CacheKey{Lo: 3}), ErrWrongOwner)
	if err := p.AttachWriter(other.Owner, other.Pages); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.Publish(other.Owner, other.Pages[0], CacheKey{Lo: 3}), ErrWriterAttached)
	if err := p.Publish(a.Owner, a.Pages[0], CacheKey{Lo: 1}); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Shared != 1 || s.Cached != 0 || s.Published != 1 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, p)
}

func TestSharedPageRefusesWrites(t *testing.T) {
	p := newPool(t, 4, false)
	a, refs := published(t, p, 1, 1, 0)
	id := refs[0].Page
	wantErr(t, p.MarkWritten(a.Owner, id, 4), ErrShared)
	wantErr(t, p.AttachWriter(a.Owner, []int32{id}), ErrShared)
	// A mark that covers the shared page and goes on into a private one
	// is the normal step of a request that read a cached prefix.
	b, err := p.AllocPinned(2, 1, refs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.MarkPositions(b.Owner, b.Pages, 6); err != nil {
		t.Fatalf("mark past a pinned shared page: %v", err)
	}
	// A request that does not pin it cannot mark it.
	c := mustAlloc(t, p, 3, 1)
	wantErr(t, p.MarkPositions(c.Owner, []int32{id, c.Pages[0]}, 6), ErrShared)
	wantErr(t, p.CheckWritable(b.Owner, b.Pages, 3, 5), ErrShared)
	if err := p.CheckWritable(b.Owner, b.Pages, 4, 8); err != nil {
		t.Fatalf("write into the request's own page: %v", err)
	}
	if got := p.Stats().SharedWriteRefusals; got != 4 {
		t.Fatalf("%d shared write refusals counted, want 4", got)
	}
	if in := p.Info(id); in.State != PageShared || in.Written != 4 || in.Refs != 2 {
		t.Fatalf("shared page after refused writes: %+v", in)
	}
	checkInvariants(t, p)
}

func TestReadGateNeedsPin(t *testing.T) {
	p := newPool(t, 4, false)
	a, refs := published(t, p, 1, 1, 0)
	if err := p.CheckReadable(a.Owner, a.Pages, 4); err != nil {
		t.Fatalf("the publisher reads its page: %v", err)
	}
	c := mustAlloc(t, p, 2, 1)
	wantErr(t, p.CheckReadable(c.Owner, []int32{refs[0].Page, c.Pages[0]}, 5), ErrShared)
	b, err := p.AllocPinned(3, 1, refs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.MarkPositions(b.Owner, b.Pages, 5); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckReadable(b.Owner, b.Pages, 5); err != nil {
		t.Fatalf("a pinning reader: %v", err)
	}
	if err := p.Release(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.CheckReadable(b.Owner, b.Pages[:1], 4), ErrShared)
	checkInvariants(t, p)
}

func TestSharedFreedOnlyUnpinnedAndEvicted(t *testing.T) {
	p := newPool(t, 3, true)
	a, refs := published(t, p, 1, 2, 0)
	b, err := p.AllocPinned(2, 1, refs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	// Page refs[1] is unpinned: cached, not free. refs[0] is b's.
	if s := p.Stats(); s.Free != 0 || s.Shared != 2 || s.Cached != 1 {
		t.Fatalf("after the publisher let go: %+v", s)
	}
	wantErr(t, p.Release(a.Owner, a.Pages[:1]), ErrDoubleRelease)
	// Eviction makes room from the cached page only; the pinned one stays.
	var told []SharedRef
	p.SetEvictHook(func(r []SharedRef) { told = append(told, r...) })
	c, err := p.Alloc(3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 || told[0] != refs[1] || c.Pages[0] != refs[1].Page {
		t.Fatalf("evicted %v for allocation %v, want %v", told, c.Pages, refs[1])
	}
	if !math.IsNaN(float64(p.PageData(c.Pages[0])[0])) {
		t.Fatal("an evicted page was handed out without poison")
	}
	if _, err := p.Alloc(4, 1); err == nil {
		t.Fatal("the pinned shared page was evicted for an allocation")
	}
	if in := p.Info(refs[0].Page); in.State != PageShared || in.Refs != 1 {
		t.Fatalf("pinned page after a failed allocation: %+v", in)
	}
	if err := p.Release(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Cached != 1 || s.Free != 1 {
		t.Fatalf("after the last reader let go: %+v", s)
	}
	if n := p.EvictCached(-1); n != 1 {
		t.Fatalf("evicted %d", n)
	}
	if err := p.Release(c.Owner, c.Pages); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Free != 3 || s.ReleaseErrors != 1 || s.Evictions != 2 {
		t.Fatalf("at the end: %+v", s)
	}
	checkInvariants(t, p)
}

func TestAllocPinnedStale(t *testing.T) {
	p := newPool(t, 3, false)
	a, refs := published(t, p, 1, 1, 0)
	wrong := refs[0]
	wrong.Key.Lo++
	if _, err := p.AllocPinned(2, 1, []SharedRef{wrong}); err == nil {
		t.Fatal("pinned a page under a key it does not hold")
	} else {
		wantErr(t, err, ErrStale)
	}
	if _, err := p.AllocPinned(2, 1, []SharedRef{refs[0], refs[0]}); err == nil {
		t.Fatal("pinned a page twice")
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	p.EvictCached(-1)
	// Reused by a private allocation: the old key names nothing now.
	mustAlloc(t, p, 3, 3)
	_, err := p.AllocPinned(4, 0, refs)
	wantErr(t, err, ErrStale)
	if s := p.Stats(); s.Allocations != 2 || s.Allocated != 3 {
		t.Fatalf("a refused pin allocated: %+v", s)
	}
	checkInvariants(t, p)
}

// TestAllocPinnedCountsWhatItPins: a cached page about to be pinned is not
// room for the same allocation's fresh pages.
func TestAllocPinnedCountsWhatItPins(t *testing.T) {
	p := newPool(t, 2, false)
	a, refs := published(t, p, 1, 1, 0)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if p.Available() != 2 {
		t.Fatalf("available %d", p.Available())
	}
	_, err := p.AllocPinned(2, 2, refs)
	wantErr(t, err, ErrNoSpace)
	b, err := p.AllocPinned(2, 1, refs)
	if err != nil {
		t.Fatal(err)
	}
	if b.Pages[0] != refs[0].Page || len(b.Pages) != 2 {
		t.Fatalf("page table %v", b.Pages)
	}
	checkInvariants(t, p)
}

// TestEvictionLeavesFirst: a released prefix becomes evictable from its
// last page back, so the pages other prefixes start with go last.
func TestEvictionLeavesFirst(t *testing.T) {
	p := newPool(t, 4, false)
	a, refs := published(t, p, 1, 3, 0)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	var order []int32
	p.SetEvictHook(func(r []SharedRef) {
		for _, x := range r {
			order = append(order, x.Page)
		}
	})
	mustAlloc(t, p, 2, 4)
	want := []int32{refs[2].Page, refs[1].Page, refs[0].Page}
	for i := range want {
		if i >= len(order) || order[i] != want[i] {
			t.Fatalf("eviction order %v, want %v", order, want)
		}
	}
	checkInvariants(t, p)
}

// TestSharedConcurrent runs publishers, readers and allocations that evict
// at once (under -race in make test): the pool must account for every page
// and never evict a page someone pins.
func TestSharedConcurrent(t *testing.T) {
	p := newPool(t, 24, true)
	var mu sync.Mutex
	live := map[CacheKey]SharedRef{}
	p.SetEvictHook(func(r []SharedRef) {
		mu.Lock()
		for _, x := range r {
			delete(live, x.Key)
		}
		mu.Unlock()
	})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := range 300 {
				var refs []SharedRef
				mu.Lock()
				for _, r := range live {
					if rng.IntN(3) == 0 {
						refs = append(refs, r)
					}
				}
				mu.Unlock()
				a, err := p.AllocPinned(uint64(w*1000+i), 1+rng.IntN(2), refs)
				if err != nil {
					continue // stale or no space: both leave the pool as it was
				}
				if err := p.CheckReadable(a.Owner, a.Pages[:len(refs)], len(refs)*4); err != nil {
					t.Errorf("pinned pages unreadable: %v", err)
				}
				fresh := a.Pages[len(refs):]
				if err := p.MarkPositions(a.Owner, a.Pages, len(a.Pages)*4); err != nil {
					t.Error(err)
				}
				if rng.IntN(2) == 0 {
					k := CacheKey{Hi: uint64(w + 1), Lo: uint64(i)}
					if err := p.Publish(a.Owner, fresh[0], k); err != nil {
						t.Error(err)
					}
					mu.Lock()
					live[k] = SharedRef{Page: fresh[0], Key: k}
					mu.Unlock()
				}
				if err := p.Release(a.Owner, a.Pages); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	p.EvictCached(-1)
	if s := p.Stats(); s.Free != 24 || s.ReleaseErrors != 0 || s.SharedWriteRefusals != 0 {
		t.Fatalf("after the run: %+v", s)
	}
	checkInvariants(t, p)
}
