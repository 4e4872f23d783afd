//go:build ucx

package ucx

import (
	"context"
	"errors"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// recSink records Closed calls and admits keys of a fixed page list.
type recSink struct {
	mu     sync.Mutex
	pages  []int32
	closed map[transfer.Key][]string
	writes int
}

func (s *recSink) Write(transfer.Key, transfer.PageWrite) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	return nil
}

func (s *recSink) Admit(k transfer.Key) ([]int32, error) {
	if k.Room == 666 {
		return nil, errRefusedForTest
	}
	return s.pages, nil
}

type testErr string

func (e testErr) Error() string { return string(e) }

const errRefusedForTest = testErr("no live reservation (test)")

func (s *recSink) Closed(k transfer.Key, proof string) {
	k = k.Reservation()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed == nil {
		s.closed = map[transfer.Key][]string{}
	}
	s.closed[k] = append(s.closed[k], proof)
}

func (s *recSink) closedOf(k transfer.Key) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.closed[k])
}

var small = kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8}

func smallKV(pages int) kernels.PagedKV {
	kv := small
	kv.Data = make([]float32, pages*kv.PageFloats())
	return kv
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

func TestTransports(t *testing.T) {
	rs, err := Transports()
	if err != nil {
		t.Fatal(err)
	}
	var sel []string
	for _, r := range rs {
		if r.Selected {
			sel = append(sel, r.String())
		}
	}
	t.Logf("%d resources, selected %v", len(rs), sel)
	t.Log(Describe(rs))
	if len(sel) == 0 {
		t.Fatal("no transport selected")
	}
	rs, err = Transports(WithTLS("tcp"), WithNetDevices("lo"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Selected != (r.String() == "tcp/lo") {
			t.Errorf("UCX_TLS=tcp UCX_NET_DEVICES=lo: %s selected=%v", r, r.Selected)
		}
		if r.Transport == "tcp" && r.Type != "net" {
			t.Errorf("%s has type %q, want net", r, r.Type)
		}
	}
	if _, err := os.Stat("/sys/class/infiniband"); err != nil && !strings.Contains(Describe(rs), "RDMA: none") {
		t.Errorf("no RDMA hardware, but Describe says %q", Describe(rs))
	}
}

func TestRDMADevicesUnknown(t *testing.T) {
	_, err := NewSender(WithRDMADevices("no_such_hca_0"))
	if err == nil || !strings.Contains(err.Error(), "no_such_hca_0") {
		t.Errorf("NewSender with an unknown RDMA device: %v", err)
	}
	_, err = Listen("127.0.0.1:0", &recSink{}, smallKV(1), WithRDMADevices("no_such_hca_0"))
	if err == nil {
		t.Error("Listen with an unknown RDMA device succeeded")
	}
}

// TestOneSidedWithoutReceiverProgress shows which puts are one-sided for
// real: with the receiver's progress goroutine stopped, puts into memory
// UCX allocated on shared memory still land and flush, while puts into Go
// memory (emulated with active messages on shm, carried by the receiver on
// listenAndSend starts a receiver over kv (with ropts) and a sender,
// both closed with t (the sender first; closing again is harmless).
func listenAndSend(t *testing.T, sink transfer.Sink, kv kernels.PagedKV, ropts ...Option) (*Receiver, *Sender) {
	t.Helper()
	r, err := Listen("127.0.0.1:0", sink, kv, ropts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	s, err := NewSender()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return r, s
}

// inUCXMemory moves kv's pages into memory UCX allocated (freed with tb)
// when mem is "allockv", and returns opts with the option that exposes it.
func inUCXMemory(tb testing.TB, kv *kernels.PagedKV, mem string, opts ...Option) []Option {
	tb.Helper()
	if mem != "allockv" {
		return opts
	}
	reg, err := AllocKV(len(kv.Data), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { reg.Free() })
	kv.Data = reg.Floats()
	return append(opts, WithMemory(reg))
}

// tcp) wait for the receiver.
func TestOneSidedWithoutReceiverProgress(t *testing.T) {
	for _, mem := range []string{"go", "allockv"} {
		t.Run(mem, func(t *testing.T) {
			kv := smallKV(4)
			opts := inUCXMemory(t, &kv, mem)
			r, err := Listen("127.0.0.1:0", &recSink{pages: []int32{0, 1, 2, 3}}, kv, opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			shm := false
			for _, tr := range r.Transports() {
				shm = shm || strings.HasPrefix(tr, "posix/") || strings.HasPrefix(tr, "sysv/")
			}
			oneSided := mem == "allockv" && shm
			s, err := NewSender()
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ctx := context.Background()
			ss, err := s.Open(ctx, r.Addr(), transfer.Key{Room: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer ss.Close()
			// Connect (wire up the endpoint) while the receiver runs.
			src := smallKV(1)
			for i := range src.Data {
				src.Data[i] = float32(i)
			}
			page := kernels.PackPage(src, 0, 4, nil)
			if err := ss.Write(transfer.PageWrite{Index: 0, Page: 0, Tokens: 4, Data: page}); err != nil {
				t.Fatal(err)
			}
			if err := ss.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			t.Logf("receiver %v, endpoint:\n%s", r.Transports(), ss.(*Session).describe())
			// Stop the receiver's progress, and wait until it has stopped:
			// a put that its progress loop was already handling when the
			// blocker was queued would land and pass for a one-sided one.
			unblock, stopped := make(chan struct{}), make(chan struct{})
			if err := r.eng.submit(func() { close(stopped); <-unblock }); err != nil {
				t.Fatal(err)
			}
			<-stopped
			if err := ss.Write(transfer.PageWrite{Index: 1, Page: 1, Tokens: 4, Data: page}); err != nil {
				t.Fatal(err)
			}
			fctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			err = ss.Flush(fctx)
			cancel()
			landed := slices.Equal(kv.Data[kv.PageFloats():2*kv.PageFloats()], src.Data)
			close(unblock)
			if oneSided {
				if err != nil || !landed {
					t.Errorf("shared memory from AllocKV: Flush %v, landed %v with the receiver stopped; want a one-sided put", err, landed)
				}
			} else if err == nil {
				t.Errorf("Flush completed with the receiver stopped (landed %v): these puts were expected to need the receiver's progress", landed)
			}
			if err := ss.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(kv.Data[kv.PageFloats():2*kv.PageFloats()], src.Data) {
				t.Error("page not landed after the receiver resumed")
			}
		})
	}
}

// TestEndpointShared: sessions to one receiver share an endpoint and key,
// and a closed sender leaves nothing running.
// TestRefusedSession: a reservation the receiver refuses opens, puts
// nothing, and every Flush reports the receiver's reason.
func TestRefusedSession(t *testing.T) {
	kv := smallKV(1)
	for i := range kv.Data {
		kv.Data[i] = -1
	}
	sink := &recSink{pages: []int32{0}}
	r, s := listenAndSend(t, sink, kv)
	ctx := context.Background()
	k := transfer.Key{Room: 666, Epoch: 1}
	ss, err := s.Open(ctx, r.Addr(), k)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := ss.Flush(ctx); !errors.Is(err, transfer.ErrRefused) || !strings.Contains(err.Error(), string(errRefusedForTest)) {
			t.Errorf("Flush %d of a refused session: %v", i, err)
		}
		page := make([]byte, transfer.PackedSize(small, 4))
		if err := ss.Write(transfer.PageWrite{Index: 0, Page: 0, Tokens: 4, Data: page}); err != nil {
			t.Errorf("Write: %v", err)
		}
	}
	if err := ss.Close(); err != nil {
		t.Error(err)
	}
	if kv.Data[0] != -1 {
		t.Error("a refused session wrote")
	}
	if n := len(sink.closedOf(k)); n != 1 {
		t.Errorf("Closed %d times for a refused session, want 1", n)
	}
}

func TestEndpointShared(t *testing.T) {
	base := runtime.NumGoroutine()
	r, err := Listen("127.0.0.1:0", &recSink{pages: []int32{0}}, smallKV(2))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSender()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, err := s.Open(ctx, r.Addr(), transfer.Key{Room: 1})
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Open(ctx, r.Addr(), transfer.Key{Room: 2})
	if err != nil {
		t.Fatal(err)
	}
	if a.(*Session).peer != b.(*Session).peer {
		t.Error("two sessions to one receiver made two endpoints")
	}
	_ = a.Close()
	_ = b.Close()
	c, err := s.Open(ctx, r.Addr(), transfer.Key{Room: 3})
	if err != nil {
		t.Fatal(err)
	}
	if c.(*Session).peer != a.(*Session).peer {
		t.Error("an idle endpoint was not reused")
	}
	_ = c.Close()
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	waitGoroutines(t, base)
}

// TestControlEdges speaks the control protocol by hand: garbage and a
// HELLO that is never followed by END give no Closed (no proof); a refused
// HELLO gives Closed once whatever follows; a session that ignores
// CLOSING is dropped by Receiver.Close after the close timeout, without
// Closed.
func TestControlEdges(t *testing.T) {
	base := runtime.NumGoroutine()
	sink := &recSink{pages: []int32{0}}
	r, err := Listen("127.0.0.1:0", sink, smallKV(1), WithCloseTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := (transfer.Plain{}).Open(c, time.Now().Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		return c
	}
	expectReply := func(c net.Conn, want byte) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		typ, _, err := readMsg(c)
		if err != nil || typ != want {
			t.Fatalf("reply: type %d, %v; want %d", typ, err, want)
		}
	}
	// Garbage instead of the handshake: dropped, no session.
	c, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Write([]byte("GET / HTTP/1.1\r\n\r\n"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := readMsg(c); err == nil {
		t.Error("garbage got an answer")
	}
	_ = c.Close()
	// Admitted, then the connection drops without END: no proof.
	kAbrupt := transfer.Key{Room: 1, Epoch: 1}
	c = dial()
	_, _ = c.Write(hello{Room: kAbrupt.Room, Epoch: kAbrupt.Epoch}.marshal())
	expectReply(c, msgWelcome)
	_ = c.Close()
	// Refused, then dropped: the proof is that it never got the key.
	kRefused := transfer.Key{Room: 666, Epoch: 1}
	c = dial()
	_, _ = c.Write(hello{Room: kRefused.Room, Epoch: kRefused.Epoch}.marshal())
	expectReply(c, msgRefuse)
	_ = c.Close()
	// Admitted, END: Closed, then the receiver closes.
	kEnd := transfer.Key{Room: 2, Epoch: 1}
	c = dial()
	_, _ = c.Write(hello{Room: kEnd.Room, Epoch: kEnd.Epoch}.marshal())
	expectReply(c, msgWelcome)
	_, _ = c.Write(frame(msgEnd, nil))
	if _, _, err := readMsg(c); err == nil {
		t.Error("the receiver answered END instead of closing")
	}
	if n := len(sink.closedOf(kEnd)); n != 1 {
		t.Errorf("END: Closed %d times by the time the receiver closed the connection, want 1", n)
	}
	_ = c.Close()
	// Admitted and deaf to CLOSING.
	kDeaf := transfer.Key{Room: 3, Epoch: 1}
	deaf := dial()
	_, _ = deaf.Write(hello{Room: kDeaf.Room, Epoch: kDeaf.Epoch}.marshal())
	expectReply(deaf, msgWelcome)

	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Error(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Receiver.Close took %v with a 200ms close timeout", d)
	}
	expectReply(deaf, msgClosing)
	_ = deaf.Close()
	for k, want := range map[transfer.Key]int{kAbrupt: 0, kRefused: 1, kEnd: 1, kDeaf: 0} {
		if got := sink.closedOf(k); len(got) != want {
			t.Errorf("%v: Closed %d times (%q), want %d", k, len(got), got, want)
		}
	}
	if sink.writes != 0 {
		t.Errorf("Sink.Write called %d times on a one-sided transport", sink.writes)
	}
	waitGoroutines(t, base)
}

// TestCloseFlushes: Close returns, and the receiver hears END (Closed),
// only after the session's puts are remotely complete. With the receiver's
// progress stopped, puts into Go memory cannot complete (on shm they are
// active messages the receiver applies; on tcp the receiver reads them),
// so Close must wait for it.
func TestCloseFlushes(t *testing.T) {
	kv := smallKV(2)
	sink := &recSink{pages: []int32{0, 1}}
	r, s := listenAndSend(t, sink, kv)
	ctx := context.Background()
	k := transfer.Key{Room: 5, Epoch: 9}
	ss, err := s.Open(ctx, r.Addr(), k)
	if err != nil {
		t.Fatal(err)
	}
	src := smallKV(1)
	for i := range src.Data {
		src.Data[i] = float32(i + 1)
	}
	page := kernels.PackPage(src, 0, 4, nil)
	// Wire up while the receiver runs.
	if err := ss.Write(transfer.PageWrite{Index: 0, Page: 0, Tokens: 4, Data: page}); err != nil {
		t.Fatal(err)
	}
	if err := ss.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Stop the receiver's progress, and wait until it has stopped: work its
	// loop was still doing when the blocker was queued could otherwise
	// complete the session's close before the loop blocks.
	unblock, stopped := make(chan struct{}), make(chan struct{})
	if err := r.eng.submit(func() { close(stopped); <-unblock }); err != nil {
		t.Fatal(err)
	}
	<-stopped
	if err := ss.Write(transfer.PageWrite{Index: 1, Page: 1, Tokens: 4, Data: page}); err != nil {
		close(unblock)
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- ss.Close() }()
	select {
	case err := <-closed:
		close(unblock)
		t.Fatalf("Close returned (%v) while its put could not complete", err)
	case <-time.After(300 * time.Millisecond):
	}
	if n := len(sink.closedOf(k)); n != 0 {
		t.Errorf("Closed called before the session's puts completed")
	}
	close(unblock)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return after the receiver resumed")
	}
	if !slices.Equal(kv.Data[kv.PageFloats():], src.Data) {
		t.Error("the page did not land by the time Close returned")
	}
	if n := len(sink.closedOf(k)); n != 1 {
		t.Errorf("Closed %d times after Close returned, want 1", n)
	}
}
