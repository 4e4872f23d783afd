package kvpool

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
)

func newPool(t *testing.T, pages int, poison bool) *Pool {
	t.Helper()
	p, err := New(Config{NumPages: pages, PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 3, Poison: poison})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkInvariants recounts the pool from its pages and free list and
// compares with the gauges: a lost page, a page on the free list twice, or a
// free-list page that is not free all fail here.
func checkInvariants(t *testing.T, p *Pool) {
	t.Helper()
	p.mu.RLock()
	defer p.mu.RUnlock()
	var free, alloc, quar, writer, shared, cached, loading int
	refs := map[int32]int32{}
	for pn := range p.pins {
		refs[pn.page]++
	}
	for id, pg := range p.pages {
		switch pg.state {
		case PageShared:
			shared++
			if pg.refs == 0 {
				cached++
			}
			if pg.refs != refs[int32(id)] || pg.writer || int(pg.written) != p.cfg.PageSize || pg.room != CacheRoom {
				t.Errorf("shared page %d: %+v, %d pins", id, pg, refs[int32(id)])
			}
		case PageFree:
			free++
			if pg.writer || pg.room != 0 || pg.epoch != 0 || pg.written != 0 || pg.refs != 0 {
				t.Errorf("free page with leftover bookkeeping %+v", pg)
			}
		case PageAllocated:
			alloc++
		case PageLoading:
			alloc++
			loading++
			if !pg.loadHeld || pg.writer || pg.written != 0 {
				t.Errorf("loading page %d: %+v", id, pg)
			}
		case PageQuarantined:
			quar++
			if !pg.writer && !pg.loadHeld {
				t.Errorf("quarantined page without a writer %+v", pg)
			}
		default:
			t.Errorf("page in state %v", pg.state)
		}
		if pg.writer {
			writer++
		}
	}
	onList := make(map[int32]bool)
	for _, id := range p.free {
		if onList[id] {
			t.Errorf("page %d on the free list twice", id)
		}
		onList[id] = true
		if p.pages[id].state != PageFree {
			t.Errorf("page %d on the free list in state %v", id, p.pages[id].state)
		}
	}
	for pn := range p.pins {
		if p.pages[pn.page].state != PageShared {
			t.Errorf("pin %+v on a page in state %v", pn, p.pages[pn.page].state)
		}
	}
	// The LRU list holds exactly the cached pages, linked both ways.
	n, prev := 0, int32(-1)
	for id := p.lruHead; id >= 0; id = p.pages[id].next {
		if pg := p.pages[id]; pg.state != PageShared || pg.refs != 0 || pg.prev != prev {
			t.Errorf("page %d on the cached list: %+v", id, pg)
		}
		prev = id
		if n++; n > len(p.pages) {
			t.Fatal("cached list has a cycle")
		}
	}
	if n != cached || p.lruTail != prev {
		t.Errorf("cached list holds %d pages (tail %d, want %d), %d cached", n, p.lruTail, prev, cached)
	}
	s := p.stats
	if len(p.free) != free || s.Free != free || s.Allocated != alloc || s.Quarantined != quar || s.WriterHeld != writer ||
		s.Shared != shared || s.Cached != cached || s.Loading != loading {
		t.Errorf("gauges %+v, recount free=%d (list %d) allocated=%d quarantined=%d writer=%d shared=%d cached=%d",
			s, free, len(p.free), alloc, quar, writer, shared, cached)
	}
	if free+alloc+quar+shared != s.Total || s.Total != len(p.pages) || free+cached+s.Used() != s.Total {
		t.Errorf("pages lost: free %d + allocated %d + quarantined %d + shared %d != total %d", free, alloc, quar, shared, s.Total)
	}
}

func mustAlloc(t *testing.T, p *Pool, room uint64, n int) Allocation {
	t.Helper()
	a, err := p.Alloc(room, n)
	if err != nil {
		t.Fatalf("alloc %d pages for room %d: %v", n, room, err)
	}
	return a
}

// quarantined allocates n pages to room with a writer attached and
// releases them: the request let go, the writer has not.
func quarantined(t *testing.T, p *Pool, room uint64, n int) Allocation {
	t.Helper()
	a := mustAlloc(t, p, room, n)
	if err := p.AttachWriter(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	return a
}

func wantErr(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want %v", err, target)
	}
}

func TestNewConfig(t *testing.T) {
	p := newPool(t, 10, false)
	if p.NumPages() != 10 || p.PageSize() != 4 || p.CapacityTokens() != 40 || p.Free() != 10 {
		t.Fatalf("sizes: pages %d size %d capacity %d free %d", p.NumPages(), p.PageSize(), p.CapacityTokens(), p.Free())
	}
	kv := p.KV()
	if kv.PageFloats() != 2*2*4*2*3 || p.PageBytes() != 4*kv.PageFloats() || len(kv.Data) != 10*kv.PageFloats() {
		t.Fatalf("layout: page floats %d, page bytes %d, data %d", kv.PageFloats(), p.PageBytes(), len(kv.Data))
	}
	if got := len(p.PageData(9)); got != kv.PageFloats() {
		t.Fatalf("page data %d floats", got)
	}
	// PageData and KV offsets must describe the same memory.
	p.PageData(3)[0] = 7
	if kv.Data[kv.KOffset(3, 0, 0)] != 7 {
		t.Fatal("PageData(3) is not page 3 of KV()")
	}
	for _, n := range []int{0, 1, 4, 5} {
		if got, want := p.PagesFor(n), (n+3)/4; got != want {
			t.Errorf("PagesFor(%d) = %d, want %d", n, got, want)
		}
	}
	for _, bad := range []Config{
		{},
		{NumPages: 1, PageSize: 0, Layers: 1, KVHeads: 1, HeadDim: 1},
		{NumPages: -1, PageSize: 1, Layers: 1, KVHeads: 1, HeadDim: 1},
		{NumPages: 1, PageSize: 1 << 30, Layers: 1 << 30, KVHeads: 1 << 30, HeadDim: 1},
	} {
		if _, err := New(bad); !errors.Is(err, ErrBadArg) {
			t.Errorf("New(%+v) = %v, want ErrBadArg", bad, err)
		}
	}
}

func TestAllocRelease(t *testing.T) {
	p := newPool(t, 8, false)
	a := mustAlloc(t, p, 1, 3)
	if len(a.Pages) != 3 || a.Owner.Room != 1 || a.Owner.Epoch == 0 {
		t.Fatalf("allocation %+v", a)
	}
	for _, id := range a.Pages {
		o, w, st := p.Owner(id)
		if o != a.Owner || w != 0 || st != PageAllocated {
			t.Fatalf("page %d: owner %v written %d state %v", id, o, w, st)
		}
	}
	if p.Free() != 5 {
		t.Fatalf("free %d, want 5", p.Free())
	}
	checkInvariants(t, p)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if p.Free() != 8 {
		t.Fatalf("free %d after release, want 8", p.Free())
	}
	for _, id := range a.Pages {
		if o, w, st := p.Owner(id); o != (Owner{}) || w != 0 || st != PageFree {
			t.Fatalf("released page %d: owner %v written %d state %v", id, o, w, st)
		}
	}
	if _, _, st := p.Owner(-1); st != PageInvalid {
		t.Fatalf("page -1 state %v", st)
	}
	if _, _, st := p.Owner(8); st != PageInvalid {
		t.Fatalf("page 8 state %v", st)
	}
	s := p.Stats()
	if s.Allocations != 1 || s.Releases != 1 || s.PagesFreed != 3 || s.ReleaseErrors != 0 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, p)
	if _, err := p.Alloc(1, 0); !errors.Is(err, ErrBadArg) {
		t.Fatalf("alloc 0: %v", err)
	}
}

func TestAllocAllOrNothing(t *testing.T) {
	p := newPool(t, 5, false)
	a := mustAlloc(t, p, 1, 3)
	before := p.Stats()
	_, err := p.Alloc(2, 3)
	wantErr(t, err, ErrNoSpace)
	if p.Free() != 2 {
		t.Fatalf("failed alloc took pages: free %d, want 2", p.Free())
	}
	after := p.Stats()
	if after.AllocFailures != before.AllocFailures+1 || after.Allocated != before.Allocated {
		t.Fatalf("stats before %+v after %+v", before, after)
	}
	// The two free pages are still whole and usable.
	b := mustAlloc(t, p, 2, 2)
	if p.Free() != 0 {
		t.Fatalf("free %d", p.Free())
	}
	_, err = p.Alloc(3, 1)
	wantErr(t, err, ErrNoSpace)
	checkInvariants(t, p)
	for _, x := range []Allocation{a, b} {
		if err := p.Release(x.Owner, x.Pages); err != nil {
			t.Fatal(err)
		}
	}
	checkInvariants(t, p)
}

func TestEpochsGrow(t *testing.T) {
	p := newPool(t, 4, false)
	var last uint64
	for i := range 20 {
		a := mustAlloc(t, p, 7, 1+i%4) // same room every time: the epoch alone tells uses apart
		if a.Owner.Epoch <= last {
			t.Fatalf("epoch %d after %d", a.Owner.Epoch, last)
		}
		last = a.Owner.Epoch
		if err := p.Release(a.Owner, a.Pages); err != nil {
			t.Fatal(err)
		}
	}
}

func TestDoubleRelease(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.Release(a.Owner, a.Pages), ErrDoubleRelease)
	// Releasing a page nobody ever allocated is the same bug.
	wantErr(t, p.Release(Owner{Room: 9, Epoch: 99}, []int32{3}), ErrDoubleRelease)
	wantErr(t, p.Release(a.Owner, []int32{4}), ErrBadPage)
	if got := p.Stats().ReleaseErrors; got != 3 {
		t.Fatalf("release errors %d, want 3", got)
	}
	// A page named twice in one call: refused, and nothing released.
	b := mustAlloc(t, p, 2, 2)
	wantErr(t, p.Release(b.Owner, []int32{b.Pages[0], b.Pages[1], b.Pages[0]}), ErrDoubleRelease)
	for _, id := range b.Pages {
		if _, _, st := p.Owner(id); st != PageAllocated {
			t.Fatalf("page %d %v after refused release", id, st)
		}
	}
	if p.Free() != 2 {
		t.Fatalf("free %d, want 2", p.Free())
	}
	if err := p.Release(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, p)
}

func TestWrongOwnerRelease(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	b := mustAlloc(t, p, 2, 2)
	// Another room, and this room with the wrong epoch.
	wantErr(t, p.Release(b.Owner, a.Pages), ErrWrongOwner)
	wantErr(t, p.Release(Owner{Room: 1, Epoch: a.Owner.Epoch + 1}, a.Pages), ErrWrongOwner)
	// A mix of own and foreign pages changes nothing at all.
	wantErr(t, p.Release(a.Owner, []int32{a.Pages[0], b.Pages[0]}), ErrWrongOwner)
	if _, _, st := p.Owner(a.Pages[0]); st != PageAllocated {
		t.Fatalf("own page released by a refused call: %v", st)
	}
	if got := p.Stats().ReleaseErrors; got != 3 {
		t.Fatalf("release errors %d, want 3", got)
	}
	// A stale release after the page was reused hits the new owner's tag
	// and must not free it.
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	c := mustAlloc(t, p, 1, 2)
	wantErr(t, p.Release(a.Owner, a.Pages), ErrWrongOwner)
	if o, _, st := p.Owner(c.Pages[0]); o != c.Owner || st != PageAllocated {
		t.Fatalf("reused page after stale release: %v %v", o, st)
	}
	checkInvariants(t, p)
}

func TestQuarantineReleaseThenDrain(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 3)
	if err := p.AttachWriter(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.AttachWriter(a.Owner, a.Pages[:1]), ErrWriterAttached)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if p.Free() != 1 {
		t.Fatalf("writer-held pages freed on release: free %d", p.Free())
	}
	for _, id := range a.Pages {
		if _, _, st := p.Owner(id); st != PageQuarantined {
			t.Fatalf("page %d %v, want quarantined", id, st)
		}
	}
	if s := p.Stats(); s.Quarantined != 3 {
		t.Fatalf("stats %+v", s)
	}
	// Quarantined pages cannot be allocated, read, marked or released again.
	_, err := p.Alloc(2, 2)
	wantErr(t, err, ErrNoSpace)
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 1), ErrNotAllocated)
	wantErr(t, p.MarkWritten(a.Owner, a.Pages[0], 1), ErrNotAllocated)
	wantErr(t, p.Release(a.Owner, a.Pages), ErrDoubleRelease)
	checkInvariants(t, p)

	if err := p.WriterDone(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if p.Free() != 4 {
		t.Fatalf("free %d after drain, want 4", p.Free())
	}
	wantErr(t, p.WriterDone(a.Owner, a.Pages), ErrDoubleRelease)
	if s := p.Stats(); s.ReleaseErrors != 2 || s.WritersDone != 1 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, p)
}

func TestQuarantineDrainThenRelease(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	if err := p.AttachWriter(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if err := p.WriterDone(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	// The request still owns the pages; the drain alone frees nothing.
	if p.Free() != 2 {
		t.Fatalf("drain freed pages the request holds: free %d", p.Free())
	}
	wantErr(t, p.WriterDone(a.Owner, a.Pages), ErrNoWriter)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if p.Free() != 4 {
		t.Fatalf("free %d after release, want 4", p.Free())
	}
	checkInvariants(t, p)
}

func TestDrainWrongOwner(t *testing.T) {
	p := newPool(t, 4, false)
	a := quarantined(t, p, 1, 2)
	wantErr(t, p.WriterDone(Owner{Room: 1, Epoch: a.Owner.Epoch + 1}, a.Pages), ErrWrongOwner)
	// Partly wrong: nothing leaves quarantine.
	wantErr(t, p.WriterDone(a.Owner, []int32{a.Pages[0], 3}), ErrDoubleRelease)
	if p.Free() != 2 {
		t.Fatalf("free %d, want 2", p.Free())
	}
	checkInvariants(t, p)
}

func TestWriterClosed(t *testing.T) {
	p := newPool(t, 4, false)
	a := quarantined(t, p, 1, 2)
	// No proof, no free: a timeout alone must never reuse the pages.
	wantErr(t, p.WriterClosed(a.Owner, a.Pages, ""), ErrNoProof)
	if p.Free() != 2 {
		t.Fatalf("free %d after proofless reclaim", p.Free())
	}
	const proof = "tcp: connection to prefill-0 closed and receiver joined"
	if err := p.WriterClosed(a.Owner, a.Pages, proof); err != nil {
		t.Fatal(err)
	}
	if p.Free() != 4 {
		t.Fatalf("free %d after reclaim, want 4", p.Free())
	}
	recs := p.Reclaims()
	if len(recs) != 1 || recs[0].Proof != proof || recs[0].Owner != a.Owner || recs[0].Freed != 2 || len(recs[0].Pages) != 2 {
		t.Fatalf("reclaim log %+v", recs)
	}
	if s := p.Stats(); s.Reclaims != 1 || s.ReleaseErrors != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Reclaim before the request lets go: the writer is gone, the request
	// still owns the pages, and its release frees them.
	b := mustAlloc(t, p, 2, 1)
	if err := p.AttachWriter(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if err := p.WriterClosed(b.Owner, b.Pages, "endpoint destroyed"); err != nil {
		t.Fatal(err)
	}
	if _, _, st := p.Owner(b.Pages[0]); st != PageAllocated {
		t.Fatalf("page %v after reclaim of a held page", st)
	}
	if err := p.Release(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if p.Free() != 4 {
		t.Fatalf("free %d", p.Free())
	}
	checkInvariants(t, p)
}

func TestReclaimLogBounded(t *testing.T) {
	p := newPool(t, 1, false)
	for range maxReclaimRecords + 5 {
		a := mustAlloc(t, p, 1, 1)
		if err := p.AttachWriter(a.Owner, a.Pages); err != nil {
			t.Fatal(err)
		}
		if err := p.WriterClosed(a.Owner, a.Pages, "closed"); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(a.Owner, a.Pages); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(p.Reclaims()); n != maxReclaimRecords {
		t.Fatalf("%d reclaim records", n)
	}
	if s := p.Stats(); s.Reclaims != maxReclaimRecords+5 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMarkWritten(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	pg := a.Pages[0]
	if err := p.MarkWritten(a.Owner, pg, 3); err != nil {
		t.Fatal(err)
	}
	if err := p.MarkWritten(a.Owner, pg, 3); err != nil {
		t.Fatalf("re-mark with the same count: %v", err)
	}
	wantErr(t, p.MarkWritten(a.Owner, pg, 2), ErrBadCount)
	wantErr(t, p.MarkWritten(a.Owner, pg, 5), ErrBadCount)
	wantErr(t, p.MarkWritten(Owner{Room: 2, Epoch: a.Owner.Epoch}, pg, 4), ErrWrongOwner)
	wantErr(t, p.MarkWritten(a.Owner, 3, 1), ErrNotAllocated)
	wantErr(t, p.MarkWritten(a.Owner, 40, 1), ErrBadPage)
	if _, w, _ := p.Owner(pg); w != 3 {
		t.Fatalf("written %d, want 3", w)
	}
	// MarkPositions is all-or-nothing too.
	wantErr(t, p.MarkPositions(a.Owner, []int32{a.Pages[0], 3}, 6), ErrNotAllocated)
	if _, w, _ := p.Owner(pg); w != 3 {
		t.Fatalf("written %d after refused MarkPositions, want 3", w)
	}
	if err := p.MarkPositions(a.Owner, a.Pages, 6); err != nil {
		t.Fatal(err)
	}
	if _, w0, _ := p.Owner(a.Pages[0]); w0 != 4 {
		t.Fatalf("page 0 written %d", w0)
	}
	if _, w1, _ := p.Owner(a.Pages[1]); w1 != 2 {
		t.Fatalf("page 1 written %d", w1)
	}
	// Never shrinks.
	if err := p.MarkPositions(a.Owner, a.Pages, 1); err != nil {
		t.Fatal(err)
	}
	if _, w0, _ := p.Owner(a.Pages[0]); w0 != 4 {
		t.Fatalf("page 0 shrank to %d", w0)
	}
	wantErr(t, p.MarkPositions(a.Owner, a.Pages, 9), ErrBadArg)
}

func TestCheckReadable(t *testing.T) {
	p := newPool(t, 4, false)
	a := mustAlloc(t, p, 1, 2)
	if err := p.CheckReadable(a.Owner, a.Pages, 0); err != nil {
		t.Fatalf("empty read: %v", err)
	}
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 1), ErrNotWritten)
	if err := p.MarkWritten(a.Owner, a.Pages[0], 4); err != nil {
		t.Fatal(err)
	}
	if err := p.MarkWritten(a.Owner, a.Pages[1], 2); err != nil {
		t.Fatal(err)
	}
	for n := 0; n <= 6; n++ {
		if err := p.CheckReadable(a.Owner, a.Pages, n); err != nil {
			t.Fatalf("read of %d positions: %v", n, err)
		}
	}
	// One past what was written: the incident-1 shape (pages reserved for a
	// whole prompt, fewer written).
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 7), ErrNotWritten)
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 9), ErrBadArg)
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, -1), ErrBadArg)
	wantErr(t, p.CheckReadable(Owner{Room: 2, Epoch: a.Owner.Epoch}, a.Pages, 1), ErrWrongOwner)
	wantErr(t, p.CheckReadable(a.Owner, []int32{a.Pages[0], 99}, 5), ErrBadPage)
}

// A frees, B takes the same pages: A's tag must fail the read gate even
// though B's KV is sitting there and B wrote it all.
func TestCheckReadableAfterReuse(t *testing.T) {
	p := newPool(t, 2, false)
	a := mustAlloc(t, p, 1, 2)
	if err := p.MarkPositions(a.Owner, a.Pages, 8); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 8), ErrNotAllocated)
	for _, room := range []uint64{2, 1} { // another room, then the same room again
		b := mustAlloc(t, p, room, 2)
		if b.Pages[0] != a.Pages[1] && b.Pages[0] != a.Pages[0] {
			t.Fatalf("expected reuse of %v, got %v", a.Pages, b.Pages)
		}
		if err := p.MarkPositions(b.Owner, b.Pages, 8); err != nil {
			t.Fatal(err)
		}
		wantErr(t, p.CheckReadable(a.Owner, a.Pages, 8), ErrWrongOwner)
		wantErr(t, p.CheckReadable(a.Owner, a.Pages, 1), ErrWrongOwner)
		if err := p.CheckReadable(b.Owner, b.Pages, 8); err != nil {
			t.Fatal(err)
		}
		if err := p.Release(b.Owner, b.Pages); err != nil {
			t.Fatal(err)
		}
	}
	// A fresh allocation starts unwritten even though the page holds the
	// previous user's KV.
	c := mustAlloc(t, p, 3, 2)
	wantErr(t, p.CheckReadable(c.Owner, c.Pages, 1), ErrNotWritten)
}

func fill(s []float32, v float32) {
	for i := range s {
		s[i] = v
	}
}

func TestPoison(t *testing.T) {
	p := newPool(t, 3, true)
	for i, f := range p.KV().Data {
		if !math.IsNaN(float64(f)) {
			t.Fatalf("fresh poisoned pool: data[%d] = %v", i, f)
		}
	}
	a := mustAlloc(t, p, 1, 2)
	for _, id := range a.Pages {
		fill(p.PageData(id), 1.5)
	}
	p.PageData(2)[0] = 2 // a free page nobody should touch; proves we poison only freed pages
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	for _, id := range a.Pages {
		for i, f := range p.PageData(id) {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("freed page %d: float %d = %v, want NaN", id, i, f)
			}
		}
	}
	if p.PageData(2)[0] != 2 {
		t.Fatal("poison touched a page that was not freed")
	}
	// Quarantined pages are poisoned when they are finally freed, not before
	// (a writer may still be writing them).
	b := mustAlloc(t, p, 2, 1)
	fill(p.PageData(b.Pages[0]), 3)
	if err := p.AttachWriter(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if p.PageData(b.Pages[0])[5] != 3 {
		t.Fatal("quarantined page poisoned early")
	}
	if err := p.WriterDone(b.Owner, b.Pages); err != nil {
		t.Fatal(err)
	}
	if f := p.PageData(b.Pages[0])[5]; !math.IsNaN(float64(f)) {
		t.Fatalf("drained page holds %v, want NaN", f)
	}
}

// Without poison a freed page keeps the last user's KV: the real hazard the
// read gate exists for. If this ever stops holding, the poison test above
// proves less than it seems.
func TestNoPoisonKeepsStale(t *testing.T) {
	p := newPool(t, 1, false)
	a := mustAlloc(t, p, 1, 1)
	fill(p.PageData(a.Pages[0]), 4)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	b := mustAlloc(t, p, 2, 1)
	if b.Pages[0] != a.Pages[0] || p.PageData(b.Pages[0])[0] != 4 {
		t.Fatal("expected stale data in the reused page")
	}
}

// Many goroutines allocate, write, read-check, and release (some through a
// writer and quarantine). Every page a goroutine holds is claimed in a shared
// table, so a page handed to two holders at once fails; at the end every page
// must be back on the free list exactly once.
func TestConcurrent(t *testing.T) {
	const pages, workers, iters = 64, 8, 400
	p := newPool(t, pages, false)
	var claim [pages]atomic.Uint64
	var wg sync.WaitGroup
	var failures atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			room := uint64(w + 1)
			fail := func(format string, args ...any) {
				failures.Add(1)
				t.Errorf(format, args...)
			}
			for range iters {
				n := 1 + rng.IntN(12)
				a, err := p.Alloc(room, n)
				if errors.Is(err, ErrNoSpace) {
					continue
				}
				if err != nil {
					fail("alloc: %v", err)
					return
				}
				for _, id := range a.Pages {
					if !claim[id].CompareAndSwap(0, room) {
						fail("page %d handed to room %d while room %d holds it", id, room, claim[id].Load())
					}
				}
				positions := 1 + rng.IntN(n*p.PageSize())
				if err := p.MarkPositions(a.Owner, a.Pages, positions); err != nil {
					fail("mark: %v", err)
				}
				if err := p.CheckReadable(a.Owner, a.Pages, positions); err != nil {
					fail("read: %v", err)
				}
				writer := rng.IntN(2) == 0
				if writer {
					if err := p.AttachWriter(a.Owner, a.Pages); err != nil {
						fail("attach: %v", err)
					}
				}
				drainFirst := rng.IntN(2) == 0
				if writer && drainFirst {
					if err := p.WriterDone(a.Owner, a.Pages); err != nil {
						fail("drain: %v", err)
					}
				}
				// Unclaim before the pages can become free, or another
				// goroutine's CAS could race ours.
				for _, id := range a.Pages {
					claim[id].Store(0)
				}
				if err := p.Release(a.Owner, a.Pages); err != nil {
					fail("release: %v", err)
				}
				if writer && !drainFirst {
					var err error
					if rng.IntN(4) == 0 {
						err = p.WriterClosed(a.Owner, a.Pages, "test: peer gone")
					} else {
						err = p.WriterDone(a.Owner, a.Pages)
					}
					if err != nil {
						fail("drain after release: %v", err)
					}
				}
				_ = p.Stats()
				_, _, _ = p.Owner(a.Pages[0])
			}
		}()
	}
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}
	if p.Free() != pages {
		t.Fatalf("free %d at the end, want %d", p.Free(), pages)
	}
	s := p.Stats()
	if s.ReleaseErrors != 0 || s.Allocated != 0 || s.Quarantined != 0 || s.WriterHeld != 0 {
		t.Fatalf("stats at the end %+v", s)
	}
	if s.PagesFreed == 0 || s.Allocations == 0 {
		t.Fatalf("test did no work: %+v", s)
	}
	checkInvariants(t, p)
}

func BenchmarkAllocRelease(b *testing.B) {
	p, err := New(Config{NumPages: 4096, PageSize: 16, Layers: 1, KVHeads: 1, HeadDim: 1})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		a, err := p.Alloc(1, 32)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(a.Owner, a.Pages); err != nil {
			b.Fatal(err)
		}
	}
}
