package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/arenaspace"
)

// maxBatch is how many queued frames the writer hands to one writev: enough
// to amortise the syscall over small pages, small enough to bound the
// iovec array.
const maxBatch = 16

// Sender is the prefill side. It implements transfer.Sender.
type Sender struct {
	cfg   config
	space *arenaspace.Space // with WithArena
}

var _ transfer.Sender = (*Sender)(nil)

// NewSender returns a sender; each Open dials one connection.
func NewSender(opts ...Option) *Sender {
	s := &Sender{cfg: newConfig(opts)}
	if s.cfg.arena != nil {
		s.space = arenaspace.New(s.cfg.arena)
	}
	return s
}

// Open dials addr and starts a session writing into reservation k. The
// returned session is a *Session.
func (s *Sender) Open(ctx context.Context, addr string, k transfer.Key) (transfer.Session, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcp: dial %s for %v: %w", addr, k, err)
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		_ = c.Close()
		return nil, fmt.Errorf("tcp: dial %s: not a TCP connection", addr)
	}
	tuneConn(tc, s.cfg)
	deadline := time.Now().Add(s.cfg.handshakeTimeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	conn, id, err := s.cfg.handshake.Open(tc, deadline)
	if err != nil {
		_ = tc.Close()
		return nil, fmt.Errorf("tcp: session with %s for %v: %w", addr, k, err)
	}
	var hello [hdrSize + capSize]byte
	putHeader(hello[:], frameHello, capSize, k.Room, k.Epoch, 0)
	copy(hello[hdrSize:], k.Cap[:])
	_ = conn.SetWriteDeadline(deadline)
	if _, err := conn.Write(hello[:]); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("tcp: HELLO to %s for %v: %w", addr, k, err)
	}
	_ = conn.SetWriteDeadline(time.Time{})
	ss := &Session{
		cfg:        s.cfg,
		key:        k,
		id:         id,
		addr:       addr,
		conn:       conn,
		raw:        tc,
		queue:      make(chan item, s.cfg.queueDepth),
		stop:       make(chan struct{}),
		dead:       make(chan struct{}),
		writerDone: make(chan struct{}),
		readerDone: make(chan struct{}),
		pending:    make(map[uint64]chan ack),
		space:      s.space,
	}
	go ss.writeLoop()
	go ss.readLoop()
	return ss, nil
}

// item is one queued frame: a page, or a flush marker.
type item struct {
	w     transfer.PageWrite
	flush bool
	seq   uint64
}

type ack struct {
	landed int64
	text   string
}

// Session is one open session; see transfer.Session. Write, Flush and
// Bytes may be called from several goroutines.
type Session struct {
	cfg  config
	key  transfer.Key
	id   transfer.SessionID
	addr string
	// conn is what the handshake returned (TLS, say) over raw.
	conn net.Conn
	raw  *net.TCPConn

	// queue is bounded: a full queue blocks Write, which is how a slow
	// receiver slows the prefill side down instead of piling up pages.
	queue chan item
	// stop is closed by Close/Abort; dead when the connection failed.
	stop, dead chan struct{}
	deadErr    error
	failOnce   sync.Once

	writerDone, readerDone chan struct{}
	// readEnd is why the reader returned; written before readerDone is
	// closed.
	readEnd error

	mu      sync.Mutex
	seq     uint64
	pending map[uint64]chan ack

	landed atomic.Int64

	// space is the sender's arena (nil without one); spans are this
	// session's bytes in it, under mu. arenaSent: the writer sent the
	// arena's handle (writer goroutine only).
	space     *arenaspace.Space
	spans     []arenaspace.Span
	stagings  []kernels.Staging // this session's, under mu
	arenaSent bool

	endOnce sync.Once
	endErr  error
}

// Write queues a page for the writer goroutine. It blocks while the queue
// is full, and fails once the session is closed or its connection lost.
// The session owns w.Data from then on (it is written straight from it).
func (s *Session) Write(w transfer.PageWrite) error {
	if w.Index < 0 || w.Index > math.MaxInt32 || w.Tokens < 0 || w.Tokens > math.MaxInt32 {
		return fmt.Errorf("tcp: %v: bad page write (index %d, tokens %d)", s.key, w.Index, w.Tokens)
	}
	if w.Src != nil {
		ref, ok := w.Src.(stagedRef)
		if !ok || ref.s != s {
			return fmt.Errorf("tcp: %v: page index %d is staged by another session or transport", s.key, w.Index)
		}
		// The REF tells the receiver to copy the rows, on its own stream
		// in another process: nothing but this wait orders the copy after
		// the pack that puts them in the arena.
		if _, err := ref.staging.Wait(); err != nil {
			return fmt.Errorf("tcp: %v: page index %d: staging: %w", s.key, w.Index, err)
		}
	} else if len(w.Data) > s.cfg.maxPayload {
		return fmt.Errorf("tcp: %v: page payload of %d bytes over the %d-byte limit", s.key, len(w.Data), s.cfg.maxPayload)
	}
	// Checked first so that a closed session never takes a write, which a
	// select with a free queue slot could otherwise pick.
	if err := s.ended(); err != nil {
		return err
	}
	select {
	case s.queue <- item{w: w}:
		return nil
	case <-s.stop:
		return s.closedErr()
	case <-s.dead:
		return s.deadErr
	}
}

// Flush sends a FLUSH behind every page written so far and waits for the
// receiver's ack, which it sends after it passed each of those pages to
// its Sink. It returns the session's first refusal (wrapping
// transfer.ErrRefused), a connection error (wrapping transfer.ErrClosed),
// or ctx's error.
func (s *Session) Flush(ctx context.Context) error {
	if err := s.ended(); err != nil {
		return err
	}
	ch := make(chan ack, 1)
	s.mu.Lock()
	s.seq++
	seq := s.seq
	s.pending[seq] = ch
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pending, seq)
		s.mu.Unlock()
	}()
	select {
	case s.queue <- item{flush: true, seq: seq}:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return s.closedErr()
	case <-s.dead:
		return s.deadErr
	}
	var a ack
	select {
	case a = <-ch:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return s.closedErr()
	case <-s.dead:
		// The ack may have arrived just before the connection ended.
		select {
		case a = <-ch:
		default:
			return s.deadErr
		}
	}
	if a.text != "" {
		return fmt.Errorf("tcp: %v: %w: %s", s.key, transfer.ErrRefused, a.text)
	}
	return nil
}

// ID names the session as its handshake did; decode takes Commit only
// from the session it admitted.
func (s *Session) ID() transfer.SessionID { return s.id }

// Bytes counts the payload bytes the receiver's Sink accepted, as of the
// last flush ack.
func (s *Session) Bytes() int64 { return s.landed.Load() }

// Close ends the session. Pages still queued are dropped (Flush first to
// deliver them). It stops the writer, half-closes the connection, and
// waits until the receiver closed its end, which it does only after
// processing every frame that reached it; then it closes the connection
// and returns once the session's goroutines have. A nil error means no
// write of this session can land any more. If the receiver does not
// confirm within the close timeout, Close drops the connection and
// returns an error: writes may then land until the receiver notices.
func (s *Session) Close() error { return s.end(true) }

// Abort drops the connection at once, without the end-of-session
// handshake, as a crashed process would, and waits for the session's
// goroutines. It says nothing about in-flight writes; the receiver's
// Sink.Closed is the only proof left. Close after Abort is a no-op.
func (s *Session) Abort() error { return s.end(false) }

func (s *Session) end(graceful bool) error {
	// A connection that ended before Close (the receiver evicted the
	// session, a reset) proves nothing about copies out of the arena the
	// receiver may still be finishing: only an end this side started and
	// the receiver confirmed does.
	diedFirst := false
	select {
	case <-s.dead:
		diedFirst = true
	default:
	}
	s.endOnce.Do(func() {
		close(s.stop)
		if !graceful {
			// Linger 0 makes Close send a reset, as when a process dies
			// with unread data.
			_ = s.raw.SetLinger(0)
			_ = s.raw.Close()
			<-s.writerDone
			<-s.readerDone
			return
		}
		// Unblocks a writer stuck on a full socket; the frame it was in
		// is cut short, and the receiver drops a cut frame.
		_ = s.conn.SetWriteDeadline(time.Now())
		<-s.writerDone
		if cw, ok := s.conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_ = s.conn.SetReadDeadline(time.Now().Add(s.cfg.closeTimeout))
		<-s.readerDone
		_ = s.conn.Close()
		s.endErr = s.confirmed()
	})
	s.releaseSpans(graceful && s.endErr == nil && !diedFirst)
	return s.endErr
}

// confirmed says whether the reader's end proves the receiver is done
// with this session. EOF is the receiver closing after its last frame; a
// reset means its socket is gone. A deadline or a garbled ack proves
// nothing.
func (s *Session) confirmed() error {
	err := s.readEnd
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("tcp: %v: receiver at %s did not confirm the end of the session within %v; writes may still land", s.key, s.addr, s.cfg.closeTimeout)
	case errors.Is(err, errMalformed) || errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("tcp: %v: session with %s ended on a protocol error (%v); end not confirmed", s.key, s.addr, err)
	default:
		return nil
	}
}

func (s *Session) ended() error {
	select {
	case <-s.stop:
		return s.closedErr()
	case <-s.dead:
		return s.deadErr
	default:
		return nil
	}
}

func (s *Session) closedErr() error {
	return fmt.Errorf("tcp: %v: %w", s.key, transfer.ErrClosed)
}

func (s *Session) fail(what string, err error) {
	s.failOnce.Do(func() {
		s.deadErr = fmt.Errorf("tcp: %v: %s %s: %v: %w", s.key, what, s.addr, err, transfer.ErrClosed)
		close(s.dead)
	})
}

// writeLoop sends queued frames, batching whatever is queued into one
// writev so page payloads go to the kernel straight from the caller's
// buffers, without a copy.
func (s *Session) writeLoop() {
	defer close(s.writerDone)
	// One header more than a batch: the ARENA frame before a first REF.
	hdrs := make([]byte, (maxBatch+1)*hdrSize)
	refs := make([]byte, maxBatch*refSize)
	vec := make(net.Buffers, 0, 2*maxBatch+2)
	for {
		var it item
		select {
		case <-s.stop:
			return
		case <-s.dead:
			return
		case it = <-s.queue:
		}
		vec = vec[:0]
		n, extra := 0, 0
		for {
			h := hdrs[(n+extra)*hdrSize : (n+extra+1)*hdrSize]
			switch {
			case it.flush:
				putHeader(h, frameFlush, 0, it.seq, 0, 0)
				vec = append(vec, h)
			case it.w.Src != nil:
				if !s.arenaSent {
					handle := s.space.Arena().Handle()
					putHeader(h, frameArena, len(handle), 0, 0, 0)
					vec = append(vec, h, handle)
					s.arenaSent = true
					extra++
					h = hdrs[(n+extra)*hdrSize : (n+extra+1)*hdrSize]
				}
				w := it.w
				ref := refs[n*refSize : (n+1)*refSize]
				binary.LittleEndian.PutUint64(ref, uint64(w.Src.(stagedRef).off))
				putHeader(h, frameRef, refSize, uint64(w.Index), uint64(int64(w.Page)), uint64(w.Tokens))
				vec = append(vec, h, ref)
			default:
				w := it.w
				putHeader(h, framePage, len(w.Data), uint64(w.Index), uint64(int64(w.Page)), uint64(w.Tokens))
				vec = append(vec, h)
				if len(w.Data) > 0 {
					vec = append(vec, w.Data)
				}
			}
			n++
			if n == maxBatch {
				break
			}
			select {
			case it = <-s.queue:
				continue
			default:
			}
			break
		}
		full := vec
		_, err := vec.WriteTo(s.conn) // consumes vec, hence full
		// Let the pages go: this goroutine may sit idle for a long time.
		clear(full[:cap(full)])
		vec = full[:0]
		if err != nil {
			s.fail("writing to", err)
			return
		}
	}
}

// readLoop receives FLUSH_ACKs and hands each to its Flush.
func (s *Session) readLoop() {
	defer close(s.readerDone)
	br := bufio.NewReaderSize(s.conn, 4096)
	var (
		hdr [hdrSize]byte
		buf []byte
	)
	for {
		h, text, keep, err := readFrame(br, &hdr, buf, 0)
		buf = keep
		if err == nil && h.typ != frameAck {
			err = fmt.Errorf("%w: type %d from the receiver", errMalformed, h.typ)
		}
		if err != nil {
			s.readEnd = err
			select {
			case <-s.stop:
			default:
				s.fail("connection lost with", err)
			}
			return
		}
		s.landed.Store(int64(h.b))
		s.mu.Lock()
		ch := s.pending[h.a]
		delete(s.pending, h.a)
		s.mu.Unlock()
		if ch != nil {
			ch <- ack{landed: int64(h.b), text: string(text)}
		}
	}
}
