//go:build ucx

package ucx

import (
	"errors"
	"fmt"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/arenaspace"
)

// Staged pages. A sender made WithArena packs the pages it ships into its
// arena on the device, sums them there (kernels.PageSum), and puts them
// from the arena straight into the decode pool, for a receiver whose pool
// is device memory too (it announced sumPageSum): no page is read back
// into host memory on either side. A session's bytes in the arena are
// reused once its Close flushed the endpoint (every put remotely
// complete: nothing reads them any more), or after a quarantine when it
// did not.

// stagedPage is a staged page as the sending session knows it: where in
// the arena the rows are, and the staging that puts them there. Only the
// session that staged it puts it, and only once the staging is done.
type stagedPage struct {
	s       *Session
	off     int
	staging kernels.Staging
}

// Land implements transfer.PageSource; a staged page is put by its
// session, never landed by anyone else.
func (stagedPage) Land(kernels.PagedKV, int32, int) (int, error) {
	return 0, errors.New("ucx: a staged page is put by the session that staged it")
}

var _ transfer.Stager = (*Session)(nil)

// sum is the function a sender claims its pages with, for the checksum
// the receiver announced (a checked welcome's).
func (w welcome) sum() func([]byte) uint64 {
	if w.Sum == sumPageSum {
		return kernels.PageSum
	}
	return transfer.Checksum
}

// StagePages implements transfer.Stager. With an arena and a receiver that
// verifies with kernels.PageSum, the pages are packed into one span of the
// arena and summed on the device, and Write puts them from there; the
// packs are only queued when it returns (Staged.Pending), and Write waits
// for them. Otherwise (no arena, a receiver that wants xxh3, a refused
// session, an arena with no room) the pages are read into host memory and
// summed there with the receiver's checksum.
func (s *Session) StagePages(kv kernels.PagedKV, pages []int32, tokens []int) (transfer.Staged, error) {
	space := s.snd.space
	if space == nil || s.refused != "" || s.wel.Sum != sumPageSum {
		return transfer.ReadStaged(kv, pages, tokens, s.wel.sum())
	}
	st, ok, err := space.Stage(kv, pages, tokens)
	if err != nil {
		return transfer.Staged{}, fmt.Errorf("ucx: %v: %w", s.key, err)
	}
	if !ok {
		return transfer.ReadStaged(kv, pages, tokens, s.wel.sum())
	}
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.arenaSpans = append(s.arenaSpans, st.Span)
		s.stagings = append(s.stagings, st.Staging)
	}
	s.mu.Unlock()
	if closed {
		// The session ended meanwhile: nothing will put from the span.
		space.Release([]arenaspace.Span{st.Span}, []kernels.Staging{st.Staging}, true, 0)
		return transfer.Staged{}, fmt.Errorf("ucx: %v: %w", s.key, transfer.ErrClosed)
	}
	srcs := make([]transfer.PageSource, len(pages))
	for i := range srcs {
		srcs[i] = stagedPage{s: s, off: st.Offs[i], staging: st.Staging}
	}
	return transfer.Staged{Data: make([][]byte, len(pages)), Srcs: srcs, Pending: st.Staging}, nil
}

// releaseSpans gives the session's arena bytes back once the session
// ended: at once when flushed (no put of it reads them any more), else
// after the quarantine. end calls it after setting closed, so no span is
// added afterwards.
func (s *Session) releaseSpans(flushed bool) {
	space := s.snd.space
	if space == nil {
		return
	}
	s.mu.Lock()
	spans, stagings := s.arenaSpans, s.stagings
	s.arenaSpans, s.stagings = nil, nil
	s.mu.Unlock()
	space.Release(spans, stagings, flushed, s.snd.cfg.quarantine)
}
