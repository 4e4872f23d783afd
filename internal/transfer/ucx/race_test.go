//go:build ucx

package ucx

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/transfer"
)

// raceSink is a decode side in miniature for the race test: live
// reservations for Admit, and Closed as the transport's drain proof, which
// frees quarantined pages (kvpool.WriterClosed with the proof) when the
// drain guard is on.
type raceSink struct {
	pool  *kvpool.Pool
	guard bool

	mu       sync.Mutex
	live     map[transfer.Key][]int32
	attached map[transfer.Key]kvpool.Allocation
	closed   map[transfer.Key]string
	bad      []string
}

func (s *raceSink) Write(k transfer.Key, w transfer.PageWrite) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bad = append(s.bad, fmt.Sprintf("Sink.Write(%v, page %d) on a one-sided transport", k, w.Page))
	return errors.New("one-sided: no writes through the sink")
}

func (s *raceSink) Admit(k transfer.Key) ([]int32, error) {
	k = k.Reservation()
	s.mu.Lock()
	defer s.mu.Unlock()
	pages, ok := s.live[k]
	if !ok {
		return nil, fmt.Errorf("no live reservation for %v", k)
	}
	return pages, nil
}

func (s *raceSink) Closed(k transfer.Key, proof string) {
	k = k.Reservation()
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, dup := s.closed[k]; dup {
		s.bad = append(s.bad, fmt.Sprintf("Closed(%v) twice", k))
	}
	s.closed[k] = proof
	if a, ok := s.attached[k]; ok {
		delete(s.attached, k)
		if err := s.pool.WriterClosed(a.Owner, a.Pages, proof); err != nil {
			s.bad = append(s.bad, fmt.Sprintf("WriterClosed(%v): %v", k, err))
		}
	}
}

// reserve is decode's Reserve: allocate, attach the writer (guard on)
// before the pages' address leaves, and make the reservation live.
func (s *raceSink) reserve(t *testing.T, room uint64, n int) (transfer.Key, kvpool.Allocation) {
	t.Helper()
	a, err := s.pool.Alloc(room, n)
	if err != nil {
		t.Fatalf("Alloc room %d: %v", room, err)
	}
	k := transfer.Key{Room: a.Owner.Room, Epoch: a.Owner.Epoch}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.guard {
		if err := s.pool.AttachWriter(a.Owner, a.Pages); err != nil {
			t.Fatal(err)
		}
		s.attached[k] = a
	}
	s.live[k] = a.Pages
	return k, a
}

// abort is decode aborting a reservation: closed to new sessions, pages
// released (quarantined while a writer is attached, else free at once).
func (s *raceSink) abort(t *testing.T, k transfer.Key, a kvpool.Allocation) {
	t.Helper()
	s.mu.Lock()
	delete(s.live, k)
	s.mu.Unlock()
	if err := s.pool.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
}

// prefill is a prefill side in miniature: a prompt's KV and its pages.
type prefill struct {
	kv     kernels.PagedKV
	tokens int
	pages  [][]byte
	sums   []uint64
}

func newPrefill(layout kernels.PagedKV, tokens int, seed uint64) *prefill {
	rng := rand.New(rand.NewPCG(seed, 7))
	n := (tokens + layout.PageSize - 1) / layout.PageSize
	p := &prefill{kv: layout, tokens: tokens}
	p.kv.Data = make([]float32, n*layout.PageFloats())
	for i := range p.kv.Data {
		p.kv.Data[i] = float32(rng.NormFloat64())
	}
	for i := range n {
		d := kernels.PackPage(p.kv, int32(i), p.tokensOf(i), nil)
		p.pages = append(p.pages, d)
		p.sums = append(p.sums, transfer.Checksum(d))
	}
	return p
}

func (p *prefill) tokensOf(i int) int { return min(p.kv.PageSize, p.tokens-i*p.kv.PageSize) }

// write writes pages [from, to) and flushes.
func (p *prefill) write(ctx context.Context, s transfer.Session, dst []int32, from, to int) error {
	for i := from; i < to; i++ {
		if err := s.Write(transfer.PageWrite{Index: i, Page: dst[i], Tokens: p.tokensOf(i), Data: p.pages[i]}); err != nil {
			return fmt.Errorf("write index %d: %w", i, err)
		}
	}
	return s.Flush(ctx)
}

// verify is decode's Commit check for a one-sided transport: each page's
// checksum recomputed over the page contents. It returns the indexes that
// do not match.
func (p *prefill) verify(kv kernels.PagedKV, dst []int32) []int {
	var bad []int
	for i, pg := range dst {
		if transfer.Checksum(kernels.PackPage(kv, pg, p.tokensOf(i), nil)) != p.sums[i] {
			bad = append(bad, i)
		}
	}
	return bad
}

// TestLateWritesAfterAbort is the incident of DESIGN.md: decode aborts a
// request whose prefill is slow and reuses its pages while the prefill's
// one-sided puts are still coming. With the drain guard on (the writer is
// attached; released pages stay quarantined until the transport proves the
// session over), the next owner reads only its own KV. With it off (no
// writer attached, so Release frees at once and LIFO reuse hands the same
// pages to the next request), the next owner's pages, verified at its
// commit, are overwritten afterwards by the old request's late puts, and
// the checksums show it.
//
// The order is fixed by channels, not timing: the slow sender writes half
// its pages, flushes, and waits; decode aborts and reserves for the next
// request, whose own prefill writes and is verified; only then is the slow
// sender released to write the rest.
func TestLateWritesAfterAbort(t *testing.T) {
	for _, mem := range []string{"go", "allockv"} {
		for _, guard := range []bool{true, false} {
			t.Run(fmt.Sprintf("memory=%s/guard=%v", mem, guard), func(t *testing.T) {
				testLateWrites(t, mem, guard)
			})
		}
	}
}

func testLateWrites(t *testing.T, mem string, guard bool) {
	const (
		numPages = 8
		tokens   = 4*16 - 5 // four pages, the last one partial
	)
	cfg := kvpool.Config{NumPages: numPages, PageSize: 16, Layers: 2, KVHeads: 2, HeadDim: 8, Poison: true}
	pool, err := kvpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// kv is the memory pages land in: the pool's own (Go memory), or
	// memory UCX allocated, with the pool keeping the books.
	kv := pool.KV()
	opts := inUCXMemory(t, &kv, mem)
	poison := func(pages []int32) {
		if mem != "allockv" {
			return // the pool poisons its own memory when it frees a page
		}
		pf := kv.PageFloats()
		for _, p := range pages {
			for i := range pf {
				kv.Data[int(p)*pf+i] = float32(math.NaN())
			}
		}
	}
	poison([]int32{0, 1, 2, 3, 4, 5, 6, 7})

	sink := &raceSink{pool: pool, guard: guard, live: map[transfer.Key][]int32{},
		attached: map[transfer.Key]kvpool.Allocation{}, closed: map[transfer.Key]string{}}
	recv, err := Listen("127.0.0.1:0", sink, kv, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	slowSnd, err := NewSender()
	if err != nil {
		t.Fatal(err)
	}
	defer slowSnd.Close()
	nextSnd, err := NewSender()
	if err != nil {
		t.Fatal(err)
	}
	defer nextSnd.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	layout := kv
	layout.Data = nil
	oldP := newPrefill(layout, tokens, 1)
	nextP := newPrefill(layout, tokens, 2)

	// Request A: reserved, its slow prefill writes half and stalls.
	kA, aA := sink.reserve(t, 1, 4)
	sA, err := slowSnd.Open(ctx, recv.Addr(), kA)
	if err != nil {
		t.Fatal(err)
	}
	half := make(chan error, 1)
	resume := make(chan struct{})
	var resumeOnce sync.Once
	release := func() { resumeOnce.Do(func() { close(resume) }) }
	defer release() // a failed test must not leave the sender waiting
	slowDone := make(chan error, 1)
	go func() {
		half <- oldP.write(ctx, sA, aA.Pages, 0, 2)
		<-resume // the test-only delay between puts
		if err := oldP.write(ctx, sA, aA.Pages, 2, 4); err != nil {
			slowDone <- err
			return
		}
		slowDone <- sA.Close()
	}()
	if err := <-half; err != nil {
		release()
		t.Fatalf("slow sender, first half: %v", err)
	}
	if bad := oldP.verify(kv, aA.Pages[:2]); len(bad) != 0 {
		release()
		t.Fatalf("the slow sender's first pages did not land by its Flush: indexes %v", bad)
	}

	// Decode aborts A (the prefill is too slow) and releases its pages.
	sink.abort(t, kA, aA)
	st := pool.Stats()
	if guard {
		if st.Quarantined != 4 {
			t.Fatalf("guard on: %d pages quarantined after the abort, want 4", st.Quarantined)
		}
	} else {
		poison(aA.Pages)
		if st.Quarantined != 0 || st.Free != numPages {
			t.Fatalf("guard off: stats %+v, want every page free", st)
		}
	}

	// Request B takes four pages and its own prefill fills them.
	kB, aB := sink.reserve(t, 2, 4)
	reused := slices.DeleteFunc(slices.Clone(aB.Pages), func(p int32) bool { return !slices.Contains(aA.Pages, p) })
	if guard {
		if len(reused) != 0 {
			t.Fatalf("guard on: quarantined pages %v were handed to the next request", reused)
		}
		if _, err := pool.Alloc(3, 1); !errors.Is(err, kvpool.ErrNoSpace) {
			t.Fatalf("guard on: Alloc with only quarantined pages left: %v, want ErrNoSpace", err)
		}
	} else if len(reused) != 4 {
		t.Fatalf("guard off: the next request got %v, want A's pages %v back (LIFO reuse)", aB.Pages, aA.Pages)
	}
	sB, err := nextSnd.Open(ctx, recv.Addr(), kB)
	if err != nil {
		t.Fatal(err)
	}
	if err := nextP.write(ctx, sB, aB.Pages, 0, 4); err != nil {
		t.Fatal(err)
	}
	if err := sB.Close(); err != nil {
		t.Fatal(err)
	}
	// B's commit: every checksum matches what landed.
	if bad := nextP.verify(kv, aB.Pages); len(bad) != 0 {
		t.Fatalf("B's commit check failed at indexes %v before any late write", bad)
	}

	// Now A's prefill wakes up and finishes: late puts.
	release()
	select {
	case err := <-slowDone:
		if err != nil {
			t.Fatalf("slow sender: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("slow sender did not finish")
	}

	// B reads its KV (what decode attends over from now on).
	bad := nextP.verify(kv, aB.Pages)
	if guard {
		if len(bad) != 0 {
			t.Errorf("guard on: B's pages at indexes %v were corrupted by A's late puts", bad)
		}
		// The slow sender's Close is the proof that frees A's pages.
		if st := pool.Stats(); st.Quarantined != 0 || st.Free != numPages-4 {
			t.Errorf("guard on: after A's session closed, stats %+v: want A's pages freed by its proof", st)
		}
		poison(aA.Pages)
		if _, err := pool.Alloc(3, 4); err != nil {
			t.Errorf("guard on: A's pages not reusable after the proof: %v", err)
		}
	} else {
		// The corrupted pages of B are exactly those A wrote late.
		var want []int
		for i, p := range aB.Pages {
			if slices.Contains(aA.Pages[2:], p) {
				want = append(want, i)
			}
		}
		if len(bad) == 0 {
			t.Fatal("guard off: A's late puts left B's pages intact; the race did not happen")
		}
		if !slices.Equal(bad, want) {
			t.Errorf("guard off: corrupted indexes %v, want exactly %v (the pages A wrote late)", bad, want)
		}
		// And what B reads there is A's KV, not garbage.
		for i, p := range aB.Pages {
			if j := slices.Index(aA.Pages, p); j >= 2 {
				got := kernels.PackPage(kv, p, oldP.tokensOf(j), nil)
				if transfer.Checksum(got) != oldP.sums[j] {
					t.Errorf("guard off: B's page %d (index %d) does not hold A's index %d", p, i, j)
				}
			}
		}
		t.Logf("guard off: B's pages at indexes %v hold A's KV after B's commit was verified", bad)
	}
	sink.mu.Lock()
	for _, b := range sink.bad {
		t.Error(b)
	}
	proof, ok := sink.closed[kA]
	sink.mu.Unlock()
	if !ok || proof == "" {
		t.Errorf("no Closed with a proof for A's session after its Close")
	}
}
