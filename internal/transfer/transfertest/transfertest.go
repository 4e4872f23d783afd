// Package transfertest is the conformance suite every transport runs:
// the same checks for tcp and ucx, against a fake decode side that keeps
// a real paged KV buffer and a table of live reservations.
package transfertest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// Aborter is implemented by sessions that can end the way a crashed sender
// process would: the connection dropped, no end-of-session handshake. Run
// uses it, when a transport's sessions have it, to check that the
// receiver still reports such a session Closed exactly once.
type Aborter interface {
	Abort() error
}

// MaxInFlight bounds, in the backpressure check, the payload bytes that
// Write may have accepted beyond what the Sink has been handed: queues,
// socket buffers and the like together. A transport that buffers without
// bound fails it.
const MaxInFlight = 48 << 20

// Run checks a transport. mk starts a receiver that passes every write to
// sink, and a sender that can reach it; Run closes the receiver itself
// (once), then the sender if it has a Close() error method. The sink also
// has a method KV() kernels.PagedKV, the buffer pages land in, for
// transports that register the decode side's memory.
//
// Checks: pages land byte-exactly for several page sizes and partial last
// pages; Flush returns only after every earlier write reached the sink,
// and honours its context; writes the sink refuses come back from Flush
// as transfer.ErrRefused, carrying the sink's reason, and write nothing;
// Closed comes exactly once per session after Close, Abort (see Aborter)
// and Receiver.Close, and no Write follows it; concurrent sessions do not
// mix pages; a slow sink makes Write block instead of buffering without
// bound (MaxInFlight); and every goroutine started is gone afterwards.
// The subtests run one at a time so that goroutine counts mean something.
//
// A one-sided receiver (transfer.OneSided) never calls Sink.Write, so the
// checks that count the sink's writes are replaced by checks on the
// memory: pages land bit-exactly by the time Flush returns (the KV is
// poisoned again between rounds, so a second round must land anew), a
// refused write leaves its page poisoned, nothing changes in the memory
// after Close returns, and Closed comes at most once for an aborted
// session (only a proof may bring it). The backpressure check, which needs
// a slow Sink.Write, is skipped.
func Run(t *testing.T, mk func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender)) {
	RunWith(t, Options{}, mk)
}

// Options adapt Run to a transport.
type Options struct {
	// Alloc, if set, provides the decode side's KV memory (floats
	// float32s) instead of a Go slice: for transports that need memory
	// they allocated themselves. The harness poisons it with NaN.
	Alloc func(t *testing.T, floats int) []float32
	// Device, if set, puts both sides' KV in device memory (cuda-ipc): it
	// returns the decode side's pool and a prefill side's pool of the
	// same layout to stage from, pages pages each. The sink then has a
	// method Source() kernels.PagedKV giving the latter. Each write the
	// suite makes is first put into a page of the source pool and staged
	// by the session (transfer.StagePages, as the prefill shipper does)
	// where it can: the decode side copies it out of device memory
	// through transfer.Land. Writes no staging can express (a payload that
	// does not match its token count) go as they are.
	Device func(t *testing.T, layout kernels.PagedKV, pages int) (dst, src kernels.PagedKV)
	// Unstaged, with Device, says the transport stages nothing itself:
	// it puts the pages it is given into the decode pool's device memory
	// (ucx with the pool registered), so no write is expected staged.
	Unstaged bool
}

// RunWith is Run with options.
func RunWith(t *testing.T, o Options, mkf func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender)) {
	mk := suite{mk: mkf, alloc: o.Alloc, device: o.Device, unstaged: o.Unstaged}
	t.Run("PagesLandExactly", func(t *testing.T) { testExact(t, mk) })
	t.Run("FlushWaitsForWrites", func(t *testing.T) { testFlushWaits(t, mk) })
	t.Run("RefusedWrites", func(t *testing.T) { testRefused(t, mk) })
	t.Run("ClosedOnce", func(t *testing.T) { testClosed(t, mk) })
	t.Run("ConcurrentSessions", func(t *testing.T) { testConcurrent(t, mk) })
	t.Run("ReceiverClose", func(t *testing.T) { testReceiverClose(t, mk) })
	t.Run("Backpressure", func(t *testing.T) { testBackpressure(t, mk) })
}

type mkFunc = func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender)

// suite is what every check gets: how to make the transport, and how to
// allocate the decode side's memory.
type suite struct {
	mk     mkFunc
	alloc  func(t *testing.T, floats int) []float32
	device func(t *testing.T, layout kernels.PagedKV, pages int) (dst, src kernels.PagedKV)
	// unstaged: Options.Unstaged
	unstaged bool
}

// waitLong bounds anything that should be quick, so that a hang fails the
// test with a message instead of running into the go test timeout.
const waitLong = 20 * time.Second

type harness struct {
	t    *testing.T
	sink *sink
	recv transfer.Receiver
	send transfer.Sender
	// oneSided: the receiver never calls Sink.Write (transfer.OneSided).
	oneSided bool
	// src is the prefill side's KV: random values, so that a page that
	// lands in the wrong place or half-written shows up.
	src kernels.PagedKV

	mu       sync.Mutex
	rng      *rand.Rand
	free     []int32
	nextRoom uint64
	// want mirrors what the sink's KV must hold: NaN everywhere except
	// where writes that should land were unpacked.
	want       []float32
	recvClosed bool

	// staged: the pools are in device memory and writes are staged from
	// the source pool (Options.Device); stageMu orders the stagings,
	// which share one source page, and stagedPages counts them.
	staged      bool
	stageMu     sync.Mutex
	stagedPages int
}

type harnessOpt func(*sink)

func withDelay(d time.Duration) harnessOpt { return func(s *sink) { s.delay = d } }
func countOnly() harnessOpt                { return func(s *sink) { s.unpack = false } }

func newHarness(t *testing.T, mk suite, layout kernels.PagedKV, pages int, opts ...harnessOpt) *harness {
	t.Helper()
	base := runtime.NumGoroutine()
	kv := layout
	var stageFrom kernels.PagedKV
	switch {
	case mk.device != nil:
		kv, stageFrom = mk.device(t, layout, pages)
	case mk.alloc != nil:
		kv.Data = mk.alloc(t, pages*kv.PageFloats())
	default:
		kv.Data = make([]float32, pages*kv.PageFloats())
	}
	sk := newSink(kv)
	sk.src = stageFrom
	for _, o := range opts {
		o(sk)
	}
	rng := rand.New(rand.NewPCG(uint64(pages), uint64(layout.PageSize)))
	src := layout
	src.Data = make([]float32, (pages+1)*src.PageFloats())
	for i := range src.Data {
		src.Data[i] = float32(rng.NormFloat64())
	}
	h := &harness{
		t:        t,
		sink:     sk,
		src:      src,
		rng:      rng,
		nextRoom: 1,
		want:     sk.snapshot(),
		staged:   mk.device != nil,
	}
	h.free = make([]int32, pages)
	for i := range h.free {
		h.free[i] = int32(i)
	}
	rng.Shuffle(len(h.free), func(i, j int) { h.free[i], h.free[j] = h.free[j], h.free[i] })
	h.recv, h.send = mk.mk(t, sk)
	h.oneSided = transfer.IsOneSided(h.recv)
	t.Cleanup(func() {
		h.closeReceiver()
		if c, ok := h.send.(io.Closer); ok {
			if err := within(t, "Sender.Close", c.Close); err != nil {
				t.Errorf("Sender.Close: %v", err)
			}
		}
		for _, v := range sk.takeViolations() {
			t.Error(v)
		}
		checkGoroutines(t, base)
	})
	return h
}

func (h *harness) closeReceiver() {
	if h.recvClosed {
		return
	}
	h.recvClosed = true
	if err := within(h.t, "Receiver.Close", h.recv.Close); err != nil {
		h.t.Errorf("Receiver.Close: %v", err)
	}
}

// reserve takes n free decode pages (in random order, so index and page
// id never coincide by accident) and makes them a live reservation.
func (h *harness) reserve(n int) (transfer.Key, []int32) {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if n > len(h.free) {
		h.t.Fatalf("harness: %d pages wanted, %d free", n, len(h.free))
	}
	pages := append([]int32(nil), h.free[:n]...)
	h.free = h.free[n:]
	k := h.key()
	h.sink.reserve(k, pages)
	return k, pages
}

func (h *harness) key() transfer.Key {
	k := transfer.Key{Room: h.nextRoom, Epoch: 1000 + h.rng.Uint64N(1000), Cap: transfer.NewCapability()}
	h.nextRoom++
	return k
}

// page is one write and what the suite knows about it before handing it
// over (the session owns Data afterwards).
type page struct {
	w   transfer.PageWrite
	sum uint64
}

// pages builds the writes of a tokens-long prompt into pages: full pages
// then a partial last one, each packed from a different source page.
func (h *harness) pages(pages []int32, tokens int) []page {
	h.mu.Lock()
	defer h.mu.Unlock()
	ps := h.src.PageSize
	srcPages := len(h.src.Data) / h.src.PageFloats()
	var out []page
	for i, p := range pages {
		n := min(ps, tokens-i*ps)
		if n <= 0 {
			break
		}
		data := kernels.PackPage(h.src, int32(h.rng.IntN(srcPages)), n, nil)
		out = append(out, page{
			w:   transfer.PageWrite{Index: i, Page: p, Tokens: n, Data: data},
			sum: transfer.Checksum(data),
		})
	}
	return out
}

// expect records that w must land.
func (h *harness) expect(w transfer.PageWrite) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kv := h.sink.kv
	kv.Data, kv.Device = h.want, nil
	if err := transfer.Unpack(kv, w.Page, w.Tokens, w.Data); err != nil {
		h.t.Errorf("harness: expected write does not unpack: %v", err)
	}
}

func (h *harness) open(k transfer.Key) transfer.Session {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	s, err := h.send.Open(ctx, h.recv.Addr(), k)
	if err != nil {
		h.t.Fatalf("Open %v: %v", k, err)
	}
	if h.staged {
		return &stagingSession{Session: s, h: h}
	}
	return s
}

// stagingSession stages each write from the harness's source pool before
// passing it on (Options.Device).
type stagingSession struct {
	transfer.Session
	h *harness
}

func (s *stagingSession) Write(w transfer.PageWrite) error {
	src := s.h.sink.src
	if w.Tokens < 1 || w.Tokens > src.PageSize || len(w.Data) != transfer.PackedSize(src, w.Tokens) {
		return s.Session.Write(w)
	}
	s.h.stageMu.Lock()
	if err := transfer.Unpack(src, 0, w.Tokens, w.Data); err != nil {
		s.h.stageMu.Unlock()
		return fmt.Errorf("harness: putting the page into the source pool: %w", err)
	}
	staged, err := transfer.StagePages(s.Session, src, []int32{0}, []int{w.Tokens})
	if err == nil && staged.Srcs != nil {
		s.h.stagedPages++
	}
	s.h.stageMu.Unlock()
	if err != nil {
		return err
	}
	sums, err := staged.Wait()
	if err != nil {
		return err
	}
	if staged.Srcs == nil {
		return s.Session.Write(w)
	}
	if sums[0] != kernels.PageSum(w.Data) {
		return errors.New("harness: the staged page's sum is not PageSum of its rows")
	}
	w.Src = staged.Srcs[0]
	return s.Session.Write(w)
}

// Abort passes an Aborter's abort on.
func (s *stagingSession) Abort() error {
	if a, ok := s.Session.(Aborter); ok {
		return a.Abort()
	}
	return s.Session.Close()
}

// checkKV compares the sink's whole buffer with what should be there, bit
// for bit: landed pages exact, every other slot still poison.
func (h *harness) checkKV() {
	h.t.Helper()
	got := h.sink.snapshot()
	h.mu.Lock()
	defer h.mu.Unlock()
	pf := h.sink.kv.PageFloats()
	bad := 0
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(h.want[i]) {
			if bad < 5 {
				h.t.Errorf("KV page %d float %d: got %v, want %v", i/pf, i%pf, got[i], h.want[i])
			}
			bad++
		}
	}
	if bad > 0 {
		h.t.Errorf("KV: %d floats differ", bad)
	}
}

// checkSums recomputes each page's checksum from the decode side's copy,
// as decode does when it verifies a Commit.
func (h *harness) checkSums(pp []page) {
	h.t.Helper()
	got := h.sink.KV()
	got.Data, got.Device = h.sink.snapshot(), nil
	for _, p := range pp {
		if sum := transfer.Checksum(kernels.PackPage(got, p.w.Page, p.w.Tokens, nil)); sum != p.sum {
			h.t.Errorf("page %d (index %d, %d tokens): checksum %#x, sent %#x", p.w.Page, p.w.Index, p.w.Tokens, sum, p.sum)
		}
	}
}

// waitClosed waits for k's Closed calls to reach want, then checks that
// no more come.
func (h *harness) waitClosed(k transfer.Key, want int) {
	h.t.Helper()
	deadline := time.Now().Add(waitLong)
	for len(h.sink.closedOf(k)) < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if got := h.sink.closedOf(k); len(got) != want {
		h.t.Errorf("%v: Closed called %d times, want %d (proofs %q)", k, len(got), want, got)
	}
}

// waitClosedAtMost gives Closed calls for k time to come, then checks there
// are at most max, each with a proof.
func (h *harness) waitClosedAtMost(k transfer.Key, max int) {
	h.t.Helper()
	time.Sleep(100 * time.Millisecond)
	if got := h.sink.closedOf(k); len(got) > max {
		h.t.Errorf("%v: Closed called %d times, want at most %d (proofs %q)", k, len(got), max, got)
	}
}

func flush(t *testing.T, s transfer.Session) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	return s.Flush(ctx)
}

// within runs f and fails the test if it does not return in time.
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(waitLong):
		t.Fatalf("%s did not return within %v", what, waitLong)
		return nil
	}
}

func checkGoroutines(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	n := runtime.NumGoroutine()
	for n > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	if n > base {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		t.Errorf("goroutine leak: %d running, %d before\n%s", n, base, buf)
	}
}

func smallLayout(ps int) kernels.PagedKV {
	return kernels.PagedKV{PageSize: ps, Layers: 2, KVHeads: 2, HeadDim: 8}
}

// testExact runs every KV dtype: a half-width pool's rows are half the
// bytes at half the offsets (an fp8 pool's a quarter), which a transport
// that addresses pages itself (one-sided puts) must get right.
func testExact(t *testing.T, mk suite) {
	for _, c := range []struct {
		ps int
		dt kernels.DType
	}{{1, kernels.F32}, {4, kernels.F32}, {16, kernels.F32}, {1, kernels.F16}, {4, kernels.F16}, {16, kernels.BF16}, {4, kernels.F8E4M3}} {
		ps := c.ps
		t.Run(fmt.Sprintf("page%d/%s", ps, c.dt), func(t *testing.T) {
			layout := smallLayout(ps)
			layout.DType = c.dt
			h := newHarness(t, mk, layout, 64)
			for _, tokens := range []int{1, ps, 2*ps + 1, 5*ps - 1} {
				if tokens < 1 {
					continue
				}
				k, pages := h.reserve((tokens + ps - 1) / ps)
				pp := h.pages(pages, tokens)
				s := h.open(k)
				// Out of order: a transport must not care in which order a
				// reservation's pages come.
				order := h.rng.Perm(len(pp))
				var total int64
				for _, i := range order {
					h.expect(pp[i].w)
					total += int64(len(pp[i].w.Data))
					if err := s.Write(pp[i].w); err != nil {
						t.Fatalf("%d tokens: Write: %v", tokens, err)
					}
				}
				if err := flush(t, s); err != nil {
					t.Fatalf("%d tokens: Flush: %v", tokens, err)
				}
				if got := s.Bytes(); got != total {
					t.Errorf("%d tokens: Bytes() = %d, want %d", tokens, got, total)
				}
				if n, _ := h.sink.acceptedOf(k); h.oneSided && n != 0 {
					t.Errorf("%d tokens: a one-sided receiver passed %d writes to Sink.Write", tokens, n)
				} else if n != len(pp) && !h.oneSided {
					t.Errorf("%d tokens: sink accepted %d writes, want %d", tokens, n, len(pp))
				}
				h.checkKV()
				h.checkSums(pp)
				if err := within(t, "Session.Close", s.Close); err != nil {
					t.Errorf("%d tokens: Close: %v", tokens, err)
				}
				h.waitClosed(k, 1)
			}
			if h.staged && !mk.unstaged && h.stagedPages == 0 {
				t.Error("no page was staged: every write went through the socket")
			}
		})
	}
}

func testFlushWaits(t *testing.T, mk suite) {
	h := newHarness(t, mk, smallLayout(4), 32, withDelay(2*time.Millisecond))
	k, pages := h.reserve(12)
	pp := h.pages(pages, 12*4)
	s := h.open(k)
	defer s.Close()
	for round := 1; round <= 2; round++ {
		if round == 2 && h.oneSided {
			// Nothing is in flight after round 1's Flush: poison the
			// pages again, so that only round 2's puts can restore them.
			h.sink.poison()
		}
		var total int64
		for _, p := range pp {
			h.expect(p.w)
			total += int64(len(p.w.Data))
			// A fresh copy: the session owns what it was given.
			w := p.w
			w.Data = append([]byte(nil), w.Data...)
			if err := s.Write(w); err != nil {
				t.Fatalf("Write: %v", err)
			}
		}
		if round == 2 && !h.oneSided {
			// Twelve writes at 2ms each cannot all be in before 1ms.
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			err := s.Flush(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Flush with an expiring context: %v, want context.DeadlineExceeded", err)
			}
		}
		if err := flush(t, s); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		// No waiting here: Flush returning is the claim under test.
		if h.oneSided {
			h.checkKV()
		} else if n, b := h.sink.acceptedOf(k); n != round*len(pp) || b != int64(round)*total {
			t.Errorf("round %d: after Flush the sink has %d writes (%d bytes), want %d (%d)", round, n, b, round*len(pp), int64(round)*total)
		}
		if got := s.Bytes(); got != int64(round)*total {
			t.Errorf("round %d: Bytes() = %d, want %d", round, got, int64(round)*total)
		}
	}
	h.checkKV()
	h.checkSums(pp)
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	h.waitClosed(k, 1)
}

func testRefused(t *testing.T, mk suite) {
	const ps = 4
	cases := []struct {
		name string
		// bad returns the key to open and the writes: good ones (landing)
		// first, then the one the sink must refuse.
		bad    func(h *harness) (k transfer.Key, good []page, bad transfer.PageWrite)
		reason string
	}{
		{"UnknownKey", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			// The pages are live, but under another key.
			_, pages := h.reserve(1)
			return h.key(), nil, h.pages(pages, ps)[0].w
		}, "no live reservation"},
		{"WrongCapability", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			// Room and epoch are guessable; the capability is not, and the
			// transport must carry it to the sink unchanged.
			k, pages := h.reserve(1)
			k.Cap[0] ^= 1
			return k, nil, h.pages(pages, ps)[0].w
		}, "no live reservation"},
		{"StaleEpoch", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			k, pages := h.reserve(1)
			k.Epoch++
			return k, nil, h.pages(pages, ps)[0].w
		}, "no live reservation"},
		{"WrongPage", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			k, pages := h.reserve(2)
			pp := h.pages(pages, 2*ps)
			bad := pp[0].w
			bad.Page = pages[1]
			return k, pp[1:], bad
		}, "is not index 0"},
		{"IndexOutside", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			k, pages := h.reserve(1)
			_, other := h.reserve(1)
			pp := h.pages(pages, ps)
			bad := h.pages(other, ps)[0].w
			bad.Index = 1
			return k, pp, bad
		}, "outside"},
		{"ShortPayload", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			k, pages := h.reserve(2)
			pp := h.pages(pages, 2*ps)
			bad := pp[1].w
			bad.Data = bad.Data[:len(bad.Data)-4]
			return k, pp[:1], bad
		}, "payload"},
		{"TooManyTokens", func(h *harness) (transfer.Key, []page, transfer.PageWrite) {
			k, pages := h.reserve(1)
			bad := h.pages(pages, ps)[0].w
			bad.Tokens = ps + 1
			bad.Data = append(bad.Data, make([]byte, transfer.PackedSize(h.sink.kv, ps+1)-len(bad.Data))...)
			return k, nil, bad
		}, "tokens for a page of"},
	}
	h := newHarness(t, mk, smallLayout(ps), 32)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			k, good, bad := c.bad(h)
			s := h.open(k)
			var landed int64
			for _, p := range good {
				h.expect(p.w)
				landed += int64(len(p.w.Data))
				if err := s.Write(p.w); err != nil {
					t.Fatalf("Write (good): %v", err)
				}
			}
			if err := s.Write(bad); err != nil {
				t.Fatalf("Write (bad) failed before reaching the receiver: %v", err)
			}
			for i := 1; i <= 2; i++ {
				// The second Flush covers the same writes, so it reports
				// the same refusal.
				err := flush(t, s)
				if !errors.Is(err, transfer.ErrRefused) {
					t.Fatalf("Flush %d: %v, want transfer.ErrRefused", i, err)
				}
				if !strings.Contains(err.Error(), c.reason) {
					t.Errorf("Flush %d: %q does not carry the sink's reason %q", i, err, c.reason)
				}
			}
			if n, _ := h.sink.acceptedOf(k); n != len(good) && !h.oneSided {
				t.Errorf("sink accepted %d writes, want %d", n, len(good))
			}
			if got := s.Bytes(); got != landed {
				t.Errorf("Bytes() = %d, want %d (refused bytes do not count)", got, landed)
			}
			h.checkKV()
			if err := within(t, "Session.Close", s.Close); err != nil {
				t.Errorf("Close: %v", err)
			}
			h.waitClosed(k, 1)
		})
	}
}

func testClosed(t *testing.T, mk suite) {
	const ps = 4
	h := newHarness(t, mk, smallLayout(ps), 64)
	closedErr := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, transfer.ErrClosed) {
			t.Errorf("%s after Close: %v, want transfer.ErrClosed", what, err)
		}
	}

	t.Run("AfterClose", func(t *testing.T) {
		k, pages := h.reserve(3)
		pp := h.pages(pages, 3*ps-1)
		s := h.open(k)
		for _, p := range pp {
			h.expect(p.w)
			if err := s.Write(p.w); err != nil {
				t.Fatalf("Write: %v", err)
			}
		}
		if err := flush(t, s); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		if err := within(t, "Session.Close", s.Close); err != nil {
			t.Errorf("Close: %v", err)
		}
		h.waitClosed(k, 1)
		closedErr("Write", s.Write(h.pages(pages, ps)[0].w))
		closedErr("Flush", flush(t, s))
		_ = within(t, "second Session.Close", s.Close)
		h.waitClosed(k, 1)
		h.checkKV()
	})

	t.Run("CloseWithoutFlush", func(t *testing.T) {
		// Whatever of these lands must be exact, but Close may drop
		// queued writes, so the KV is not compared; the sink's checks
		// and the Closed count are.
		k, pages := h.reserve(4)
		s := h.open(k)
		if err := flush(t, s); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		for _, p := range h.pages(pages, 4*ps) {
			if err := s.Write(p.w); err != nil {
				t.Fatalf("Write: %v", err)
			}
		}
		if err := within(t, "Session.Close", s.Close); err != nil {
			t.Errorf("Close: %v", err)
		}
		n, _ := h.sink.acceptedOf(k)
		before := h.sink.snapshot()
		time.Sleep(20 * time.Millisecond)
		if m, _ := h.sink.acceptedOf(k); m != n {
			t.Errorf("%d writes landed after Close returned", m-n)
		}
		if h.oneSided {
			after := h.sink.snapshot()
			for i := range after {
				if math.Float32bits(after[i]) != math.Float32bits(before[i]) {
					t.Errorf("KV float %d changed after Close returned: a put landed late", i)
					break
				}
			}
		}
		h.waitClosed(k, 1)
	})

	t.Run("EmptySession", func(t *testing.T) {
		k, _ := h.reserve(1)
		s := h.open(k)
		if err := within(t, "Session.Close", s.Close); err != nil {
			t.Errorf("Close: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
		if n := len(h.sink.closedOf(k)); n > 1 {
			t.Errorf("Closed called %d times for a session that wrote nothing", n)
		}
	})

	for _, midStream := range []bool{false, true} {
		t.Run(fmt.Sprintf("Abort/midStream=%v", midStream), func(t *testing.T) {
			k, pages := h.reserve(4)
			s := h.open(k)
			a, ok := s.(Aborter)
			if !ok {
				_ = s.Close()
				t.Skipf("%T has no Abort", s)
			}
			pp := h.pages(pages, 4*ps)
			// The flush makes sure the receiver knows the session before
			// it is killed.
			h.expect(pp[0].w)
			if err := s.Write(pp[0].w); err != nil {
				t.Fatalf("Write: %v", err)
			}
			if err := flush(t, s); err != nil {
				t.Fatalf("Flush: %v", err)
			}
			if midStream {
				for _, p := range pp[1:] {
					if err := s.Write(p.w); err != nil {
						t.Fatalf("Write: %v", err)
					}
				}
			}
			_ = within(t, "Session.Abort", a.Abort)
			if h.oneSided {
				// The sender's puts may outlive it: a one-sided receiver
				// calls Closed only with a proof that they cannot land.
				h.waitClosedAtMost(k, 1)
			} else {
				h.waitClosed(k, 1)
			}
			closedErr("Write", s.Write(pp[0].w))
			_ = within(t, "Session.Close after Abort", s.Close)
			if h.oneSided {
				h.waitClosedAtMost(k, 1)
			} else {
				h.waitClosed(k, 1)
			}
		})
	}
}

func testConcurrent(t *testing.T, mk suite) {
	const (
		ps       = 4
		sessions = 16
		perSess  = 5
		tokens   = perSess*ps - 2
	)
	h := newHarness(t, mk, smallLayout(ps), sessions*perSess)
	type job struct {
		k  transfer.Key
		pp []page
	}
	jobs := make([]job, sessions)
	for i := range jobs {
		k, pages := h.reserve(perSess)
		jobs[i] = job{k, h.pages(pages, tokens)}
		for _, p := range jobs[i].pp {
			h.expect(p.w)
		}
	}
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), waitLong)
			defer cancel()
			s, err := h.send.Open(ctx, h.recv.Addr(), j.k)
			if err != nil {
				t.Errorf("%v: Open: %v", j.k, err)
				return
			}
			defer func() {
				if err := s.Close(); err != nil {
					t.Errorf("%v: Close: %v", j.k, err)
				}
			}()
			var total int64
			for _, p := range j.pp {
				total += int64(len(p.w.Data))
				if err := s.Write(p.w); err != nil {
					t.Errorf("%v: Write: %v", j.k, err)
					return
				}
				runtime.Gosched()
			}
			if err := s.Flush(ctx); err != nil {
				t.Errorf("%v: Flush: %v", j.k, err)
			}
			if s.Bytes() != total {
				t.Errorf("%v: Bytes() = %d, want %d", j.k, s.Bytes(), total)
			}
		}()
	}
	wg.Wait()
	h.checkKV()
	for _, j := range jobs {
		h.checkSums(j.pp)
		if n, _ := h.sink.acceptedOf(j.k); n != len(j.pp) && !h.oneSided {
			t.Errorf("%v: sink accepted %d writes, want %d", j.k, n, len(j.pp))
		}
		h.waitClosed(j.k, 1)
	}
}

func testReceiverClose(t *testing.T, mk suite) {
	const ps = 4
	h := newHarness(t, mk, smallLayout(ps), 32)
	var (
		keys []transfer.Key
		ss   []transfer.Session
	)
	for range 4 {
		k, pages := h.reserve(2)
		s := h.open(k)
		for _, p := range h.pages(pages, 2*ps) {
			h.expect(p.w)
			if err := s.Write(p.w); err != nil {
				t.Fatalf("Write: %v", err)
			}
		}
		if err := flush(t, s); err != nil {
			t.Fatalf("Flush: %v", err)
		}
		keys = append(keys, k)
		ss = append(ss, s)
	}
	h.closeReceiver()
	// Close joined every session, Closed calls included.
	for _, k := range keys {
		if n := len(h.sink.closedOf(k)); n != 1 {
			t.Errorf("%v: Closed called %d times by the time Receiver.Close returned, want 1", k, n)
		}
	}
	for i, s := range ss {
		if err := flush(t, s); err == nil {
			t.Errorf("%v: Flush after Receiver.Close succeeded", keys[i])
		}
		_ = within(t, "Session.Close", s.Close)
		h.waitClosed(keys[i], 1)
	}
	h.checkKV()

	ctx, cancel := context.WithTimeout(context.Background(), waitLong)
	defer cancel()
	if s, err := h.send.Open(ctx, h.recv.Addr(), h.key()); err == nil {
		// Some transports only learn at the first Flush that nobody is
		// listening.
		if err := s.Flush(ctx); err == nil {
			t.Errorf("Open and Flush to a closed receiver succeeded")
		}
		_ = s.Close()
	}
}

func testBackpressure(t *testing.T, mk suite) {
	const writes = 96
	// 1 MiB pages: 16 layers x 2 x 16 tokens x 512 floats x 4 bytes.
	layout := kernels.PagedKV{PageSize: 16, Layers: 16, KVHeads: 8, HeadDim: 64}
	h := newHarness(t, mk, layout, 2, withDelay(2*time.Millisecond), countOnly())
	if h.oneSided {
		t.Skip("one-sided: the Sink sees no write to be slow in")
	}
	k, pages := h.reserve(1)
	w := h.pages(pages, layout.PageSize)[0].w
	if len(w.Data) != 1<<20 {
		t.Fatalf("page of %d bytes, want 1 MiB", len(w.Data))
	}
	s := h.open(k)
	defer s.Close()
	var returned, peak int64
	for range writes {
		// Every write shares one buffer: transports only read Data, and
		// this keeps the test's own memory flat.
		if err := s.Write(w); err != nil {
			t.Fatalf("Write: %v", err)
		}
		returned += int64(len(w.Data))
		peak = max(peak, returned-h.sink.entered.Load())
	}
	if err := flush(t, s); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	t.Logf("peak in flight: %.1f MiB of %d MiB written", float64(peak)/(1<<20), writes)
	if peak > MaxInFlight {
		t.Errorf("Write ran %.1f MiB ahead of a slow sink, limit %d MiB: not backpressure", float64(peak)/(1<<20), MaxInFlight>>20)
	}
	if n, _ := h.sink.acceptedOf(k); n != writes {
		t.Errorf("sink accepted %d writes, want %d", n, writes)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	h.waitClosed(k, 1)
}
