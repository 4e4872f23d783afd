package kvpool

import (
	"math"
	"testing"
)

// loading allocates n pages to room and starts their loads under keys
// base+1..base+n.
func loading(t *testing.T, p *Pool, room uint64, n int, base uint64) (Allocation, []CacheKey) {
	t.Helper()
	a := mustAlloc(t, p, room, n)
	keys := make([]CacheKey, n)
	for i := range keys {
		keys[i] = CacheKey{Hi: base, Lo: uint64(i + 1)}
	}
	if err := p.BeginLoad(a.Owner, a.Pages, keys); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, p)
	return a, keys
}

func TestLoadingPageIsNotReadableOrPinnable(t *testing.T) {
	p := newPool(t, 4, true)
	a, keys := loading(t, p, 1, 2, 7)
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 5), ErrLoading)
	if s := p.Stats(); s.ReadBeforeReady != 1 || s.Loading != 2 {
		t.Fatalf("stats %+v", s)
	}
	// Nobody else can pin it, and its own request cannot write or mark it.
	_, err := p.AllocPinned(2, 1, []SharedRef{{Page: a.Pages[0], Key: keys[0]}})
	wantErr(t, err, ErrStale)
	wantErr(t, p.CheckWritable(a.Owner, a.Pages, 0, 1), ErrNotAllocated)
	wantErr(t, p.MarkWritten(a.Owner, a.Pages[0], 4), ErrNotAllocated)
	wantErr(t, p.Publish(a.Owner, a.Pages[0], keys[0]), ErrNotAllocated)
	// Eviction cannot take it either: nothing is cached.
	if n := p.EvictCached(-1); n != 0 {
		t.Fatalf("evicted %d", n)
	}
	// The first load lands; the page is shared, pinned by its request, and
	// readable; the second is refused and becomes the request's own,
	// unwritten page.
	if ok, err := p.EndLoad(a.Owner, a.Pages[0], true); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := p.EndLoad(a.Owner, a.Pages[1], false); ok || err != nil {
		t.Fatal(ok, err)
	}
	checkInvariants(t, p)
	if err := p.CheckReadable(a.Owner, a.Pages, 4); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 5), ErrNotWritten)
	if err := p.CheckWritable(a.Owner, a.Pages, 4, 8); err != nil {
		t.Fatal(err)
	}
	if v := p.PageData(a.Pages[1])[0]; !math.IsNaN(float64(v)) {
		t.Fatalf("a refused load left %v in the page, want poison", v)
	}
	if in := p.Info(a.Pages[0]); in.State != PageShared || in.Refs != 1 {
		t.Fatalf("loaded page %+v", in)
	}
	// Another request can now pin the loaded page under its key.
	b, err := p.AllocPinned(2, 1, []SharedRef{{Page: a.Pages[0], Key: keys[0]}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Loaded != 1 || s.LoadsRefused != 1 || s.ReleaseErrors != 0 || s.Cached != 1 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, p)
}

// A request that lets go of a page while its load runs leaves it
// quarantined: the load still writes it, so it is freed only when the
// load ends.
func TestReleaseDuringLoadWaitsForTheLoad(t *testing.T) {
	p := newPool(t, 2, true)
	a, _ := loading(t, p, 1, 2, 7)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Quarantined != 2 || s.Free != 0 || s.Loading != 0 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, p)
	// A transfer writer's word does not end a load.
	wantErr(t, p.WriterDone(a.Owner, a.Pages[:1]), ErrNoWriter)
	for _, id := range a.Pages {
		if ok, err := p.EndLoad(a.Owner, id, true); ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if s := p.Stats(); s.Free != 2 || s.Quarantined != 0 {
		t.Fatalf("stats %+v", s)
	}
	// A second end is a bug, refused.
	_, err := p.EndLoad(a.Owner, a.Pages[0], true)
	wantErr(t, err, ErrLoading)
	checkInvariants(t, p)
}

func TestBeginLoadNeedsFreshPages(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	if err := p.MarkWritten(a.Owner, a.Pages[1], 1); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.BeginLoad(a.Owner, a.Pages, []CacheKey{{Lo: 1}, {Lo: 2}}), ErrBadArg)
	wantErr(t, p.BeginLoad(Owner{Room: 9, Epoch: 9}, a.Pages[:1], []CacheKey{{Lo: 1}}), ErrWrongOwner)
	if s := p.Stats(); s.Loading != 0 {
		t.Fatalf("a refused BeginLoad changed something: %+v", s)
	}
	checkInvariants(t, p)
}

// The demote hook sees an evicted page before it is freed (poisoned), so
// a lower tier can copy what it held.
func TestDemoteHookSeesContentsBeforeFree(t *testing.T) {
	p := newPool(t, 2, true)
	a := mustAlloc(t, p, 1, 1)
	p.PageData(a.Pages[0])[0] = 42
	if err := p.MarkPositions(a.Owner, a.Pages, 4); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(a.Owner, a.Pages[0], CacheKey{Lo: 1}); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	var seen []float32
	p.SetDemoteHook(func(r SharedRef) { seen = append(seen, p.PageData(r.Page)[0]) })
	if n := p.EvictCached(-1); n != 1 || len(seen) != 1 || seen[0] != 42 {
		t.Fatalf("evicted %d, demote saw %v", n, seen)
	}
	checkInvariants(t, p)
}
