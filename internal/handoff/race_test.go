package handoff

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// Events that can cross on decode, posted to the desk in each order while
// it is held, so the order is the one the test chose and not the
// scheduler's. Each asserts the pages' fate: quarantined while the writer
// may still write, every page back once it has let go, no release refused
// (a second release of a page is refused and counted).

const pageSize = 4

// fixture is a decode desk over a running decode engine of the bundled
// model, with one reservation whose prompt pages all landed.
type fixture struct {
	t       *testing.T
	d       *Decode
	pool    *kvpool.Pool
	res     Reservation
	session transfer.Key
	sums    []uint64
	prompt  []int32
	writers *fakeWriters
}

type fakeWriters struct {
	mu     sync.Mutex
	aborts int
}

func (w *fakeWriters) Abort(string, transfer.Key, string, string) error {
	w.mu.Lock()
	w.aborts++
	w.mu.Unlock()
	return nil
}

const writer = "prefill:1"

// runningEngine is an engine of role on the bundled model, its loop
// running until the test ends, with a poisoned pool of 256 pages.
func runningEngine(t *testing.T, role scheduler.Role) (*scheduler.Engine, *kvpool.Pool, *metrics.Set) {
	t.Helper()
	l, err := model.Load(model.LoadOptions{}, cpu.New(1))
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 256, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	ms := metrics.New(role.String())
	e := scheduler.NewEngine(l.Model, pool, scheduler.Config{Role: role, ContextLength: c.ContextLength, ChunkSize: 512, MaxRunning: 8,
		IsEOG: func(int32) bool { return false }}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, pool, ms
}

func newFixture(t *testing.T) *fixture { return newFixtureWith(t, context.Background(), nil) }

// newFixtureWith is newFixture with its reservation made under ctx and
// the desk's options changed by opt (nil: none).
func newFixtureWith(t *testing.T, rctx context.Context, opt func(*DecodeOptions)) *fixture {
	e, pool, ms := runningEngine(t, scheduler.RoleDecode)
	f := &fixture{t: t, pool: pool, writers: &fakeWriters{}, prompt: []int32{1, 5, 9, 13, 17, 21, 25, 29, 33, 37}}
	o := DecodeOptions{Engine: e, Pool: pool, Metrics: ms, MaxSeq: 512, HandoffTimeout: time.Hour, Writers: f.writers,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if opt != nil {
		opt(&o)
	}
	f.d = NewDecode(o)
	t.Cleanup(f.d.Close)
	var err error
	f.res, err = f.d.Reserve(rctx, "router", "race", writer, f.prompt, request.Params{MaxTokens: 400})
	if err != nil {
		t.Fatal(err)
	}
	f.session = f.res.Key
	f.session.Session = transfer.SessionID{7}
	if _, err := f.d.Admit(f.session); err != nil {
		t.Fatal(err)
	}
	for i, pg := range f.res.Pages {
		tokens := min(pageSize, len(f.prompt)-i*pageSize)
		data := make([]byte, transfer.PackedSize(pool.KV(), tokens))
		if err := f.d.Write(f.session, transfer.PageWrite{Index: i, Page: pg, Tokens: tokens, Data: data}); err != nil {
			t.Fatal(err)
		}
		f.sums = append(f.sums, transfer.Checksum(data))
	}
	return f
}

func (f *fixture) commit() Commit {
	k := f.res.Key
	return Commit{Room: k.Room, Epoch: k.Epoch, Capability: k.Cap[:], SessionID: f.session.Session[:], Writer: writer,
		TokensWritten: len(f.prompt), PageChecksums: f.sums, FirstToken: &request.Sampled{TokenLogprob: request.TokenLogprob{ID: 5}}}
}

func (f *fixture) request() *scheduler.Request {
	r, _, ok := f.d.Lookup(f.res.Key.Room, f.res.Key.Epoch)
	if !ok {
		f.t.Fatal("reservation not found")
	}
	return r
}

func (f *fixture) reservation() *reservation {
	res, _ := call(&f.d.inbox, func(answer func(*reservation)) { answer(f.d.rooms[roomKey(f.res.Key.Room, f.res.Key.Epoch)]) })
	return res
}

// inOrder holds the desk, posts each event, and lets the desk go: it takes
// them in exactly this order.
func (f *fixture) inOrder(events ...func()) {
	release := make(chan struct{})
	held := make(chan struct{})
	f.d.post(func() { close(held); <-release })
	<-held
	for _, ev := range events {
		f.d.post(ev)
	}
	close(release)
}

// answered posts an event that answers and gives the channel its answer comes on.
func answered[T any](ev func(answer func(T))) (func(), chan T) {
	ch := make(chan T, 1)
	return func() { ev(func(v T) { ch <- v }) }, ch
}

func wait[T any](t *testing.T, ch chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal("no answer from the desk")
	}
	panic("unreachable")
}

// drainEvents reads the request's events to its last.
func drainEvents(t *testing.T, r *scheduler.Request) scheduler.Event {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		ev, ok := r.Next(ctx)
		if !ok {
			t.Fatal("the request never ended")
		}
		if ev.Finish != "" {
			return ev
		}
	}
}

// settled waits until every page is back and checks none was released twice.
func (f *fixture) settled() {
	f.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := f.pool.Stats()
		if st.Free == st.Total {
			break
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("pages never came back: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := f.pool.Stats(); st.ReleaseErrors != 0 {
		f.t.Fatalf("%d releases refused (a page released twice, or by the wrong owner): %+v", st.ReleaseErrors, st)
	}
}

// quarantined requires the prompt pages to wait for their writer.
func (f *fixture) quarantined(when string) {
	f.t.Helper()
	if st := f.pool.Stats(); st.Quarantined != len(f.res.Pages) || st.Free == st.Total {
		f.t.Fatalf("%s: %d pages quarantined, want the %d prompt pages while the writer may write; %+v", when, st.Quarantined, len(f.res.Pages), st)
	}
}

func (f *fixture) abortEvent() (func(), chan bool) {
	k := f.res.Key
	return answered(f.d.abortEvent(k.Room, k.Epoch, k.Cap[:], "client left"))
}

func (f *fixture) drainedEvent() (func(), chan struct{}) {
	k := f.res.Key
	return answered(f.d.drainedEvent(k.Room, k.Epoch, k.Cap[:], writer))
}

// Abort, then Commit: the request is Draining when the Commit comes, so
// the Commit is refused and the pages wait for the writer's Drained.
func TestDeskAbortThenCommit(t *testing.T) {
	f := newFixture(t)
	r := f.request()
	abort, aborted := f.abortEvent()
	commit, committed := answered(f.d.commitEvent(context.Background(), f.commit()))
	f.inOrder(abort, commit)
	if !wait(t, aborted) {
		t.Fatal("the abort did not end the request")
	}
	if err := wait(t, committed); err == nil {
		t.Fatal("a Commit after the abort was accepted")
	}
	if st := r.State(); st != scheduler.StateDraining {
		t.Fatalf("after abort and Commit: %s, want Draining", st)
	}
	f.quarantined("after abort and Commit")
	drained, done := f.drainedEvent()
	f.inOrder(drained)
	wait(t, done)
	f.settled()
}

// Commit, then abort: the request joins the batch, and the abort ends it
// there; the writer let go at its Commit.
func TestDeskCommitThenAbort(t *testing.T) {
	f := newFixture(t)
	r := f.request()
	commit, committed := answered(f.d.commitEvent(context.Background(), f.commit()))
	abort, aborted := f.abortEvent()
	f.inOrder(commit, abort)
	if err := wait(t, committed); err != nil {
		t.Fatalf("Commit before the abort: %v", err)
	}
	if !wait(t, aborted) {
		t.Fatal("the abort after Commit did not end the request")
	}
	if ev := drainEvents(t, r); ev.Finish != scheduler.FinishAbort {
		t.Fatalf("last event %+v, want an abort", ev)
	}
	f.settled()
}

// The session's Closed, then Commit; and Commit, then Closed: either way
// the request joins the batch, runs to its end, and every page comes back
// once.
func TestDeskClosedAndCommit(t *testing.T) {
	for _, closedFirst := range []bool{true, false} {
		f := newFixture(t)
		r := f.request()
		closed := f.d.closedEvent(f.session, "connection closed and joined")
		commit, committed := answered(f.d.commitEvent(context.Background(), f.commit()))
		if closedFirst {
			f.inOrder(closed, commit)
		} else {
			f.inOrder(commit, closed)
		}
		if err := wait(t, committed); err != nil {
			t.Fatalf("closed first %v: Commit: %v", closedFirst, err)
		}
		if ev := drainEvents(t, r); ev.Finish != scheduler.FinishLength {
			t.Fatalf("closed first %v: last event %+v, want length", closedFirst, ev)
		}
		f.settled()
	}
}

// The handoff timer, then Drained: the request is Draining, its pages
// quarantined, until the writer's Drained frees them. Drained, then the
// timer: the writer let go first (Abandoned), and the timer's abort frees
// the pages at once.
func TestDeskTimerAndDrained(t *testing.T) {
	for _, timerFirst := range []bool{true, false} {
		f := newFixture(t)
		r := f.request()
		res := f.reservation()
		timer := func() { f.d.on(res, func() { f.d.timeout(res) }) }
		drained, done := f.drainedEvent()
		if timerFirst {
			f.inOrder(timer)
			waitState(t, r, scheduler.StateDraining)
			f.quarantined("after the timer")
			f.inOrder(drained)
			wait(t, done)
		} else {
			f.inOrder(drained, timer)
			wait(t, done)
		}
		waitState(t, r, scheduler.StateAborted)
		f.settled()
	}
}

func waitState(t *testing.T, r *scheduler.Request, want scheduler.State) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); r.State() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("request is %s, want %s", r.State(), want)
		}
		time.Sleep(time.Millisecond)
	}
}
