package tcp

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/transfer"
)

// Receiver is the decode side: it accepts sessions and passes their page
// frames to a Sink. It implements transfer.Receiver.
type Receiver struct {
	ln   net.Listener
	sink transfer.Sink
	cfg  config
	done chan struct{}
	// peers are the sender arenas mapped (WithPeerImporter), else nil.
	peers *peerSet

	mu sync.Mutex
	// conns maps each open connection to its session's key, the zero Key
	// until its HELLO is in.
	conns  map[net.Conn]transfer.Key
	closed bool
	// wg counts the accept loop and every connection's goroutine; it is
	// what Close joins.
	wg sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

var _ transfer.Receiver = (*Receiver)(nil)

// Listen starts a receiver on addr (host:port; port 0 picks a free one)
// that passes every page frame it receives to sink.
func Listen(addr string, sink transfer.Sink, opts ...Option) (*Receiver, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: listen: %w", err)
	}
	r := &Receiver{
		ln:    ln,
		sink:  sink,
		cfg:   newConfig(opts),
		done:  make(chan struct{}),
		conns: make(map[net.Conn]transfer.Key),
	}
	if r.cfg.importer != nil {
		r.peers = &peerSet{imp: r.cfg.importer, open: map[string]*peer{}}
	}
	r.wg.Add(1)
	go r.acceptLoop()
	return r, nil
}

// Addr is the address senders connect to.
func (r *Receiver) Addr() string { return r.ln.Addr().String() }

// Close stops accepting, closes every open connection and waits until
// every connection's goroutine has returned, which includes each open
// session's Sink.Closed call.
func (r *Receiver) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		conns := make([]net.Conn, 0, len(r.conns))
		for c := range r.conns {
			conns = append(conns, c)
		}
		r.mu.Unlock()
		close(r.done)
		r.closeErr = r.ln.Close()
		for _, c := range conns {
			_ = c.Close()
		}
		r.wg.Wait()
		if r.peers != nil {
			r.peers.closeAll()
		}
	})
	return r.closeErr
}

// Evict implements transfer.Evictor: it closes the connection of session
// k (reservation and session both), whose goroutine then reports Closed.
func (r *Receiver) Evict(k transfer.Key) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for c, ck := range r.conns {
		if ck == k {
			_ = c.Close()
		}
	}
}

func (r *Receiver) acceptLoop() {
	defer r.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: wait for it to pass
			// instead of spinning, as net/http does.
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-r.done:
				t.Stop()
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		tuneConn(c, r.cfg)
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.conns[c] = transfer.Key{}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.serve(c)
	}
}

// serve runs one connection. sink.Closed comes last, after the connection
// is closed and the only goroutine that calls sink.Write for it (this
// one) is done with frames: that order is the drain proof.
func (r *Receiver) serve(c net.Conn) {
	defer r.wg.Done()
	deadline := time.Now().Add(r.cfg.handshakeTimeout)
	conn, id, err := r.cfg.handshake.Accept(c, deadline)
	if err != nil {
		_ = c.Close()
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		return
	}
	_ = conn.SetReadDeadline(deadline)
	var (
		key   transfer.Key
		hello bool
	)
	st := &connState{cfg: &r.cfg, sink: r.sink, session: id, peers: r.peers}
	err = st.serveFrames(bufio.NewReaderSize(conn, 64<<10), conn, func(k transfer.Key) {
		key, hello = k, true
		_ = conn.SetReadDeadline(time.Time{})
		r.mu.Lock()
		if _, open := r.conns[c]; open {
			r.conns[c] = k
		}
		r.mu.Unlock()
	})
	_ = c.Close()
	st.dropArena()
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
	if hello {
		why := "end of session"
		if err != nil {
			why = err.Error()
		}
		r.sink.Closed(key, fmt.Sprintf("tcp: connection from %s closed and receiver joined (%s)", c.RemoteAddr(), why))
	}
}

// connState is one connection's frame processing, kept apart from the
// socket so the fuzz test can drive it with arbitrary bytes.
type connState struct {
	cfg  *config
	sink transfer.Sink
	hdr  [hdrSize]byte
	// buf is reused for every page payload; the Sink may not keep it.
	buf      []byte
	ack      []byte
	firstErr string
	landed   int64
	// session names this connection's session for the Sink; refused is
	// set when the Sink did not admit it.
	session transfer.SessionID
	refused bool
	// peers maps sender arenas (nil: this receiver takes no staged
	// pages); arena is the session's, once its ARENA frame is in, and
	// noArena says its ARENA frame was refused.
	peers   *peerSet
	arena   *peer
	noArena bool
	// queued counts the staged pages whose copies were queued on the
	// decode pool and not yet drained (see serveFrames).
	queued int
}

// refuse notes the session's first refusal, which its next ack carries.
func (st *connState) refuse(format string, args ...any) {
	if st.firstErr == "" {
		st.firstErr = fmt.Sprintf(format, args...)
	}
}

// dropArena lets go of the session's mapped arena.
func (st *connState) dropArena() {
	if st.arena != nil {
		st.peers.release(st.arena)
		st.arena = nil
	}
}

// drain waits for the copies of the staged pages queued since the last
// drain. An error fails the session: its pages are not known to be in
// place (they were counted when queued, and Commit's checksums, computed
// behind the copies on the same stream, catch what did not land).
func (st *connState) drain() error {
	if st.queued == 0 {
		return nil
	}
	st.queued = 0
	if err := st.arena.mem.Drain(); err != nil {
		return fmt.Errorf("copying staged pages out of the sender's arena: %w", err)
	}
	return nil
}

// frameBuffered says whether r holds the whole next frame, so reading it
// cannot block on the socket.
func frameBuffered(r *bufio.Reader) bool {
	n := r.Buffered()
	if n < hdrSize {
		return false
	}
	hdr, _ := r.Peek(hdrSize) // buffered already: Peek does not read
	return uint64(n) >= hdrSize+uint64(binary.LittleEndian.Uint32(hdr[4:]))
}

// serveFrames reads frames from r until EOF or an error, calling hello
// once the HELLO is in. It returns nil at a clean EOF between frames.
//
// Staged pages (REF frames) land in batches: each REF's copy is queued
// through the Sink's gate, page by page as ever, without a wait, and the
// copies queued are drained (one synchronise of the decode pool's stream)
// before anything that stands for them having landed: before the next
// read that could block on the socket (so a batch is every REF already
// buffered), before a FLUSH_ACK is written, and before this returns, so
// before the connection is closed (the end of session the sender takes as
// the receiver's confirmation) and before Sink.Closed. So the drain proof
// keeps its meaning: when Closed is called no copy of the session is in
// flight.
func (st *connState) serveFrames(r *bufio.Reader, w io.Writer, hello func(transfer.Key)) (err error) {
	defer func() {
		if derr := st.drain(); err == nil {
			err = derr
		}
	}()
	return st.frames(r, w, hello)
}

func (st *connState) frames(r *bufio.Reader, w io.Writer, hello func(transfer.Key)) error {
	var (
		h       header
		payload []byte
		err     error
	)
	h, payload, st.buf, err = readFrame(r, &st.hdr, st.buf, st.cfg.maxPayload)
	if err != nil {
		return fmt.Errorf("before HELLO: %w", err)
	}
	if h.typ != frameHello {
		return fmt.Errorf("%w: first frame is type %d, not HELLO", errMalformed, h.typ)
	}
	key := transfer.Key{Room: h.a, Epoch: h.b, Session: st.session}
	key.Cap, _ = transfer.CapabilityFrom(payload) // decodeHeader checked its size
	hello(key)
	if _, err := st.sink.Admit(key); err != nil {
		// Refused sessions stay connected until the sender flushes, so the
		// refusal reaches it as the ack's text; none of its pages lands.
		st.firstErr = fmt.Sprintf("session refused: %v", err)
		st.refused = true
	}
	for {
		if !frameBuffered(r) {
			if err := st.drain(); err != nil {
				return err
			}
		}
		h, payload, st.buf, err = readFrame(r, &st.hdr, st.buf, st.cfg.maxPayload)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		switch h.typ {
		case framePage:
			if st.refused {
				continue
			}
			w := transfer.PageWrite{Index: int(h.a), Page: int32(int64(h.b)), Tokens: int(h.c), Data: payload}
			if err := st.sink.Write(key, w); err != nil {
				st.refuse("page %d (index %d): %v", w.Page, w.Index, err)
			} else {
				st.landed += int64(len(payload))
			}
		case frameArena:
			switch {
			case st.refused || st.noArena:
			case st.arena != nil:
				return fmt.Errorf("%w: a second ARENA in a session", errMalformed)
			case st.peers == nil:
				st.noArena = true
				st.refuse("staged pages refused: this receiver copies no pages from device memory (its transport is not cuda-ipc)")
			default:
				p, err := st.peers.acquire(payload)
				if err != nil {
					st.noArena = true
					st.refuse("staged pages refused: mapping the sender's arena: %v", err)
					continue
				}
				st.arena = p
			}
		case frameRef:
			w := transfer.PageWrite{Index: int(h.a), Page: int32(int64(h.b)), Tokens: int(h.c)}
			off := binary.LittleEndian.Uint64(payload)
			switch {
			case st.refused || st.noArena:
				continue
			case st.arena == nil:
				st.refuse("page %d (index %d): staged, but the session sent no arena", w.Page, w.Index)
				continue
			case off > math.MaxInt:
				st.refuse("page %d (index %d): arena offset %d", w.Page, w.Index, off)
				continue
			}
			src := peerPage{into: st.peers.imp, mem: st.arena.mem, off: int(off), landed: new(int), queued: &st.queued}
			w.Src = src
			if err := st.sink.Write(key, w); err != nil {
				st.refuse("page %d (index %d): %v", w.Page, w.Index, err)
			} else {
				st.landed += int64(*src.landed)
			}
		case frameFlush:
			// Frames are processed in order on this goroutine, so every
			// earlier page has been through the Sink by now, and, drained,
			// every staged one has landed.
			derr := st.drain()
			if derr != nil {
				st.refuse("%v", derr)
			}
			text := st.firstErr[:min(len(st.firstErr), maxAckText)]
			st.ack = append(st.ack[:0], make([]byte, hdrSize)...)
			putHeader(st.ack, frameAck, len(text), h.a, uint64(st.landed), 0)
			st.ack = append(st.ack, text...)
			if _, err := w.Write(st.ack); err != nil {
				return fmt.Errorf("writing FLUSH_ACK: %w", err)
			}
			if derr != nil {
				return derr
			}
		default:
			return fmt.Errorf("%w: unexpected frame type %d in a session", errMalformed, h.typ)
		}
	}
}

// tuneConn sets the socket buffers; failures are harmless (the kernel's
// defaults still work), so they are ignored.
func tuneConn(c net.Conn, cfg config) {
	tc, ok := c.(*net.TCPConn)
	if !ok || cfg.socketBuffer <= 0 {
		return
	}
	_ = tc.SetReadBuffer(cfg.socketBuffer)
	_ = tc.SetWriteBuffer(cfg.socketBuffer)
}
