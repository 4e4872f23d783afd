package tcp

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/arenaspace"
)

// Staged pages (cuda-ipc). The sender packs a prompt's pages into its
// arena, device memory the decode worker maps by handle, and sends REF
// frames that say where each page is; the receiver copies each page out of
// the arena into the page the frame names, through the Sink's gate, so
// only decode's process ever writes decode's pool. A session's bytes in
// the arena are reused only once the receiver confirmed the session's end
// (every frame processed: no copy out of them is left), or after a
// quarantine when it did not.

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
	st, ok, err := s.space.Stage(kv, pages, tokens)
	if err != nil {
		return transfer.Staged{}, fmt.Errorf("tcp: %v: %w", s.key, err)
	}
	if !ok {
		return transfer.ReadStaged(kv, pages, tokens, kernels.PageSum)
	}
	s.mu.Lock()
	s.spans = append(s.spans, st.Span)
	s.stagings = append(s.stagings, st.Staging)
	s.mu.Unlock()
	srcs := make([]transfer.PageSource, len(pages))
	for i := range srcs {
		srcs[i] = stagedRef{s: s, off: st.Offs[i], staging: st.Staging}
	}
	return transfer.Staged{Data: make([][]byte, len(pages)), Srcs: srcs, Pending: st.Staging}, nil
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
	s.space.Release(spans, stagings, confirmed, s.cfg.quarantine)
}

// ArenaStats says how a sender's arena was used: pages staged, stagings
// that found no room (their pages went in the frames), sessions whose
// bytes were quarantined, and the bytes free now.
type ArenaStats = arenaspace.Stats

// ArenaStats reports the arena's use; zero without one.
func (s *Sender) ArenaStats() ArenaStats {
	if s.space == nil {
		return ArenaStats{}
	}
	return s.space.Stats()
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
