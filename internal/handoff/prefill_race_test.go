package handoff

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// Events that can cross on prefill: an Abort and the answer to Commit,
// posted to the prefill desk in each order while it is held.

const decodeAddr = "decode:1"

type fakeSession struct{}

func (fakeSession) Write(transfer.PageWrite) error { return nil }
func (fakeSession) Flush(context.Context) error    { return nil }
func (fakeSession) Close() error                   { return nil }
func (fakeSession) Bytes() int64                   { return 0 }
func (fakeSession) ID() transfer.SessionID         { return transfer.SessionID{7} }

type fakeSender struct{}

func (fakeSender) Open(context.Context, string, transfer.Key) (transfer.Session, error) {
	return fakeSession{}, nil
}

// fakeDecoders answers Commit when told to (nil), or with the call's
// cancellation when the prefill is aborted first.
type fakeDecoders struct {
	entered chan struct{}
	answer  chan struct{}
	mu      sync.Mutex
	drained int
}

func (f *fakeDecoders) Commit(ctx context.Context, _, _ string, _ Claim) error {
	close(f.entered)
	select {
	case <-f.answer:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeDecoders) Drained(string, string, transfer.Key) error {
	f.mu.Lock()
	f.drained++
	f.mu.Unlock()
	return nil
}

func (f *fakeDecoders) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.drained
}

type prefillFixture struct {
	d      *Prefill
	dec    *fakeDecoders
	ticket Ticket
	prompt []int32
}

func newPrefillFixture(t *testing.T) *prefillFixture {
	e, pool, ms := runningEngine(t, scheduler.RolePrefill)
	f := &prefillFixture{dec: &fakeDecoders{entered: make(chan struct{}), answer: make(chan struct{})},
		prompt: []int32{1, 5, 9, 13, 17, 21, 25, 29, 33, 37}}
	f.d = NewPrefill(PrefillOptions{Engine: e, Pool: pool, Metrics: ms, Sender: fakeSender{}, Decoders: f.dec,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	t.Cleanup(f.d.Close)
	f.d.Learn(decodeAddr)
	f.ticket = Ticket{Key: transfer.Key{Room: 3, Epoch: 1, Cap: transfer.Capability{9}}, DecodeAddr: decodeAddr, TransferAddr: "transfer:1",
		Pages: []int32{1, 2, 3}}
	return f
}

type runResult struct {
	sent Sent
	err  error
}

// start runs the prefill and waits until its Commit is with decode.
func (f *prefillFixture) start(t *testing.T) chan runResult {
	out := make(chan runResult, 1)
	go func() {
		s, err := f.d.Run(context.Background(), "race", f.ticket, f.prompt, request.Params{MaxTokens: 400})
		out <- runResult{s, err}
	}()
	select {
	case <-f.dec.entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the prefill never reached Commit")
	}
	return out
}

// hold holds the desk until the returned func lets it go.
func (f *prefillFixture) hold() func() {
	release := make(chan struct{})
	held := make(chan struct{})
	f.d.post(func() { close(held); <-release })
	<-held
	return func() { close(release) }
}

// queued waits until n events wait in the desk's inbox.
func (f *prefillFixture) queued(t *testing.T, n int) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := f.d.queued()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func result(t *testing.T, ch chan runResult) runResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(20 * time.Second):
		t.Fatal("the prefill never ended")
		return runResult{}
	}
}

// An Abort the desk takes before decode answered the Commit cancels it: the
// prefill ends Drained and decode is told so, once.
func TestPrefillDeskAbortThenCommit(t *testing.T) {
	f := newPrefillFixture(t)
	out := f.start(t)
	release := f.hold()
	aborted := make(chan error, 1)
	go func() { aborted <- f.d.Abort("race", f.ticket.Key, decodeAddr) }()
	f.queued(t, 1)
	release()
	if err := <-aborted; err != nil {
		t.Fatal(err)
	}
	close(f.dec.answer) // decode's answer comes after the desk took the Abort
	r := result(t, out)
	ref, ok := r.err.(*Refusal)
	if !ok || ref.Kind != Refused {
		t.Fatalf("err = %v, want decode's Commit cancelled", r.err)
	}
	if n := f.dec.count(); n != 1 {
		t.Fatalf("Drained told %d times, want 1", n)
	}
	if f.d.Busy() {
		t.Fatal("the desk still has the prefill")
	}
}

// A Commit answered before the desk takes the Abort: the request is Sent
// first, and the Abort finds it handed over (it cancels nothing that is
// still running and tells decode nothing).
func TestPrefillDeskCommitThenAbort(t *testing.T) {
	f := newPrefillFixture(t)
	out := f.start(t)
	release := f.hold()
	close(f.dec.answer)
	f.queued(t, 1) // Sent, posted by the prefill
	aborted := make(chan error, 1)
	go func() { aborted <- f.d.Abort("race", f.ticket.Key, decodeAddr) }()
	f.queued(t, 2)
	release()
	if err := <-aborted; err != nil {
		t.Fatal(err)
	}
	r := result(t, out)
	if r.err != nil || r.sent.TokensWritten != len(f.prompt) {
		t.Fatalf("prefill = %+v, %v; want Sent", r.sent, r.err)
	}
	if n := f.dec.count(); n != 0 {
		t.Fatalf("Drained told %d times for a Sent prefill", n)
	}
	if f.d.Busy() {
		t.Fatal("the desk still has the prefill")
	}
}

// Close while a prefill waits on decode's answer: the prefill is
// cancelled and makes its last moves on the desk (Drained, told once),
// Close returns only after it has, and a prefill after Close is refused
// without running (decode is still told Drained, so its pages come back).
func TestPrefillDeskCloseWaitsForRuns(t *testing.T) {
	f := newPrefillFixture(t)
	out := f.start(t)
	closed := make(chan struct{})
	go func() { f.d.Close(); close(closed) }()
	r := result(t, out)
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close never returned")
	}
	if r.err == nil {
		t.Fatal("a prefill cancelled by Close was Sent")
	}
	if n := f.dec.count(); n != 1 {
		t.Fatalf("Drained told %d times, want 1", n)
	}
	_, err := f.d.Run(context.Background(), "late", f.ticket, f.prompt, request.Params{MaxTokens: 4})
	if ref, ok := err.(*Refusal); !ok || ref.Kind != Stopped {
		t.Fatalf("a prefill after Close: %v, want Stopped", err)
	}
	if n := f.dec.count(); n != 2 {
		t.Fatalf("Drained told %d times after the refused prefill, want 2", n)
	}
}
