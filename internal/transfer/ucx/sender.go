//go:build ucx

package ucx

/*
#include "bt.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/arenaspace"
)

// Sender is the prefill side: one UCX worker for all its sessions. It
// implements transfer.Sender; Close it when done.
type Sender struct {
	cfg  config
	ctx  *ucpContext
	eng  *engine
	host string

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool

	// peers is engine goroutine only.
	peers map[string]*peer

	// space hands out the arena (WithArena; nil without one), registered
	// with ctx as arenaMemh at arenaBase until Close.
	space     *arenaspace.Space
	arenaMemh C.ucp_mem_h
	arenaBase uintptr
}

var _ transfer.Sender = (*Sender)(nil)

// maxIdlePeers bounds the endpoints a sender keeps to receivers no session
// uses at the moment.
const maxIdlePeers = 32

// peer is an endpoint to one receiver's worker and its unpacked remote
// key, shared by every session to that receiver's memory: sessions come
// and go with requests, and a new endpoint and key per session would pay
// UCX's connection setup and, on shared memory, the mapping of the whole
// pool (tens of milliseconds) every time. Engine goroutine only.
type peer struct {
	id     string
	ep     *C.bt_ep
	rkey   C.ucp_rkey_h
	refs   int
	idle   time.Time
	orphan bool // out of the map (failed): close when the last session lets go
}

// NewSender makes a UCX context and worker for sessions, and registers
// the arena with the context (WithArena).
func NewSender(opts ...Option) (*Sender, error) {
	cfg := newConfig(opts)
	ctx, err := newContext(cfg)
	if err != nil {
		return nil, err
	}
	s := &Sender{cfg: cfg, ctx: ctx, host: hostID(), sessions: map[*Session]struct{}{}, peers: map[string]*peer{}}
	if cfg.arena != nil {
		if err := s.mapArena(cfg.arena); err != nil {
			ctx.unref()
			return nil, err
		}
	}
	eng, err := startEngine("sender", ctx, cfg.spin)
	if err != nil {
		s.unmapArena()
		ctx.unref()
		return nil, err
	}
	s.eng = eng
	if s.space == nil {
		ctx.unref() // the engine holds its own reference
	}
	// else the sender keeps its reference until Close unmaps the arena.
	return s, nil
}

// mapArena registers the arena's device memory with the sender's context,
// as CUDA memory unless it is host memory too (the emulated driver's).
func (s *Sender) mapArena(a kernels.Arena) error {
	dr, ok := a.(kernels.DeviceRange)
	if !ok {
		return fmt.Errorf("ucx: WithArena: the arena (%T) gives no device range to register", a)
	}
	addr, n, hostVisible := dr.Range()
	if addr == 0 || n <= 0 || n < a.Size() {
		return fmt.Errorf("ucx: WithArena: arena of %d bytes at %#x", n, addr)
	}
	cuda := C.int(1)
	if hostVisible {
		cuda = 0
	}
	var base unsafe.Pointer
	var got C.size_t
	s.ctx.mu.Lock()
	st := C.bt_mem_map(s.ctx.h, C.uintptr_t(addr), C.size_t(n), 0, cuda, &s.arenaMemh, &base, &got)
	s.ctx.mu.Unlock()
	if st != C.UCS_OK {
		return statusErr(fmt.Sprintf("ucp_mem_map(arena, %d bytes, cuda %v)", n, !hostVisible), st)
	}
	s.space, s.arenaBase = arenaspace.New(a), addr
	return nil
}

// unmapArena undoes mapArena once no put can read the arena.
func (s *Sender) unmapArena() {
	if s.space == nil {
		return
	}
	s.ctx.mu.Lock()
	C.ucp_mem_unmap(s.ctx.h, s.arenaMemh)
	s.ctx.mu.Unlock()
}

// ArenaStats says how the sender's arena was used (zero without one).
func (s *Sender) ArenaStats() arenaspace.Stats {
	if s.space == nil {
		return arenaspace.Stats{}
	}
	return s.space.Stats()
}

// Close aborts the sessions still open and stops the worker.
func (s *Sender) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	open := make([]*Session, 0, len(s.sessions))
	for ss := range s.sessions {
		open = append(open, ss)
	}
	s.mu.Unlock()
	for _, ss := range open {
		_ = ss.Abort()
	}
	_ = s.eng.call(func() error {
		for _, p := range s.peers {
			s.closePeer(p)
		}
		return nil
	})
	s.eng.stop()
	if s.space != nil {
		// The worker is gone: no put reads the arena any more.
		s.unmapArena()
		s.ctx.unref()
	}
	return nil
}

// getPeer returns the endpoint and key for a receiver, making them if
// needed, with a reference taken (engine goroutine).
func (s *Sender) getPeer(w welcome, errPeer bool) (*peer, error) {
	id := string(w.WorkerAddr) + "\x00" + string(w.RKey)
	if p := s.peers[id]; p != nil {
		if C.bt_ep_failed(p.ep) == 0 {
			p.refs++
			return p, nil
		}
		delete(s.peers, id)
		p.orphan = true
		if p.refs == 0 {
			s.closePeer(p)
		}
	}
	ep := (*C.bt_ep)(C.calloc(1, C.size_t(unsafe.Sizeof(C.bt_ep{}))))
	addr := C.CBytes(w.WorkerAddr)
	defer C.free(addr)
	mode := C.int(0)
	if errPeer {
		mode = 1
	}
	if st := C.bt_ep_create(s.eng.w, addr, mode, ep); st != C.UCS_OK {
		C.free(unsafe.Pointer(ep))
		return nil, statusErr("ucp_ep_create", st)
	}
	p := &peer{id: id, ep: ep}
	kb := C.CBytes(w.RKey)
	defer C.free(kb)
	if st := C.ucp_ep_rkey_unpack(ep.ep, kb, &p.rkey); st != C.UCS_OK {
		p.rkey = nil
		p.orphan = true
		s.closePeer(p)
		return nil, statusErr("ucp_ep_rkey_unpack", st)
	}
	s.peers[id] = p
	p.refs = 1
	s.evictIdle()
	return p, nil
}

// unref drops a session's reference (engine goroutine).
func (s *Sender) unref(p *peer) {
	p.refs--
	if p.refs > 0 {
		return
	}
	p.idle = time.Now()
	if p.orphan || C.bt_ep_failed(p.ep) != 0 {
		s.closePeer(p)
		return
	}
	s.evictIdle()
}

// evictIdle closes the longest-idle unused endpoints past maxIdlePeers
// (engine goroutine).
func (s *Sender) evictIdle() {
	var idle []*peer
	for _, p := range s.peers {
		if p.refs == 0 {
			idle = append(idle, p)
		}
	}
	if len(idle) <= maxIdlePeers {
		return
	}
	slices.SortFunc(idle, func(a, b *peer) int { return a.idle.Compare(b.idle) })
	for _, p := range idle[:len(idle)-maxIdlePeers] {
		s.closePeer(p)
	}
}

// closePeer destroys an unused endpoint (engine goroutine). Force mode:
// every session that used it has flushed or was aborted, and a flushing
// close to a receiver that is gone would never complete.
func (s *Sender) closePeer(p *peer) {
	if s.peers[p.id] == p {
		delete(s.peers, p.id)
	}
	ep := p.ep
	if s.eng.dead {
		// The worker took the endpoint and key with it.
		C.free(unsafe.Pointer(ep))
		return
	}
	if p.rkey != nil {
		C.ucp_rkey_destroy(p.rkey)
		p.rkey = nil
	}
	var req unsafe.Pointer
	if C.bt_ep_close(ep.ep, 1, &req) == C.UCS_INPROGRESS {
		s.eng.track(req, func(C.ucs_status_t) { C.free(unsafe.Pointer(ep)) })
		return
	}
	C.free(unsafe.Pointer(ep))
}

// Transports lists the UCX resources this sender's context selected.
func (s *Sender) Transports() []string { return s.ctx.resources() }

// Open connects to a receiver's control address, gets the reservation's
// description and the remote key, and makes an endpoint to the receiver's
// worker. A reservation the receiver refuses still opens: its writes are
// refused and Flush reports why (transfer.ErrRefused), as with tcp.
func (s *Sender) Open(ctx context.Context, addr string, k transfer.Key) (transfer.Session, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("ucx: %v: %w (sender closed)", k, transfer.ErrClosed)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ucx: dial %s for %v: %w", addr, k, err)
	}
	fail := func(err error) (transfer.Session, error) {
		_ = c.Close()
		return nil, err
	}
	dl := time.Now().Add(s.cfg.handshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	raw := c
	c, id, err := s.cfg.handshake.Open(raw, dl)
	if err != nil {
		stop()
		_ = raw.Close()
		return nil, fmt.Errorf("ucx: session with %s for %v: %w", addr, k, err)
	}
	_ = c.SetDeadline(dl)
	_, err = c.Write(hello{Room: k.Room, Epoch: k.Epoch, PID: uint32(os.Getpid()), Host: s.host, Cap: k.Cap}.marshal())
	var (
		typ byte
		p   []byte
	)
	if err == nil {
		typ, p, err = readMsg(c)
	}
	stop()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fail(fmt.Errorf("ucx: handshake with %s for %v: %w", addr, k, err))
	}
	_ = c.SetDeadline(time.Time{})
	ss := &Session{snd: s, key: k, id: id, addr: addr, conn: c, readerDone: make(chan struct{})}
	ss.cond.L = &ss.mu
	switch typ {
	case msgRefuse:
		// No key: nothing of this session can land. Its writes, and every
		// Flush, report the receiver's reason.
		ss.refused = string(p)
		ss.refusal = string(p)
	case msgWelcome:
		w, err := parseWelcome(p)
		if err != nil {
			return fail(fmt.Errorf("ucx: welcome from %s for %v: %w", addr, k, err))
		}
		ss.wel = w
		ss.kv = w.layout()
		ss.pageBytes = w.pageBytes()
		ss.npages = w.Length / ss.pageBytes
		peer := false
		switch s.cfg.errMode {
		case ErrModePeer:
			peer = true
		case ErrModeAuto:
			peer = !sameHost(s.host, w.Host)
		}
		if err := ss.connect(peer); err != nil {
			return fail(fmt.Errorf("ucx: endpoint to %s for %v: %w", addr, k, err))
		}
	default:
		return fail(fmt.Errorf("ucx: handshake with %s for %v: %w: message type %d", addr, k, errMalformed, typ))
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ss.Abort()
		return nil, fmt.Errorf("ucx: %v: %w (sender closed)", k, transfer.ErrClosed)
	}
	s.sessions[ss] = struct{}{}
	s.mu.Unlock()
	go ss.readLoop()
	return ss, nil
}

// Session is one open session; see transfer.Session. Write, Flush and
// Bytes may be called from several goroutines.
type Session struct {
	snd  *Sender
	key  transfer.Key
	id   transfer.SessionID
	addr string
	conn net.Conn

	wel       welcome
	kv        kernels.PagedKV // the decode layout (no Data)
	pageBytes uint64
	npages    uint64
	refused   string // the receiver's reason, if it refused the session

	// peer is set by connect; released (engine goroutine only) once
	// Close or Abort let go of it.
	peer     *peer
	released bool

	mu       sync.Mutex
	cond     sync.Cond
	inflight int64 // bytes of puts not yet complete locally
	issued   int64 // bytes of puts issued
	refusal  string
	failErr  error
	closed   bool

	landed     atomic.Int64
	readerDone chan struct{}

	// arenaSpans and stagings are this session's in the sender's arena,
	// under mu; given back when the session ends (releaseSpans).
	arenaSpans []arenaspace.Span
	stagings   []kernels.Staging

	endOnce sync.Once
	endErr  error
}

var _ transfer.Session = (*Session)(nil)

// ID names the session as its handshake did; decode takes Commit only
// from the session it admitted.
func (s *Session) ID() transfer.SessionID { return s.id }

// connect takes a reference on the endpoint and key to the receiver.
func (s *Session) connect(errPeer bool) error {
	return s.snd.eng.call(func() (err error) {
		s.peer, err = s.snd.getPeer(s.wel, errPeer)
		return err
	})
}

// EndpointInfo is ucp_ep_print_info for this session's endpoint: its
// lanes and the transports they use (for logs and tests).
func (s *Session) EndpointInfo() string {
	var out string
	_ = s.snd.eng.call(func() error {
		if s.peer == nil || s.released {
			return nil
		}
		if p := C.bt_ep_info(s.peer.ep.ep); p != nil {
			out = C.GoString(p)
			C.free(unsafe.Pointer(p))
		}
		return nil
	})
	return out
}

// span is one put: n bytes from the payload at src to the page memory at
// off (relative to the registered base).
type span struct {
	src, n int
	off    uint64
}

// spans maps a checked write of n packed bytes onto the decode layout: a
// full page is one put of the whole page (its packed rows are the page's
// memory); a partial page is, for every layer, one put at the start of its
// K block and one at the start of its V block, each tokens rows long, from
// consecutive offsets of the packed rows.
func (s *Session) spans(w transfer.PageWrite, n int) []span {
	if w.Tokens == s.kv.PageSize {
		return []span{{0, n, uint64(w.Page) * s.pageBytes}}
	}
	eb := s.kv.ElemBytes()
	rows := w.Tokens * s.kv.RowFloats() * eb
	out := make([]span, 0, 2*s.kv.Layers)
	src := 0
	for l := 0; l < s.kv.Layers; l++ {
		for _, off := range []int{s.kv.KOffset(int(w.Page), l, 0), s.kv.VOffset(int(w.Page), l, 0)} {
			out = append(out, span{src, rows, uint64(off) * uint64(eb)})
			src += rows
		}
	}
	return out
}

// check is the one-sided form of the receiver's gate, against the
// reservation the receiver described; "" admits the write.
func (s *Session) check(w transfer.PageWrite) string {
	switch {
	case w.Index >= len(s.wel.Pages):
		return fmt.Sprintf("index %d outside the %d-page reservation %v", w.Index, len(s.wel.Pages), s.key)
	case s.wel.Pages[w.Index] != w.Page:
		return fmt.Sprintf("page %d is not index %d of %v (that is page %d)", w.Page, w.Index, s.key, s.wel.Pages[w.Index])
	case w.Page < 0 || uint64(w.Page) >= s.npages:
		return fmt.Sprintf("page %d outside the %d registered pages", w.Page, s.npages)
	case w.Tokens < 1 || w.Tokens > s.kv.PageSize:
		return fmt.Sprintf("%d tokens for a page of %d", w.Tokens, s.kv.PageSize)
	case w.Src == nil && len(w.Data) != transfer.PackedSize(s.kv, w.Tokens):
		return fmt.Sprintf("payload of %d bytes for %d tokens, want %d", len(w.Data), w.Tokens, transfer.PackedSize(s.kv, w.Tokens))
	}
	return ""
}

// Write checks a page against the reservation and queues its puts on the
// engine. It blocks while the session's puts not yet complete locally
// exceed the in-flight bound, and fails once the session is closed or
// broken. A write the reservation does not allow is not put; Flush
// reports it. The session owns w.Data until the puts completed (the
// memory is pinned meanwhile and read in place). A page this session
// staged (StagePages) is put from the arena once its staging is done.
func (s *Session) Write(w transfer.PageWrite) error {
	if w.Index < 0 || w.Tokens < 0 {
		return fmt.Errorf("ucx: %v: bad page write (index %d, tokens %d)", s.key, w.Index, w.Tokens)
	}
	var src uintptr // the staged rows' device address; 0 for w.Data
	if w.Src != nil {
		ref, ok := w.Src.(stagedPage)
		if !ok || ref.s != s {
			return fmt.Errorf("ucx: %v: page index %d is staged by another session or transport", s.key, w.Index)
		}
		// The put reads the arena on UCX's side, on no stream of the
		// device's: nothing but this wait orders it after the pack.
		if _, err := ref.staging.Wait(); err != nil {
			return fmt.Errorf("ucx: %v: page index %d: staging: %w", s.key, w.Index, err)
		}
		src = s.snd.arenaBase + uintptr(ref.off)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.endedLocked(); err != nil {
		return err
	}
	if s.refused != "" {
		s.refuseLocked(s.refused)
		return nil
	}
	if why := s.check(w); why != "" {
		s.refuseLocked(fmt.Sprintf("page %d (index %d): %s", w.Page, w.Index, why))
		return nil
	}
	size := len(w.Data)
	if src != 0 {
		size = transfer.PackedSize(s.kv, w.Tokens)
	}
	n := int64(size)
	for s.inflight > 0 && s.inflight+n > s.snd.cfg.maxInFlight && s.endedLocked() == nil {
		s.cond.Wait()
	}
	if err := s.endedLocked(); err != nil {
		return err
	}
	s.inflight += n
	s.issued += n
	spans := s.spans(w, size)
	// Go memory stays pinned until UCX is done with it; the arena's
	// bytes are the session's until it ends, which waits for the puts.
	var pin *runtime.Pinner
	if src == 0 {
		pin = new(runtime.Pinner)
		pin.Pin(&w.Data[0])
		src = uintptr(unsafe.Pointer(&w.Data[0]))
	}
	unpin := func() {
		if pin != nil {
			pin.Unpin()
		}
	}
	if err := s.snd.eng.submit(func() { s.put(src, spans, unpin, n) }); err != nil {
		unpin()
		s.inflight -= n
		s.issued -= n
		return fmt.Errorf("ucx: %v: %w (%v)", s.key, transfer.ErrClosed, err)
	}
	return nil
}

// put issues a write's puts from base (engine goroutine); unpin lets go of
// the payload once every put of it completed locally, since UCX may read
// it until then.
func (s *Session) put(base uintptr, spans []span, unpin func(), n int64) {
	outstanding := 0
	finish := func() {
		unpin()
		s.mu.Lock()
		s.inflight -= n
		s.cond.Broadcast()
		s.mu.Unlock()
	}
	if s.released || C.bt_ep_failed(s.peer.ep) != 0 {
		finish()
		return
	}
	for _, sp := range spans {
		var req unsafe.Pointer
		st := C.bt_put(s.peer.ep.ep, C.uintptr_t(base+uintptr(sp.src)), C.size_t(sp.n), C.uint64_t(s.wel.Base+sp.off), s.peer.rkey, &req)
		if st == C.UCS_INPROGRESS {
			outstanding++
			s.snd.eng.track(req, func(st C.ucs_status_t) {
				if st != C.UCS_OK {
					s.fail("put", statusErr("ucp_put_nbx", st))
				}
				outstanding--
				if outstanding == 0 {
					finish()
				}
			})
			continue
		}
		if st != C.UCS_OK {
			s.fail("put", statusErr("ucp_put_nbx", st))
			break
		}
	}
	if outstanding == 0 {
		finish()
	}
}

// Flush returns once every put issued before it is remotely complete
// (ucp_ep_flush_nbx completed), with the session's first refusal (wrapping
// transfer.ErrRefused), a UCX or connection failure (wrapping
// transfer.ErrClosed), or ctx's error.
func (s *Session) Flush(ctx context.Context) error {
	s.mu.Lock()
	if err := s.endedLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	issued := s.issued
	s.mu.Unlock()
	if s.peer != nil {
		eng := s.snd.eng
		ch := make(chan C.ucs_status_t, 1)
		err := eng.submit(func() {
			if s.released {
				ch <- C.UCS_ERR_CANCELED
				return
			}
			var req unsafe.Pointer
			st := C.bt_ep_flush(s.peer.ep.ep, &req)
			if st == C.UCS_INPROGRESS {
				eng.track(req, func(st C.ucs_status_t) { ch <- st })
				return
			}
			ch <- st
		})
		if err != nil {
			return fmt.Errorf("ucx: %v: %w (%v)", s.key, transfer.ErrClosed, err)
		}
		select {
		case st := <-ch:
			if st != C.UCS_OK {
				s.fail("flush", statusErr("ucp_ep_flush_nbx", st))
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		s.mu.Lock()
		err = s.endedLocked()
		s.mu.Unlock()
		if err != nil {
			return err
		}
		for {
			old := s.landed.Load()
			if old >= issued || s.landed.CompareAndSwap(old, issued) {
				break
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusal != "" {
		return fmt.Errorf("ucx: %v: %w: %s", s.key, transfer.ErrRefused, s.refusal)
	}
	return nil
}

// Bytes counts the payload bytes remotely complete as of the last Flush.
func (s *Session) Bytes() int64 { return s.landed.Load() }

// Close ends the session: puts already queued are issued, then the
// endpoint is flushed (ucp_ep_flush_nbx: it completes only after every put
// issued on it is remotely complete) and the session lets go of it (the
// endpoint itself is shared with the sender's other sessions to the same
// receiver, and destroyed when unused); only then END tells the receiver,
// which calls Sink.Closed and closes the control connection. Close waits
// for that (up to the close timeout). A nil error means no put of this
// session is in flight or will be issued. If the flush fails or does not
// complete within the close timeout, Close returns an error and sends no
// END: puts may still land.
func (s *Session) Close() error { return s.end(false) }

// Abort ends the session the way a crashed process would: no flush, and
// the control connection dropped without END, so the receiver has no proof
// and calls no Closed (puts already issued may still land). Close after
// Abort is a no-op.
func (s *Session) Abort() error { return s.end(true) }

func (s *Session) end(abort bool) error {
	s.endOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.cond.Broadcast()
		s.mu.Unlock()
		// Every Write that got in queued its puts before this command.
		epErr := s.closeEndpoint(abort)
		// The arena's bytes are free again only once the flush proved
		// every put from them remotely complete.
		s.releaseSpans(!abort && epErr == nil)
		if abort {
			if tc, ok := s.conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0)
			}
			_ = s.conn.Close()
			<-s.readerDone
		} else {
			if epErr == nil {
				_ = s.conn.SetWriteDeadline(time.Now().Add(s.snd.cfg.closeTimeout))
				_, _ = s.conn.Write(frame(msgEnd, nil))
			}
			// The receiver closes its end after Closed; wait for it.
			_ = s.conn.SetReadDeadline(time.Now().Add(s.snd.cfg.closeTimeout))
			<-s.readerDone
			_ = s.conn.Close()
			s.endErr = epErr
		}
		s.snd.mu.Lock()
		delete(s.snd.sessions, s)
		s.snd.mu.Unlock()
	})
	return s.endErr
}

// closeEndpoint lets go of the endpoint, after flushing it unless abort,
// waiting up to the close timeout for the flush.
func (s *Session) closeEndpoint(abort bool) error {
	if s.peer == nil {
		return nil
	}
	eng := s.snd.eng
	ch := make(chan C.ucs_status_t, 1)
	err := eng.submit(func() {
		if s.released {
			ch <- C.UCS_OK
			return
		}
		s.released = true
		p := s.peer
		if abort {
			s.snd.unref(p)
			ch <- C.UCS_OK
			return
		}
		done := func(st C.ucs_status_t) {
			s.snd.unref(p)
			ch <- st
		}
		var req unsafe.Pointer
		if st := C.bt_ep_flush(p.ep.ep, &req); st == C.UCS_INPROGRESS {
			eng.track(req, done)
		} else {
			done(st)
		}
	})
	if err != nil {
		// The engine is gone, and with it the worker and the endpoint.
		return nil
	}
	t := time.NewTimer(s.snd.cfg.closeTimeout)
	defer t.Stop()
	select {
	case st := <-ch:
		if st != C.UCS_OK {
			err := statusErr("ucp_ep_flush_nbx", st)
			s.fail("close", err)
			return fmt.Errorf("ucx: %v: flush before the end of the session failed (%v); puts may still land", s.key, err)
		}
		return nil
	case <-t.C:
		return fmt.Errorf("ucx: %v: endpoint to %s did not flush within %v; puts may still land", s.key, s.addr, s.snd.cfg.closeTimeout)
	}
}

// readLoop watches the control connection: CLOSING from a receiver that
// shuts down ends the session; an unexpected end breaks it.
func (s *Session) readLoop() {
	defer close(s.readerDone)
	for {
		typ, _, err := readMsg(s.conn)
		if err == nil && typ == msgClosing {
			s.fail("receiver", errors.New("receiver closing"))
			go func() { _ = s.Close() }()
			continue
		}
		if err == nil {
			err = fmt.Errorf("%w: type %d", errMalformed, typ)
		}
		s.fail("control connection", err)
		return
	}
}

func (s *Session) fail(what string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr == nil {
		s.failErr = fmt.Errorf("ucx: %v: %s with %s: %v: %w", s.key, what, s.addr, err, transfer.ErrClosed)
	}
	s.cond.Broadcast()
}

func (s *Session) refuseLocked(why string) {
	if s.refusal == "" {
		s.refusal = why
	}
}

func (s *Session) endedLocked() error {
	if s.closed {
		return fmt.Errorf("ucx: %v: %w", s.key, transfer.ErrClosed)
	}
	if s.failErr != nil {
		return s.failErr
	}
	if s.peer != nil && C.bt_ep_failed(s.peer.ep) != 0 {
		s.failErr = fmt.Errorf("ucx: %v: endpoint to %s failed: %s: %w", s.key, s.addr, C.GoString(C.ucs_status_string(C.bt_ep_status(s.peer.ep))), transfer.ErrClosed)
		return s.failErr
	}
	return nil
}

// describe is for test failures.
func (s *Session) describe() string {
	return strings.TrimSpace(s.EndpointInfo())
}
