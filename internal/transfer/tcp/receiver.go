package tcp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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
	st := &connState{cfg: &r.cfg, sink: r.sink, session: id}
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
}

// serveFrames reads frames from r until EOF or an error, calling hello
// once the HELLO is in. It returns nil at a clean EOF between frames.
func (st *connState) serveFrames(r io.Reader, w io.Writer, hello func(transfer.Key)) error {
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
				if st.firstErr == "" {
					st.firstErr = fmt.Sprintf("page %d (index %d): %v", w.Page, w.Index, err)
				}
			} else {
				st.landed += int64(len(payload))
			}
		case frameFlush:
			// Frames are processed in order on this goroutine, so every
			// earlier page has been through the Sink by now.
			text := st.firstErr[:min(len(st.firstErr), maxAckText)]
			st.ack = append(st.ack[:0], make([]byte, hdrSize)...)
			putHeader(st.ack, frameAck, len(text), h.a, uint64(st.landed), 0)
			st.ack = append(st.ack, text...)
			if _, err := w.Write(st.ack); err != nil {
				return fmt.Errorf("writing FLUSH_ACK: %w", err)
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
