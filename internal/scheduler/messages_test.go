package scheduler

import (
	"context"
	"errors"
	"testing"

	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
)

// decodeEngine runs a decode engine until the test ends or stop is called.
func decodeEngine(t *testing.T) (e *Engine, ms *metrics.Set, stop func()) {
	t.Helper()
	l, err := model.Load(model.LoadOptions{}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 32, PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim})
	if err != nil {
		t.Fatal(err)
	}
	ms = metrics.New("decode")
	e = NewEngine(l.Model, pool, Config{Role: RoleDecode, ContextLength: c.ContextLength, ChunkSize: 64, MaxRunning: 4}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return e, ms, stop
}

func reserve(t *testing.T, e *Engine, id string) *Handover {
	t.Helper()
	r := NewRoleRequest(RoleDecode, id, loadRef(t).PromptIDs[:6], Params{MaxTokens: 4})
	h, err := e.Reserve(r)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// A handed-over decode request's moves, as its Handover makes them: an
// abort leaves the pages quarantined while the writer holds them
// (Draining) until its word; a Drained before Commit ends the hold
// (Abandoned) and the request waits for its abort; a session closed
// before Commit is Sealed and an abort then frees by that proof; a Commit
// ends the writer's hold (Drained, not a reclaim); the loop does not end
// a request it has not been given, and one enqueued unverified is
// refused; a stopped engine answers ErrStopped.
func TestHandover(t *testing.T) {
	e, ms, stop := decodeEngine(t)
	pool := e.Pool()

	ha := reserve(t, e, "abort")
	a := ha.Request()
	if !a.State().WriterHolds() {
		t.Fatalf("reserved request in %s: the writer should hold its pages", a.State())
	}
	if e.Abort(a, "test") || a.State() != StateReserved {
		t.Fatalf("the loop ended a request it was never given: state %s", a.State())
	}
	if !ha.End("test", nil) || a.State() != StateDraining {
		t.Fatalf("abort of a reserved request: state %s, want Draining", a.State())
	}
	if st := pool.Stats(); st.Quarantined == 0 {
		t.Fatal("an abort freed pages the writer still holds")
	}
	if ha.End("again", nil) {
		t.Fatal("a second abort ended the request again")
	}
	if !ha.WriterGone(true, "") || a.State() != StateAborted {
		t.Fatalf("Drained of a draining request: state %s, want Aborted", a.State())
	}
	if ha.WriterGone(true, "") {
		t.Fatal("a late Drained was taken for a hold")
	}

	hl := reserve(t, e, "landed")
	l := hl.Request()
	if err := l.Lifecycle().To(StateReceiving, ""); err != nil {
		t.Fatal(err)
	}
	if !hl.WriterGone(false, "session closed") || l.State() != StateSealed {
		t.Fatalf("close before Commit: state %s, want Sealed", l.State())
	}
	before := pool.Stats()
	if !hl.End("test", nil) || l.State() != StateAborted {
		t.Fatalf("abort of a landed request: state %s, want Aborted", l.State())
	}
	if st := pool.Stats(); st.Reclaims != before.Reclaims+1 {
		t.Fatalf("abort after the close proof: %d reclaims, want %d", st.Reclaims, before.Reclaims+1)
	}

	hg := reserve(t, e, "abandoned")
	g := hg.Request()
	if !hg.WriterGone(true, "") || g.State() != StateAbandoned {
		t.Fatalf("Drained before Commit: state %s, want Abandoned", g.State())
	}
	if err := hg.CommitArrived(); err == nil {
		t.Fatal("a Commit after the writer's Drained was taken")
	}
	if !hg.End("router gave up", nil) || g.State() != StateAborted {
		t.Fatalf("abort of an abandoned request: state %s, want Aborted", g.State())
	}

	hc := reserve(t, e, "commit")
	c := hc.Request()
	if err := e.Enqueue(c); err == nil {
		t.Fatal("the engine took a request whose Commit had not come")
	}
	before = pool.Stats()
	if err := hc.CommitArrived(); err != nil || c.State() != StateVerifying || c.State().WriterHolds() {
		t.Fatalf("commit: %v, state %s", err, c.State())
	}
	if st := pool.Stats(); st.WritersDone != before.WritersDone+1 || st.Reclaims != before.Reclaims {
		t.Fatalf("commit: writers done %d→%d, reclaims %d→%d; want one writer done", before.WritersDone, st.WritersDone, before.Reclaims, st.Reclaims)
	}
	if err := hc.CommitArrived(); err == nil {
		t.Fatal("a second Commit moved the request again")
	}
	if err := e.Enqueue(c); err == nil || c.State() != StateVerifying {
		t.Fatalf("the engine took a request not yet verified: %v, state %s", err, c.State())
	}
	// The prompt's KV "landed" (zeros), so the read gate lets it decode.
	for i, n := range []int{4, 2} {
		if err := pool.MarkWritten(c.Owner(), c.Pages()[i], n); err != nil {
			t.Fatal(err)
		}
	}
	if err := hc.Verified(model.Sampled{TokenLogprob: model.TokenLogprob{ID: 5}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Enqueue(c); err != nil {
		t.Fatal(err)
	}
	if hc.End("too late", nil) {
		t.Fatal("a Handover ended a request the engine had taken")
	}
	for {
		ev, ok := c.Next(context.Background())
		if !ok || ev.Finish != "" {
			break
		}
	}
	if c.State() != StateFinished {
		t.Fatalf("committed request ended %s, want Finished", c.State())
	}
	if n := testutilValue(t, ms, "baton_lifecycle_illegal_moves_total"); n != 0 {
		t.Fatalf("%v illegal moves", n)
	}

	hs := reserve(t, e, "stopped")
	if err := hs.CommitArrived(); err != nil {
		t.Fatal(err)
	}
	if err := hs.Verified(model.Sampled{}); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := e.Enqueue(hs.Request()); !errors.Is(err, ErrStopped) {
		t.Fatalf("Enqueue to a stopped engine: %v, want ErrStopped", err)
	}
	if !hs.End("engine stopped", nil) || hs.Request().State() != StateAborted {
		t.Fatalf("a verified request the engine did not take: state %s, want Aborted", hs.Request().State())
	}
}
