package scheduler

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
)

// loadModel loads the bundled model, or random weights of its shape (dummy),
// with only the first layers when layers > 0 (a smaller model with the
// same tokenizer), or random weights of a smaller shape with -layers
// layers when layers < 0, on the reference backend.
func loadModel(t testing.TB, dummy bool, layers int) *model.Model {
	t.Helper()
	opts := model.LoadOptions{}
	if dummy {
		opts = model.LoadOptions{Path: "../../testdata/stories260K-hf", Format: "dummy"}
	}
	l, err := model.Load(opts, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	m := l.Model
	if layers < 0 {
		// Random weights of another shape with the same vocabulary: a
		// draft whose KV layout (layers, KV heads, head dim) is not the
		// target's.
		c := model.Config{Arch: "llama", Name: "small", Vocab: m.Config.Vocab, Dim: 48, Layers: -layers, Heads: 3, KVHeads: 1, HeadDim: 16, FF: 96,
			ContextLength: m.Config.ContextLength, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 16, Theta: 10000}}
		w, err := model.DummyWeights(&c, kernels.F32)
		if err != nil {
			t.Fatal(err)
		}
		return model.New(c, w, m.Backend())
	}
	if layers > 0 {
		// The first layers of the same weights: a draft that agrees with
		// its target often but not always.
		c := m.Config
		c.Layers = layers
		w := *m.Weights
		w.Layers = w.Layers[:layers]
		m = model.New(c, &w, m.Backend())
	}
	return m
}

// draftOf is a DraftModel of m with a pool of pages pages.
func draftOf(t testing.TB, m *model.Model, pageSize, pages int) *DraftModel {
	t.Helper()
	c := m.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: pages, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	return &DraftModel{Model: m, Pool: pool}
}

// runEngine starts an engine on target with spec, stopped at the test's end.
func runEngine(t testing.TB, target *model.Model, spec SpecConfig, role Role, pageSize, pages int) *Engine {
	t.Helper()
	e := makeEngine(t, target, spec, role, pageSize, pages)
	startEngine(t, e)
	return e
}

func makeEngine(t testing.TB, target *model.Model, spec SpecConfig, role Role, pageSize, pages int) *Engine {
	t.Helper()
	c := target.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: pages, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	return NewEngine(target, pool, Config{Role: role, ContextLength: c.ContextLength, ChunkSize: 64, MaxRunning: 16, Spec: spec, IsEOG: func(id int32) bool { return id == 2 }, Guards: exactGuards}, metrics.New("standalone"))
}

func startEngine(t testing.TB, e *Engine) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// waitDraftFree waits for every draft page to come back.
func waitDraftFree(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.DraftPages() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("draft pages leaked: %d held", e.DraftPages())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := e.cfg.Spec.Draft.Pool.Stats(); st.ReleaseErrors != 0 || st.RollbackRefusals != 0 {
		t.Fatalf("draft pool bookkeeping: %+v", st)
	}
}

// Greedy output with a draft model equals greedy output without one,
// token for token, for requests run together (the draft passes are
// batched), with a page size that puts draft positions across page
// boundaries and prompts longer than a chunk (the draft's prompt KV is
// caught up over several steps). The bundled model drafting for itself
// has every draft accepted (the catch-up after a fully accepted draft);
// its own first layers, and under a random target a random draft of its
// first layers or of another shape (another KV layout), have drafts
// rejected too. Every target and draft page comes
// back.
func TestDraftGreedyEqualsPlain(t *testing.T) {
	exactGate(t)
	for _, tc := range []struct {
		name         string
		dummy        bool
		draftLayers  int
		wantAllTaken bool
	}{
		{"self", false, 0, true},
		{"first3", false, 3, false},
		{"dummy", true, 2, false},
		{"dummy-small", true, -2, false},
	} {
		target := loadModel(t, tc.dummy, 0)
		dm := draftOf(t, loadModel(t, tc.dummy, tc.draftLayers), 4, 600)
		plain := runEngine(t, target, SpecConfig{}, RoleStandalone, 4, 600)
		spec := makeEngine(t, loadModel(t, tc.dummy, 0), SpecConfig{Algorithm: "draft", DraftTokens: 5, Steps: 5, Draft: dm}, RoleStandalone, 4, 600)
		rec := &recDrafter{drafter: spec.drafter}
		spec.drafter = rec
		startEngine(t, spec)
		want := loadRef(t)
		prompts := [][]int32{want.PromptIDs, repetitive(t), append(append([]int32(nil), want.PromptIDs...), want.GeneratedIDs[:50]...)}
		var wg sync.WaitGroup
		for i, prompt := range prompts {
			for _, p := range []Params{
				{MaxTokens: 150, IgnoreEOS: true},
				{MaxTokens: 150, IgnoreEOS: true, StopTokenIDs: []int32{want.GeneratedIDs[40+i]}},
			} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					w, wf := generate(t, plain, prompt, p)
					g, gf := generate(t, spec, prompt, p)
					if fmt.Sprint(g) != fmt.Sprint(w) || gf != wf {
						t.Errorf("%s, prompt %d, %+v: draft speculation changed greedy output:\n got %v (%s)\nwant %v (%s)", tc.name, i, p, g, gf, w, wf)
					}
				}()
			}
		}
		wg.Wait()
		drafted, accepted := counter(spec.m.SpecDraftTokens), counter(spec.m.SpecAcceptedTokens)
		t.Logf("%s: drafted %v, accepted %v", tc.name, drafted, accepted)
		switch {
		case drafted == 0:
			t.Errorf("%s: nothing was drafted", tc.name)
		case tc.wantAllTaken && drafted-accepted > float64(len(prompts)):
			// Only the drafts after an accepted stop token go unused.
			t.Errorf("%s: the model drafting for itself had %v of %v drafts rejected", tc.name, drafted-accepted, drafted)
		case !tc.wantAllTaken && (accepted == drafted || accepted == 0 && !tc.dummy):
			t.Errorf("%s: drafted %v, accepted %v: want drafts rejected (and, from real weights, some accepted)", tc.name, drafted, accepted)
		}
		waitFree(t, spec)
		waitDraftFree(t, spec)
		// The drafts are what the draft model generates greedily from the
		// same sequence computed from scratch: its KV, rolled back after
		// rejections and caught up after acceptance, is the sequence's.
		fresh := runEngine(t, loadModel(t, tc.dummy, tc.draftLayers), SpecConfig{}, RoleStandalone, 16, 300)
		for i, p := range rec.proposals {
			if i%7 != 0 || len(p.tokens) == 0 {
				continue
			}
			g, _ := generate(t, fresh, p.seq, Params{MaxTokens: len(p.tokens), IgnoreEOS: true})
			if fmt.Sprint(g) != fmt.Sprint(p.tokens) {
				t.Fatalf("%s: after %d tokens the draft proposed %v, the draft model from scratch %v", tc.name, len(p.seq), p.tokens, g)
			}
		}
		if f := spec.drafter.(*recDrafter).drafter.(*modelDrafter).failures; f != 0 {
			t.Errorf("%s: %d draft passes failed", tc.name, f)
		}
	}
}

// recDrafter records what a drafter proposed, after which sequence.
type recDrafter struct {
	drafter
	proposals []proposal
}

type proposal struct{ seq, tokens []int32 }

func (d *recDrafter) draft(dst []int32, r *Request, k int) []int32 {
	out := d.drafter.draft(dst, r, k)
	d.proposals = append(d.proposals, proposal{append([]int32(nil), r.seq...), append([]int32(nil), out[len(dst):]...)})
	return out
}

// With a draft pool too small for any request, requests decode without
// drafts and their output is unchanged; a pool that holds one request's
// pages serves one request at a time and they come back.
func TestDraftPoolFullFallsBack(t *testing.T) {
	for _, pages := range []int{1, 8} {
		dm := draftOf(t, loadModel(t, false, 3), 64, pages)
		e := runEngine(t, loadModel(t, false, 0), SpecConfig{Algorithm: "draft", DraftTokens: 4, Steps: 4, Draft: dm}, RoleStandalone, 16, 300)
		runReference(t, e, 4, fmt.Sprintf("draft pool of %d pages", pages))
		waitFree(t, e)
		waitDraftFree(t, e)
		drafted := counter(e.m.SpecDraftTokens)
		if pages == 1 && drafted != 0 {
			t.Errorf("a draft pool of one page drafted %v tokens", drafted)
		}
		if pages == 8 && drafted == 0 {
			t.Errorf("a draft pool of 8 pages drafted nothing")
		}
	}
}

// Sampling with a draft model draws from the target's distribution, with
// a draft whose own distribution differs (the target's first three
// layers): the next-token distributions, over many fixed seeds, are those
// of sampling without speculation (two-sample chi-square at p = 0.001).
func TestDraftSamplingKeepsTheDistribution(t *testing.T) {
	want := loadRef(t)
	prompt := append(append([]int32(nil), want.PromptIDs...), want.GeneratedIDs[:12]...)
	plain := sampleCounts(t, runEngine(t, loadModel(t, false, 0), SpecConfig{}, RoleStandalone, 16, 800), prompt, 1.2, 1)
	dm := draftOf(t, loadModel(t, false, 3), 16, 800)
	se := runEngine(t, loadModel(t, false, 0), SpecConfig{Algorithm: "draft", DraftTokens: 3, Steps: 3, Draft: dm}, RoleStandalone, 16, 800)
	sameDistribution(t, plain, sampleCounts(t, se, prompt, 1.2, 1_000_000), se)
	waitDraftFree(t, se)
}

// A batch at or above --speculative-disable-by-batch-size drafts nothing
// (its requests are all submitted before the loop starts, so they run
// together from their first step); below it the same batch drafts.
func TestSpecBacksOffOnALargeBatch(t *testing.T) {
	for _, limit := range []int{7, 6} {
		e := makeEngine(t, loadModel(t, false, 0), SpecConfig{Algorithm: "ngram", DraftTokens: 4, Steps: 4, DisableBatch: limit}, RoleStandalone, 16, 600)
		var rs []*Request
		for range 6 {
			// A prompt within one chunk: the six prefill in one step, then
			// decode in lockstep to the same last step.
			r := NewRequest("r", loadRef(t).PromptIDs, Params{MaxTokens: 100, IgnoreEOS: true})
			if err := e.Enqueue(r); err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		startEngine(t, e)
		for _, r := range rs {
			toks, _ := collect(t, r)
			if len(toks) != 100 {
				t.Fatalf("limit %d: %d tokens", limit, len(toks))
			}
		}
		drafted := counter(e.m.SpecDraftTokens)
		if limit == 7 && drafted == 0 {
			t.Errorf("6 requests, speculation disabled at 7: nothing drafted")
		}
		if limit == 6 && drafted != 0 {
			t.Errorf("6 requests, speculation disabled at 6: %v tokens drafted", drafted)
		}
	}
}
