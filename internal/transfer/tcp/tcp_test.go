package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

func TestConformance(t *testing.T) {
	transfertest.Run(t, func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender) {
		r, err := Listen("127.0.0.1:0", sink)
		if err != nil {
			t.Fatal(err)
		}
		return r, NewSender()
	})
}

// recSink accepts every write and records the calls.
type recSink struct {
	mu     sync.Mutex
	writes int
	closed map[transfer.Key]int
	proofs []string
}

func (s *recSink) Write(transfer.Key, transfer.PageWrite) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return nil
}

func (s *recSink) Admit(transfer.Key) ([]int32, error) { return nil, nil }

func (s *recSink) Closed(k transfer.Key, proof string) {
	k = k.Reservation()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed == nil {
		s.closed = make(map[transfer.Key]int)
	}
	s.closed[k]++
	s.proofs = append(s.proofs, proof)
}

func (s *recSink) counts(k transfer.Key) (writes, closed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes, s.closed[k]
}

func waitGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Errorf("goroutine leak: %d, was %d\n%s", n, base, buf[:runtime.Stack(buf, true)])
	}
}

func frame(typ byte, length int, a, b, c uint64, payload []byte) []byte {
	f := make([]byte, hdrSize, hdrSize+len(payload))
	putHeader(f, typ, length, a, b, c)
	return append(f, payload...)
}

func join(frames ...[]byte) []byte { return bytes.Join(frames, nil) }

// TestHostilePeer speaks raw bytes to a receiver: each malformed or cut
// stream must end its connection, with Closed exactly once if and only if
// a HELLO came in, and no Write for anything but whole valid frames.
func TestHostilePeer(t *testing.T) {
	key := transfer.Key{Room: 7, Epoch: 9, Cap: transfer.NewCapability()}
	hello := frame(frameHello, capSize, key.Room, key.Epoch, 0, key.Cap[:])
	cases := []struct {
		name   string
		bytes  []byte
		hello  bool
		writes int
	}{
		{"Garbage", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n and then some more bytes"), false, 0},
		{"PageBeforeHello", frame(framePage, 4, 0, 0, 1, []byte{1, 2, 3, 4}), false, 0},
		{"OversizePage", append(append([]byte{}, hello...), frame(framePage, 1<<20+1, 0, 0, 1, nil)...), true, 0},
		{"BadVersion", append(append([]byte{}, hello...), func() []byte {
			f := frame(frameFlush, 0, 1, 0, 0, nil)
			f[1] = version + 1
			return f
		}()...), true, 0},
		{"PageIDOutOfRange", append(append([]byte{}, hello...), frame(framePage, 0, 0, 1<<40, 1, nil)...), true, 0},
		{"CutPayload", append(append(append([]byte{}, hello...), frame(framePage, 4, 0, 0, 1, []byte{1, 2, 3, 4})...), frame(framePage, 1000, 1, 1, 1, []byte{1, 2, 3})...), true, 1},
		{"CutHeader", append(append([]byte{}, hello...), frame(framePage, 4, 0, 0, 1, []byte{1, 2, 3, 4})[:10]...), true, 0},
		{"AckFromSender", append(append([]byte{}, hello...), frame(frameAck, 0, 1, 0, 0, nil)...), true, 0},
		{"SecondHello", append(append([]byte{}, hello...), hello...), true, 0},
		// Staged pages (cuda-ipc) at a receiver without an importer: the
		// session is refused at its ARENA and no REF reaches the Sink.
		{"ArenaWithoutImporter", join(hello, frame(frameArena, 4, 0, 0, 0, []byte{1, 2, 3, 4}), frame(frameRef, refSize, 0, 0, 1, make([]byte, refSize))), true, 0},
		{"RefBeforeArena", join(hello, frame(frameRef, refSize, 0, 0, 1, make([]byte, refSize))), true, 0},
		{"EmptyArena", join(hello, frame(frameArena, 0, 0, 0, 0, nil)), true, 0},
		{"HugeArenaHandle", join(hello, frame(frameArena, maxHandle+1, 0, 0, 0, make([]byte, maxHandle+1))), true, 0},
		{"ArenaWithFields", join(hello, frame(frameArena, 4, 1, 0, 0, []byte{1, 2, 3, 4})), true, 0},
		{"ShortRef", join(hello, frame(frameRef, 4, 0, 0, 1, []byte{1, 2, 3, 4})), true, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			base := runtime.NumGoroutine()
			sink := &recSink{}
			r, err := Listen("127.0.0.1:0", sink, WithMaxPayload(1<<20))
			if err != nil {
				t.Fatal(err)
			}
			conn, err := net.Dial("tcp", r.Addr())
			if err != nil {
				t.Fatal(err)
			}
			if c.name != "Garbage" { // garbage instead of the handshake
				if _, _, err := (transfer.Plain{}).Open(conn, time.Now().Add(5*time.Second)); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := conn.Write(c.bytes); err != nil {
				t.Fatal(err)
			}
			// Half-close: a cut frame is then a cut frame, not a wait.
			_ = conn.(*net.TCPConn).CloseWrite()
			// The receiver must end the connection by itself.
			_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			// A reset counts: the receiver may close with bytes unread.
			if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("receiver did not close the connection: %v", err)
			}
			_ = conn.Close()
			want := 0
			if c.hello {
				want = 1
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, closed := sink.counts(key); closed >= want || time.Now().After(deadline) {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if err := r.Close(); err != nil {
				t.Error(err)
			}
			writes, closed := sink.counts(key)
			if closed != want || writes != c.writes {
				t.Errorf("Closed %d times, %d writes; want %d, %d", closed, writes, want, c.writes)
			}
			waitGoroutines(t, base)
		})
	}
}

// TestHandshakeTimeout: a connection that never says HELLO is dropped
// rather than pinning a goroutine until the receiver closes.
func TestHandshakeTimeout(t *testing.T) {
	base := runtime.NumGoroutine()
	sink := &recSink{}
	r, err := Listen("127.0.0.1:0", sink, WithHandshakeTimeout(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	conn, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The receiver speaks first (its half of the handshake), then must
	// hang up on a peer that never answers.
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil {
		t.Errorf("read from an idle connection: %v, want EOF from the receiver", err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	sink.mu.Lock()
	if len(sink.closed) != 0 {
		t.Errorf("Closed called for a connection without HELLO: %v", sink.closed)
	}
	sink.mu.Unlock()
	_ = conn.Close()
	waitGoroutines(t, base)
}

// TestLazyPayloadAlloc: a header claiming a large payload costs the
// receiver memory only for the bytes that actually arrive.
func TestLazyPayloadAlloc(t *testing.T) {
	var hdr [hdrSize]byte
	const claim = 60 << 20
	in := append(frame(framePage, claim, 0, 0, 1, nil), make([]byte, 1000)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, buf, err := readFrame(strings.NewReader(string(in)), &hdr, nil, 64<<20)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("cut payload: %v, want io.ErrUnexpectedEOF", err)
	}
	if cap(buf) > growStep {
		t.Errorf("buffer grew to %d bytes for 1000 that arrived", cap(buf))
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 2*growStep {
		t.Errorf("allocated %d bytes for a frame that sent 1000", d)
	}
}

func TestSenderLimits(t *testing.T) {
	base := runtime.NumGoroutine()
	sink := &recSink{}
	r, err := Listen("127.0.0.1:0", sink)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s, err := NewSender(WithMaxPayload(1024)).Open(context.Background(), r.Addr(), transfer.Key{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(transfer.PageWrite{Tokens: 1, Data: make([]byte, 1025)}); err == nil {
		t.Error("Write over the payload limit succeeded")
	}
	if err := s.Write(transfer.PageWrite{Index: -1, Tokens: 1}); err == nil {
		t.Error("Write with a negative index succeeded")
	}
	// The session is still usable: the bad writes never left.
	if err := s.Write(transfer.PageWrite{Tokens: 1, Data: make([]byte, 1024)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s.Bytes() != 1024 {
		t.Errorf("Bytes() = %d, want 1024", s.Bytes())
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	waitGoroutines(t, base)
}

// TestCloseUnconfirmed: a receiver that never finishes the session (here a
// listener that accepts and ignores) must not make Close claim a drain.
func TestCloseUnconfirmed(t *testing.T) {
	base := runtime.NumGoroutine()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			// It answers the handshake, then ignores the session.
			_, _, _ = (transfer.Plain{}).Accept(c, time.Now().Add(5*time.Second))
			accepted <- c
		}
		close(accepted)
	}()
	s, err := NewSender(WithCloseTimeout(100*time.Millisecond)).Open(context.Background(), ln.Addr().String(), transfer.Key{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Write(transfer.PageWrite{Tokens: 1, Data: make([]byte, 100)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = s.Close()
	if err == nil || !strings.Contains(err.Error(), "did not confirm") {
		t.Errorf("Close against a silent receiver: %v, want an unconfirmed-end error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with a 100ms close timeout", d)
	}
	if c := <-accepted; c != nil {
		_ = c.Close()
	}
	_ = ln.Close()
	waitGoroutines(t, base)
}

// TestCloseUnblocksWriter: Close of a session whose writer is stuck on a
// full socket (the receiver's sink is blocked) returns once the receiver
// has processed what reached it, and Write fails afterwards.
func TestCloseUnblocksWriter(t *testing.T) {
	base := runtime.NumGoroutine()
	release := make(chan struct{})
	sink := &blockSink{release: release, entered: make(chan struct{}, 1)}
	r, err := Listen("127.0.0.1:0", sink, WithSocketBuffer(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSender(WithSocketBuffer(64<<10), WithQueueDepth(2)).Open(context.Background(), r.Addr(), transfer.Key{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	page := make([]byte, 1<<20)
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for s.Write(transfer.PageWrite{Tokens: 1, Data: page}) == nil {
		}
	}()
	<-sink.entered
	time.Sleep(50 * time.Millisecond) // let the writer fill the sockets and block
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	<-wrote
	if err := s.Write(transfer.PageWrite{Tokens: 1, Data: page}); !errors.Is(err, transfer.ErrClosed) {
		t.Errorf("Write after Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	waitGoroutines(t, base)
}

// blockSink blocks every Write until release is closed.
type blockSink struct {
	release chan struct{}
	entered chan struct{}
}

func (s *blockSink) Write(transfer.Key, transfer.PageWrite) error {
	select {
	case s.entered <- struct{}{}:
	default:
	}
	<-s.release
	return nil
}

func (s *blockSink) Closed(transfer.Key, string) {}

func (s *blockSink) Admit(transfer.Key) ([]int32, error) { return nil, nil }
