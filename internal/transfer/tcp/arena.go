package tcp

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// Staged pages (cuda-ipc). The sender packs a prompt's pages into its
// arena, device memory the decode worker maps by handle, and sends REF
// frames that say where each page is; the receiver copies each page out of
// the arena into the page the frame names, through the Sink's gate, so
// only decode's process ever writes decode's pool. A session's bytes in
// the arena are reused only once the receiver confirmed the session's end
// (every frame processed: no copy out of them is left), or after a
// quarantine when it did not.

// arenaAlign keeps every staged page on a boundary the copy kernels'
// vector loads like.
const arenaAlign = 256

// span is a range of arena bytes [off, end).
type span struct{ off, end int }

// arenaSpace hands out a sender's arena bytes to its sessions, first fit.
type arenaSpace struct {
	arena kernels.Arena
	mu    sync.Mutex
	free  []span // sorted, coalesced
	// stats, for tests and logs
	staged, fellBack, quarantined int
}

func newArenaSpace(a kernels.Arena) *arenaSpace {
	return &arenaSpace{arena: a, free: []span{{0, a.Size() / arenaAlign * arenaAlign}}}
}

// take finds n bytes (n a multiple of arenaAlign), or reports none.
func (s *arenaSpace) take(n int) (span, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.free {
		if f.end-f.off >= n {
			got := span{f.off, f.off + n}
			if s.free[i].off += n; s.free[i].off == s.free[i].end {
				s.free = slices.Delete(s.free, i, i+1)
			}
			return got, true
		}
	}
	s.fellBack++
	return span{}, false
}

// give returns spans to the free list.
func (s *arenaSpace) give(spans []span) {
	if len(spans) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, spans...)
	slices.SortFunc(s.free, func(a, b span) int { return a.off - b.off })
	out := s.free[:1]
	for _, f := range s.free[1:] {
		if last := &out[len(out)-1]; f.off <= last.end {
			last.end = max(last.end, f.end)
		} else {
			out = append(out, f)
		}
	}
	s.free = out
}

// freeBytes is how much of the arena no session holds.
func (s *arenaSpace) freeBytes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.free {
		n += f.end - f.off
	}
	return n
}

// stagedRef is a staged page as the sending session knows it: where in
// its arena the rows are, and the staging that puts them there. Only the
// session that staged it sends it, and only once the staging is done.
type stagedRef struct {
	s       *Session
	off     int
	staging kernels.Staging
}

// Land implements transfer.PageSource; a staged page lands only on the
// decode side, from the REF frame that names it.
func (stagedRef) Land(kernels.PagedKV, int32, int) (int, error) {
	return 0, errors.New("tcp: a staged page lands on the receiving side only")
}

// StagePages implements transfer.Stager: with an arena, the pages are
// packed into one span of it, summed on the device (kernels.PageSum) and
// go as REF frames; when the arena has no room for them they are read
// into host memory, summed there the same way, and go as PAGE frames.
// Without an arena the session is plain tcp: pages read into host memory,
// transfer.Checksum. The packs are only queued when it returns
// (Staged.Pending); Write waits for them before it queues a REF.
func (s *Session) StagePages(kv kernels.PagedKV, pages []int32, tokens []int) (transfer.Staged, error) {
	if s.space == nil {
		return transfer.ReadStaged(kv, pages, tokens, transfer.Checksum)
	}
	if len(pages) != len(tokens) {
		return transfer.Staged{}, fmt.Errorf("tcp: %d pages and %d token counts", len(pages), len(tokens))
	}
	offs := make([]int, len(pages))
	total := 0
	for i, t := range tokens {
		offs[i] = total
		total += (kv.PackedBytes(t) + arenaAlign - 1) / arenaAlign * arenaAlign
	}
	sp, ok := s.space.take(total)
	if !ok {
		return transfer.ReadStaged(kv, pages, tokens, kernels.PageSum)
	}
	for i := range offs {
		offs[i] += sp.off
	}
	staging, err := s.space.arena.Stage(pages, tokens, offs)
	if err != nil {
		s.space.give([]span{sp})
		return transfer.Staged{}, fmt.Errorf("tcp: %v: staging %d pages: %w", s.key, len(pages), err)
	}
	s.mu.Lock()
	s.spans = append(s.spans, sp)
	s.stagings = append(s.stagings, staging)
	s.mu.Unlock()
	s.space.mu.Lock()
	s.space.staged += len(pages)
	s.space.mu.Unlock()
	srcs := make([]transfer.PageSource, len(pages))
	for i := range srcs {
		srcs[i] = stagedRef{s: s, off: offs[i], staging: staging}
	}
	return transfer.Staged{Data: make([][]byte, len(pages)), Srcs: srcs, Pending: staging}, nil
}

// releaseSpans gives the session's arena bytes back: at once when the
// receiver confirmed the end, else after the quarantine.
func (s *Session) releaseSpans(confirmed bool) {
	if s.space == nil {
		return
	}
	s.mu.Lock()
	spans, stagings := s.spans, s.stagings
	s.spans, s.stagings = nil, nil
	s.mu.Unlock()
	// Every staging is waited for, sent or not, which frees what it holds;
	// the bytes it packs into are not reused before it is done.
	for _, st := range stagings {
		_, _ = st.Wait()
	}
	if len(spans) == 0 {
		return
	}
	if confirmed {
		s.space.give(spans)
		return
	}
	s.space.mu.Lock()
	s.space.quarantined += len(spans)
	s.space.mu.Unlock()
	time.AfterFunc(s.cfg.quarantine, func() { s.space.give(spans) })
}

// ArenaStats says how a sender's arena was used: pages staged, stagings
// that found no room (their pages went in the frames), sessions whose
// bytes were quarantined, and the bytes free now.
type ArenaStats struct {
	Staged, FellBack, Quarantined, FreeBytes int
}

// ArenaStats reports the arena's use; zero without one.
func (s *Sender) ArenaStats() ArenaStats {
	if s.space == nil {
		return ArenaStats{}
	}
	free := s.space.freeBytes()
	s.space.mu.Lock()
	defer s.space.mu.Unlock()
	return ArenaStats{Staged: s.space.staged, FellBack: s.space.fellBack, Quarantined: s.space.quarantined, FreeBytes: free}
}

// peerSet is a receiver's mapped sender arenas, opened once per arena and
// shared by that sender's sessions.
type peerSet struct {
	imp  kernels.PeerImporter
	mu   sync.Mutex
	open map[string]*peer
}

// maxPeers bounds the arenas a receiver keeps mapped; an idle one is
// unmapped to make room (a prefill worker that restarted has a new arena).
const maxPeers = 64

type peer struct {
	handle string
	mem    kernels.PeerMemory
	users  int
	used   time.Time
}

func (ps *peerSet) acquire(handle []byte) (*peer, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if p := ps.open[string(handle)]; p != nil {
		p.users++
		p.used = time.Now()
		return p, nil
	}
	if len(ps.open) >= maxPeers {
		var idle *peer
		for _, p := range ps.open {
			if p.users == 0 && (idle == nil || p.used.Before(idle.used)) {
				idle = p
			}
		}
		if idle == nil {
			return nil, fmt.Errorf("%d sender arenas mapped and in use", len(ps.open))
		}
		_ = idle.mem.Close()
		delete(ps.open, idle.handle)
	}
	mem, err := ps.imp.OpenPeer(handle)
	if err != nil {
		return nil, err
	}
	p := &peer{handle: string(handle), mem: mem, users: 1, used: time.Now()}
	ps.open[p.handle] = p
	return p, nil
}

func (ps *peerSet) release(p *peer) {
	ps.mu.Lock()
	p.users--
	ps.mu.Unlock()
}

// closeAll unmaps every arena; no session may be running.
func (ps *peerSet) closeAll() {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for h, p := range ps.open {
		_ = p.mem.Close()
		delete(ps.open, h)
	}
}

// peerPage is a staged page as the receiver knows it: an offset in a
// mapped arena, copied into the decode pool (which must be the importer's).
type peerPage struct {
	into kernels.PeerImporter
	mem  kernels.PeerMemory
	off  int
	// landed is set to the bytes queued, for the session's count; queued
	// is the connection's count of copies not yet drained.
	landed *int
	queued *int
}

// Land implements transfer.PageSource. It only queues the copy: the
// receiver that made the page drains it (connState.drain) before it reads
// on from the socket, acknowledges, or returns.
func (p peerPage) Land(kv kernels.PagedKV, page int32, tokens int) (int, error) {
	if kv.Device == nil || any(kv.Device) != any(p.into) {
		return 0, errors.New("tcp: a staged page can only land in the pool that mapped its arena")
	}
	// Counted before the call: a launch that failed half-way may have
	// left the stream in an error only a drain reports.
	*p.queued++
	if err := p.mem.QueuePage(page, tokens, p.off); err != nil {
		return 0, err
	}
	*p.landed = kv.PackedBytes(tokens)
	return *p.landed, nil
}
