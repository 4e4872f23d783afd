// Package arenaspace hands out a prefill sender's staging arena
// (kernels.Arena: device memory apart from the KV pool) to the sender's
// sessions, for the transports that stage pages on the device before they
// move them: cuda-ipc (tcp with an arena) and ucx with an arena. A
// session's bytes are reused only once the transport proved that nothing
// reads them any more (the receiver confirmed the end, or the endpoint was
// flushed), or after a quarantine when it could not.
package arenaspace

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/kernels"
)

// Align keeps every staged page on a boundary the copy kernels' vector
// loads like.
const Align = 256

// Span is a range of arena bytes [Off, End).
type Span struct{ Off, End int }

// Space hands out an arena's bytes, first fit. It is safe for concurrent
// use.
type Space struct {
	arena kernels.Arena
	mu    sync.Mutex
	free  []Span // sorted, coalesced
	// stats, for tests and logs
	staged, fellBack, quarantined int
}

// New hands out a's bytes, all free.
func New(a kernels.Arena) *Space {
	return &Space{arena: a, free: []Span{{0, a.Size() / Align * Align}}}
}

// Arena is the arena the space hands out.
func (s *Space) Arena() kernels.Arena { return s.arena }

// take finds n bytes (n a multiple of Align), or reports none.
func (s *Space) take(n int) (Span, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.free {
		if f.End-f.Off >= n {
			got := Span{f.Off, f.Off + n}
			if s.free[i].Off += n; s.free[i].Off == s.free[i].End {
				s.free = slices.Delete(s.free, i, i+1)
			}
			return got, true
		}
	}
	s.fellBack++
	return Span{}, false
}

// give returns spans to the free list.
func (s *Space) give(spans []Span) {
	if len(spans) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, spans...)
	slices.SortFunc(s.free, func(a, b Span) int { return a.Off - b.Off })
	out := s.free[:1]
	for _, f := range s.free[1:] {
		if last := &out[len(out)-1]; f.Off <= last.End {
			last.End = max(last.End, f.End)
		} else {
			out = append(out, f)
		}
	}
	s.free = out
}

// Staged is one Stage: the span it holds, each page's byte offset in the
// arena, and the staging under way.
type Staged struct {
	Span    Span
	Offs    []int
	Staging kernels.Staging
}

// Stage takes one span for the pages (each at an Align boundary) and
// queues their staging into it (kernels.Arena.Stage). ok is false, with
// nothing taken, when the arena has no room for them: the caller sends
// them another way. The span is the caller's to Release once nothing
// reads it, after the staging's Wait.
func (s *Space) Stage(kv kernels.PagedKV, pages []int32, tokens []int) (st Staged, ok bool, err error) {
	if len(pages) != len(tokens) {
		return Staged{}, false, fmt.Errorf("%d pages and %d token counts", len(pages), len(tokens))
	}
	offs := make([]int, len(pages))
	total := 0
	for i, t := range tokens {
		offs[i] = total
		total += (kv.PackedBytes(t) + Align - 1) / Align * Align
	}
	sp, ok := s.take(total)
	if !ok {
		return Staged{}, false, nil
	}
	for i := range offs {
		offs[i] += sp.Off
	}
	staging, err := s.arena.Stage(pages, tokens, offs)
	if err != nil {
		s.give([]Span{sp})
		return Staged{}, false, fmt.Errorf("staging %d pages: %w", len(pages), err)
	}
	s.mu.Lock()
	s.staged += len(pages)
	s.mu.Unlock()
	return Staged{Span: sp, Offs: offs, Staging: staging}, true, nil
}

// Release gives a session's spans back once its stagings are done (each
// is waited for, sent or not, which frees what it holds; the bytes it
// packs into are not reused before it is): at once when confirmed (the
// transport proved nothing reads them any more), else after quarantine.
func (s *Space) Release(spans []Span, stagings []kernels.Staging, confirmed bool, quarantine time.Duration) {
	for _, st := range stagings {
		_, _ = st.Wait()
	}
	if len(spans) == 0 {
		return
	}
	if confirmed {
		s.give(spans)
		return
	}
	s.mu.Lock()
	s.quarantined += len(spans)
	s.mu.Unlock()
	time.AfterFunc(quarantine, func() { s.give(spans) })
}

// Stats says how an arena was used: pages staged, stagings that found no
// room (their pages went another way), sessions' spans that were
// quarantined, and the bytes free now.
type Stats struct {
	Staged, FellBack, Quarantined, FreeBytes int
}

// Stats reports the arena's use.
func (s *Space) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := 0
	for _, f := range s.free {
		free += f.End - f.Off
	}
	return Stats{Staged: s.staged, FellBack: s.fellBack, Quarantined: s.quarantined, FreeBytes: free}
}
