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

func reserve(t *testing.T, e *Engine, id string) *Request {
	t.Helper()
	r := NewRoleRequest(RoleDecode, id, loadRef(t).PromptIDs[:6], Params{MaxTokens: 4})
	if err := e.Reserve(r); err != nil {
		t.Fatal(err)
	}
	return r
}

// The decode worker's messages, as the loop answers them: an abort leaves
// the pages quarantined while the writer holds them (Draining) until its
// word; a Drained before Commit ends the hold (Abandoned) and the request
// waits for its abort; a session closed before Commit is Landed and an abort then frees
// by that proof; a Commit ends the writer's hold (Drained, not a reclaim);
// a stopped engine answers ErrStopped.
func TestDecodeMessages(t *testing.T) {
	e, ms, stop := decodeEngine(t)
	pool := e.Pool()

	a := reserve(t, e, "abort")
	if !a.State().WriterHolds() {
		t.Fatalf("reserved request in %s: the writer should hold its pages", a.State())
	}
	if !e.Abort(a, "test") || a.State() != StateDraining {
		t.Fatalf("abort of a reserved request: state %s, want Draining", a.State())
	}
	if st := pool.Stats(); st.Quarantined == 0 {
		t.Fatal("an abort freed pages the writer still holds")
	}
	if e.Abort(a, "again") {
		t.Fatal("a second abort ended the request again")
	}
	if !e.WriterGone(a, true, "") || a.State() != StateAborted {
		t.Fatalf("Drained of a draining request: state %s, want Aborted", a.State())
	}
	if e.WriterGone(a, true, "") {
		t.Fatal("a late Drained was taken for a hold")
	}

	l := reserve(t, e, "landed")
	if err := l.Lifecycle().To(StateReceiving, ""); err != nil {
		t.Fatal(err)
	}
	if !e.WriterGone(l, false, "session closed") || l.State() != StateLanded {
		t.Fatalf("close before Commit: state %s, want Landed", l.State())
	}
	before := pool.Stats()
	if !e.Abort(l, "test") || l.State() != StateAborted {
		t.Fatalf("abort of a landed request: state %s, want Aborted", l.State())
	}
	if st := pool.Stats(); st.Reclaims != before.Reclaims+1 {
		t.Fatalf("abort after the close proof: %d reclaims, want %d", st.Reclaims, before.Reclaims+1)
	}

	g := reserve(t, e, "abandoned")
	if !e.WriterGone(g, true, "") || g.State() != StateAbandoned {
		t.Fatalf("Drained before Commit: state %s, want Abandoned", g.State())
	}
	if err := e.CommitArrived(g); err == nil {
		t.Fatal("a Commit after the writer's Drained was taken")
	}
	if !e.Abort(g, "router gave up") || g.State() != StateAborted {
		t.Fatalf("abort of an abandoned request: state %s, want Aborted", g.State())
	}

	c := reserve(t, e, "commit")
	before = pool.Stats()
	if err := e.CommitArrived(c); err != nil || c.State() != StateVerifying || c.State().WriterHolds() {
		t.Fatalf("commit: %v, state %s", err, c.State())
	}
	if st := pool.Stats(); st.Drains != before.Drains+1 || st.Reclaims != before.Reclaims {
		t.Fatalf("commit: drains %d→%d, reclaims %d→%d; want one drain", before.Drains, st.Drains, before.Reclaims, st.Reclaims)
	}
	if err := e.CommitArrived(c); err == nil {
		t.Fatal("a second Commit moved the request again")
	}
	// The prompt's KV "landed" (zeros), so the read gate lets it decode.
	for i, n := range []int{4, 2} {
		if err := pool.MarkWritten(c.Owner(), c.Pages()[i], n); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Join(c, model.Sampled{TokenLogprob: model.TokenLogprob{ID: 5}}); err != nil {
		t.Fatal(err)
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

	s := reserve(t, e, "stopped")
	stop()
	if e.Abort(s, "after stop") {
		t.Fatal("a stopped engine ended a request")
	}
	if err := e.CommitArrived(s); !errors.Is(err, ErrStopped) {
		t.Fatalf("Commit to a stopped engine: %v, want ErrStopped", err)
	}
}
