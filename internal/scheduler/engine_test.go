package scheduler

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	testref "github.com/batonlm/baton/test/reference"
)

type reference = testref.Greedy

func loadRef(t *testing.T) reference { return testref.Load(t) }

// storiesPool loads the bundled stories260K model on the reference
// backend and makes a poisoned pool of pages pages of pageSize tokens for
// it.
func storiesPool(t *testing.T, pageSize, pages int) (*model.Model, *kvpool.Pool) {
	t.Helper()
	return storiesPoolOn(t, ref.New(), pageSize, pages)
}

// storiesPoolOn is storiesPool on backend be.
func storiesPoolOn(t *testing.T, be kernels.Backend, pageSize, pages int) (*model.Model, *kvpool.Pool) {
	t.Helper()
	l, err := model.Load(model.LoadOptions{}, be)
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: pages, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	return l.Model, pool
}

func newEngine(t *testing.T, pageSize, pages, chunk int) (*Engine, context.CancelFunc) {
	t.Helper()
	lm, pool := storiesPool(t, pageSize, pages)
	c := lm.Config
	e := NewEngine(lm, pool, Config{ContextLength: c.ContextLength, ChunkSize: chunk, MaxRunning: 16, IsEOG: func(id int32) bool { return id == 2 }}, metrics.New("standalone"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, cancel
}

func collect(t *testing.T, r *Request) ([]model.Sampled, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var toks []model.Sampled
	for {
		ev, ok := r.Next(ctx)
		if !ok {
			t.Fatal("timed out waiting for events")
		}
		if ev.Token != nil {
			toks = append(toks, *ev.Token)
		}
		if ev.Finish != "" {
			if ev.Err != nil {
				t.Fatalf("request failed: %v", ev.Err)
			}
			return toks, ev.Finish
		}
	}
}

// The greedy reference must come out token for token, with logprobs within
// 1e-3, whatever the batching: 8 concurrent requests, 2-token prefill chunks,
// page sizes 1, 16 and 64. Every page must be back in the pool afterwards.
func TestEngineGreedyReferenceUnderBatching(t *testing.T) {
	for _, tc := range []struct{ page, pages, chunk int }{{16, 300, 512}, {1, 4096, 2}, {64, 80, 2}} {
		e, _ := newEngine(t, tc.page, tc.pages, tc.chunk)
		runReference(t, e, 8, fmt.Sprintf("page %d chunk %d", tc.page, tc.chunk))
		waitFree(t, e)
	}
}

// runReference runs n copies of the greedy reference request at once on e
// and checks each one's tokens and top-5 logprobs (within 1e-3) and that it
// ended Finished.
func runReference(t *testing.T, e *Engine, n int, what string) {
	t.Helper()
	want := loadRef(t)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := NewRequest("r", want.PromptIDs, Params{MaxTokens: len(want.GeneratedIDs), Sampling: model.Sampling{TopLogprobs: 5}})
			if err := e.Enqueue(r); err != nil {
				t.Error(err)
				return
			}
			toks, fin := collect(t, r)
			if fin != FinishLength || len(toks) != len(want.GeneratedIDs) {
				t.Errorf("%s: finish %q after %d tokens", what, fin, len(toks))
				return
			}
			for j, tk := range toks {
				if tk.ID != want.GeneratedIDs[j] {
					t.Errorf("%s: token %d = %d, want %d", what, j, tk.ID, want.GeneratedIDs[j])
					return
				}
				for k, w := range want.Top5[j] {
					if tk.Top[k].ID != w.ID || math.Abs(float64(tk.Top[k].Logprob)-w.Logprob) > 1e-3 {
						t.Errorf("%s: position %d alt %d: %+v, want %+v", what, j, k, tk.Top[k], w)
						return
					}
				}
			}
			if r.State() != StateFinished {
				t.Errorf("%s: state %s, want Finished", what, r.State())
			}
		}()
	}
	wg.Wait()
}

func waitFree(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.Pool().Free() != e.Pool().NumPages() {
		if time.Now().After(deadline) {
			t.Fatalf("pages leaked: %d of %d free; stats %+v", e.Pool().Free(), e.Pool().NumPages(), e.Pool().Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := e.Pool().Stats(); st.ReleaseErrors != 0 {
		t.Fatalf("release errors: %+v", st)
	}
}

func TestEngineRejectsAtTheDoorAllocatingNothing(t *testing.T) {
	e, _ := newEngine(t, 16, 8, 64) // 128 tokens of pool, context 512
	for _, tc := range []struct {
		prompt []int32
		max    int
	}{
		{nil, 4},
		{make([]int32, 512), 0},
		{[]int32{1, 2, 3}, 510},
		{[]int32{1, 9999}, 4},
	} {
		r := NewRequest("x", tc.prompt, Params{MaxTokens: tc.max})
		err := e.Enqueue(r)
		rej, ok := err.(*RejectError)
		if !ok || rej.Status != 400 {
			t.Fatalf("prompt %d max %d: got %v, want a 400 reject", len(tc.prompt), tc.max, err)
		}
		if r.State() != StateRejected {
			t.Fatalf("state %s, want Rejected", r.State())
		}
	}
	if st := e.Pool().Stats(); st.Allocations != 0 {
		t.Fatalf("a rejected request allocated: %+v", st)
	}
}

// A request that fits only later waits in the queue instead of failing.
func TestEngineQueuesWhatFitsLater(t *testing.T) {
	want := loadRef(t)
	e, _ := newEngine(t, 16, 4, 64) // room for exactly one 64-token sequence
	var reqs []*Request
	for i := 0; i < 3; i++ {
		r := NewRequest("q", want.PromptIDs, Params{MaxTokens: 40})
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	for _, r := range reqs {
		toks, _ := collect(t, r)
		for j := range toks {
			if toks[j].ID != want.GeneratedIDs[j] {
				t.Fatalf("token %d differs", j)
			}
		}
	}
	waitFree(t, e)
}

func TestEngineCancelFreesPages(t *testing.T) {
	want := loadRef(t)
	e, _ := newEngine(t, 16, 64, 64)
	r := NewRequest("c", want.PromptIDs, Params{})
	if err := e.Enqueue(r); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ev, ok := r.Next(ctx); !ok || ev.Token == nil {
		t.Fatal("no first token")
	}
	r.Cancel()
	for {
		ev, ok := r.Next(ctx)
		if !ok {
			t.Fatal("no finish after cancel")
		}
		if ev.Finish != "" {
			if ev.Finish != FinishAbort {
				t.Fatalf("finish %q, want abort", ev.Finish)
			}
			break
		}
	}
	if r.State() != StateAborted {
		t.Fatalf("state %s", r.State())
	}
	waitFree(t, e)
}

// With one batch slot and preemption after 1 ms, requests take turns: each
// is preempted and re-admitted, keeping its pages and KV, and still produces
// the reference token for token.
func TestEnginePreemptedRequestsResumeExactly(t *testing.T) {
	want := loadRef(t)
	lm, pool := storiesPool(t, 16, 64)
	c := lm.Config
	ms := metrics.New("standalone")
	e := NewEngine(lm, pool, Config{ContextLength: c.ContextLength, ChunkSize: 64, MaxRunning: 1, PreemptAfter: time.Millisecond,
		IsEOG: func(id int32) bool { return id == 2 }}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	var reqs []*Request
	for i := 0; i < 3; i++ {
		r := NewRequest("p", want.PromptIDs, Params{MaxTokens: 40})
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
		reqs = append(reqs, r)
	}
	for _, r := range reqs {
		toks, fin := collect(t, r)
		if fin != FinishLength || len(toks) != 40 {
			t.Fatalf("finish %q after %d tokens", fin, len(toks))
		}
		for j := range toks {
			if toks[j].ID != want.GeneratedIDs[j] {
				t.Fatalf("token %d = %d, want %d", j, toks[j].ID, want.GeneratedIDs[j])
			}
		}
	}
	if n := testutilValue(t, ms, "baton_preemptions_total"); n == 0 {
		t.Fatal("nothing was preempted")
	}
	waitFree(t, e)
}

func testutilValue(t *testing.T, ms *metrics.Set, name string) float64 {
	mfs, err := ms.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// manualEngine is an engine whose loop the test drives step by step, so it
// can change the pool between steps without racing the loop.
func manualEngine(t *testing.T) (*Engine, *metrics.Set) { return manualEngineOn(t, ref.New()) }

// manualEngineOn is manualEngine with the bundled model on be.
func manualEngineOn(t *testing.T, be kernels.Backend) (*Engine, *metrics.Set) {
	t.Helper()
	l, err := model.Load(model.LoadOptions{}, be)
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 16, PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim})
	if err != nil {
		t.Fatal(err)
	}
	ms := metrics.New("standalone")
	return NewEngine(l.Model, pool, Config{ContextLength: c.ContextLength, ChunkSize: 64, MaxRunning: 4}, ms), ms
}

// startManual submits the reference prompt and runs the step that prefills
// it and samples the first token.
func startManual(t *testing.T, e *Engine) *Request {
	t.Helper()
	r := NewRequest("m", loadRef(t).PromptIDs, Params{MaxTokens: 8})
	if err := e.Enqueue(r); err != nil {
		t.Fatal(err)
	}
	e.takeInbox()
	e.admit()
	e.step()
	if ev, ok := r.Next(context.Background()); !ok || ev.Token == nil {
		t.Fatalf("no first token: %+v", ev)
	}
	return r
}

func lastEvent(t *testing.T, r *Request) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ev, ok := r.Next(ctx)
	if !ok {
		t.Fatal("no event")
	}
	return ev
}

// The read gate refuses a batch entry whose pages are no longer the
// request's own (here freed behind the engine's back, as a bookkeeping bug
// elsewhere would): the request fails and the refusal is counted, instead of
// attention reading pages someone else may hold.
func TestReadGateRefusesPagesNotOwned(t *testing.T) {
	e, ms := manualEngine(t)
	r := startManual(t, e)
	if err := e.pool.Release(r.owner, r.pages); err != nil {
		t.Fatal(err)
	}
	e.step()
	ev := lastEvent(t, r)
	if ev.Finish != FinishError || ev.Err == nil || !strings.Contains(ev.Err.Error(), "read gate") {
		t.Fatalf("event %+v, want a read-gate failure", ev)
	}
	if n := testutilValue(t, ms, "baton_kv_read_gate_failures_total"); n != 1 {
		t.Fatalf("read gate failures %v, want 1", n)
	}
}

// Logits with NaN (KV that was never written, under --kv-poison) are never
// sampled: the request fails and the event is counted.
func TestNaNLogitsAreNeverSampled(t *testing.T) {
	e, ms := manualEngine(t)
	r := startManual(t, e)
	kv := e.pool.KV()
	kv.Data[kv.KOffset(int(r.pages[0]), 0, 0)] = float32(math.NaN())
	e.step()
	ev := lastEvent(t, r)
	if ev.Token != nil || ev.Finish != FinishError || !strings.Contains(ev.Err.Error(), "NaN logits") {
		t.Fatalf("event %+v, want a NaN-logits failure and no token", ev)
	}
	if n := testutilValue(t, ms, "baton_nan_logits_total"); n != 1 {
		t.Fatalf("NaN logits counted %v times, want 1", n)
	}
}

// A full queue is overload, not an outage: 429 with Retry-After, which
// OpenAI's SDKs retry by default, and nothing allocated.
func TestQueueFullIs429(t *testing.T) {
	l, err := model.Load(model.LoadOptions{}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 8, PageSize: 16, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim})
	if err != nil {
		t.Fatal(err)
	}
	// The loop is not started, so the first request stays queued.
	e := NewEngine(l.Model, pool, Config{ContextLength: c.ContextLength, ChunkSize: 64, MaxRunning: 1, MaxQueue: 1}, metrics.New("standalone"))
	if err := e.Enqueue(NewRequest("a", []int32{1, 2, 3}, Params{MaxTokens: 2})); err != nil {
		t.Fatal(err)
	}
	r := NewRequest("b", []int32{1, 2, 3}, Params{MaxTokens: 2})
	err = e.Enqueue(r)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Status != 429 || rej.Reason != "queue_full" || rej.RetryAfter < 1 {
		t.Fatalf("got %v (%+v), want a 429 queue_full with Retry-After", err, rej)
	}
	if r.State() != StateRejected {
		t.Fatalf("state %s", r.State())
	}
}

// The NaN gate finds a NaN wherever it sits in a row (the vector loops
// have a tail), and only a NaN: infinities are not poison.
func TestHasNaN(t *testing.T) {
	for _, n := range []int{1, 7, 8, 9, 31, 32000} {
		row := make([]float32, n)
		for i := range row {
			row[i] = float32(i%13) - 6
		}
		row[n/2] = float32(math.Inf(1))
		row[0] = float32(math.Inf(-1))
		if hasNaN(row) {
			t.Fatalf("n %d: NaN reported in a row without one", n)
		}
		for _, at := range []int{0, n / 2, n - 1} {
			old := row[at]
			row[at] = float32(math.NaN())
			if !hasNaN(row) {
				t.Fatalf("n %d: NaN at %d not found", n, at)
			}
			row[at] = old
		}
	}
	if hasNaN(nil) {
		t.Fatal("an empty row has no NaN")
	}
}

// A step's draws run on the backend's threads, each with its own scratch
// (sampleDraws): a seeded request samples the same tokens, with the same
// logprobs, alone and in a batch of twelve others drawing at once.
func TestSeededDrawsAreTheSameInABatch(t *testing.T) {
	lm, pool := storiesPoolOn(t, cpu.New(2), 16, 400)
	e := NewEngine(lm, pool, Config{ContextLength: lm.Config.ContextLength, MaxRunning: 16}, metrics.New("standalone"))
	startEngine(t, e)
	want := loadRef(t)
	params := func(seed uint64) Params {
		return Params{MaxTokens: 24, Seed: &seed, Sampling: model.Sampling{Temperature: 1, TopLogprobs: 2}}
	}
	run := func(rs ...*Request) [][]model.Sampled {
		for _, r := range rs {
			if err := e.Enqueue(r); err != nil {
				t.Fatal(err)
			}
		}
		out := make([][]model.Sampled, len(rs))
		for i, r := range rs {
			out[i], _ = collect(t, r)
		}
		return out
	}
	alone := run(NewRequest("alone", want.PromptIDs, params(42)))[0]
	batch := []*Request{NewRequest("seeded", want.PromptIDs, params(42))}
	for i := range 12 {
		batch = append(batch, NewRequest(fmt.Sprintf("other%d", i), want.PromptIDs, params(uint64(1000+i))))
	}
	got := run(batch...)
	if len(alone) != 24 || len(got[0]) != 24 {
		t.Fatalf("%d and %d tokens, want 24", len(alone), len(got[0]))
	}
	differ := false
	for j := range alone {
		a, b := alone[j], got[0][j]
		if a.ID != b.ID || math.Abs(float64(a.Logprob-b.Logprob)) > 1e-3 || len(a.Top) != len(b.Top) {
			t.Fatalf("token %d: alone %+v, in a batch %+v", j, a, b)
		}
		for _, o := range got[1:] {
			differ = differ || o[j].ID != a.ID
		}
	}
	if !differ {
		t.Fatal("twelve other seeds drew the seeded request's very tokens")
	}
}
