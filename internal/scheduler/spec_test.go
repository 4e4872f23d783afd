package scheduler

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var ngram4 = SpecConfig{Algorithm: "ngram", DraftTokens: 4, Steps: 4}

// newSpecEngine is newEngine with speculation set, on the bundled model
// or (dummy) on random weights of the same shape. Every step it also
// holds the pool to the read gate's promise: positions [0, computed) of
// a running request are written and the next one is not, so no rejected
// draft's KV is ever counted as written.
func newSpecEngine(t *testing.T, spec SpecConfig, pageSize, pages int, dummy bool) *Engine {
	t.Helper()
	m := loadModel(t, dummy, 0)
	c := m.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: pages, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(m, pool, Config{ContextLength: c.ContextLength, MaxRunning: 16, Spec: spec, IsEOG: func(id int32) bool { return id == 2 }, Guards: exactGuards}, metrics.New("standalone"))
	startEngine(t, e)
	return e
}

// exactGuards are the guards of the engines the spec tests make: with
// exactGate, a read gate that checks more.
var exactGuards Guards

// exactGate wraps the read gate of the engines made for the test's
// duration: beyond the gate's own check, the position after the written
// ones must read as unwritten.
func exactGate(t *testing.T) {
	var mu sync.Mutex
	var bad error
	exactGuards.ReadGate = func(e *Engine, r *Request) error {
		if err := e.checkReadable(r); err != nil {
			return err
		}
		if r.computed > 0 && r.computed < len(r.pages)*e.pool.PageSize() && r.life.State() == StateDecoding {
			if err := e.pool.CheckReadable(r.owner, r.pages, r.computed+1); !errors.Is(err, kvpool.ErrNotWritten) {
				mu.Lock()
				bad = fmt.Errorf("position %d of %s reads as written before it was (gate says %v)", r.computed, r.ID, err)
				mu.Unlock()
			}
		}
		return nil
	}
	t.Cleanup(func() {
		exactGuards = Guards{}
		mu.Lock()
		defer mu.Unlock()
		if bad != nil {
			t.Error(bad)
		}
	})
}

// repetitive is a prompt that repeats itself, so the n-gram lookup has
// something to draft from at once.
func repetitive(t *testing.T) []int32 {
	want := loadRef(t)
	var p []int32
	for range 3 {
		p = append(p, want.PromptIDs...)
		p = append(p, want.GeneratedIDs[:20]...)
	}
	return p
}

// Greedy output with speculation is the reference token for token, with
// its logprobs, under concurrency and page sizes that put draft positions
// across page boundaries; every page comes back, nothing is refused.
func TestSpecGreedyReference(t *testing.T) {
	exactGate(t)
	for _, tc := range []struct{ page, pages int }{{16, 300}, {1, 4096}, {4, 1200}} {
		e := newSpecEngine(t, ngram4, tc.page, tc.pages, false)
		runReference(t, e, 4, fmt.Sprintf("page %d", tc.page))
		waitFree(t, e)
		if d := counter(e.m.SpecDraftTokens); d == 0 {
			t.Errorf("page %d: nothing was drafted", tc.page)
		}
		if st := e.Pool().Stats(); st.RollbackRefusals != 0 {
			t.Errorf("rollback refusals: %d", st.RollbackRefusals)
		}
	}
}

// On a repetitive prompt, and on long generations of the bundled model and
// of random weights, greedy output with speculation equals greedy output
// without it, drafts are accepted and rejected both, and a stop token
// accepted inside a draft ends the request there.
func TestSpecGreedyEqualsPlain(t *testing.T) {
	exactGate(t)
	for _, dummy := range []bool{false, true} {
		plain := newSpecEngine(t, SpecConfig{}, 16, 400, dummy)
		spec := newSpecEngine(t, SpecConfig{Algorithm: "ngram", DraftTokens: 6, Steps: 5}, 16, 400, dummy)
		for _, prompt := range [][]int32{repetitive(t), loadRef(t).PromptIDs} {
			p := Params{MaxTokens: 300, IgnoreEOS: true}
			want, _ := generate(t, plain, prompt, p)
			got, _ := generate(t, spec, prompt, p)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("dummy %v: speculation changed greedy output:\n got %v\nwant %v", dummy, got, want)
			}
			// A stop token the plain run emits at some position ends the
			// speculating run at the same one.
			stop := want[len(want)/2]
			p = Params{MaxTokens: 300, IgnoreEOS: true, StopTokenIDs: []int32{stop}}
			want, _ = generate(t, plain, prompt, p)
			got, _ = generate(t, spec, prompt, p)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("dummy %v, stop %d: got %v\nwant %v", dummy, stop, got, want)
			}
		}
		// min_tokens (bans that lift at a count), penalties and a logit
		// bias come out as they do without speculation.
		want := loadRef(t).GeneratedIDs
		for _, p := range []Params{
			{MaxTokens: 120, MinTokens: 60, StopTokenIDs: []int32{want[10]}},
			{MaxTokens: 120, IgnoreEOS: true, Sampling: model.Sampling{FrequencyPenalty: 0.7, PresencePenalty: 0.3}},
			{MaxTokens: 120, IgnoreEOS: true, Sampling: model.Sampling{RepetitionPenalty: 1.3, LogitBias: map[int32]float64{want[3]: -5}}},
		} {
			w, _ := generate(t, plain, repetitive(t), p)
			g, _ := generate(t, spec, repetitive(t), p)
			if fmt.Sprint(g) != fmt.Sprint(w) {
				t.Fatalf("dummy %v, %+v: got %v\nwant %v", dummy, p, g, w)
			}
		}
		drafted, accepted := counter(spec.m.SpecDraftTokens), counter(spec.m.SpecAcceptedTokens)
		t.Logf("dummy %v: drafted %v, accepted %v", dummy, drafted, accepted)
		if accepted == 0 || accepted == drafted {
			t.Errorf("dummy %v: drafted %v, accepted %v: want some accepted and some rejected", dummy, drafted, accepted)
		}
		waitFree(t, spec)
	}
}

func counter(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// chiSquareCrit is the chi-square value a statistic with df degrees of
// freedom exceeds with probability 0.001 (Wilson-Hilferty).
func chiSquareCrit(df int) float64 {
	const z = 3.09
	d := float64(df)
	c := 1 - 2/(9*d) + z*math.Sqrt(2/(9*d))
	return d * c * c * c
}

// homogeneity is the two-sample chi-square statistic of equal-sized
// samples a and b, tokens seen fewer than 10 times in both pooled into one
// category, with its degrees of freedom.
func homogeneity(a, b map[int32]int) (float64, int) {
	keys := map[int32]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var x float64
	var ra, rb int
	df := -1
	for k := range keys {
		if a[k]+b[k] < 10 {
			ra, rb = ra+a[k], rb+b[k]
			continue
		}
		d := float64(a[k] - b[k])
		x += d * d / float64(a[k]+b[k])
		df++
	}
	if ra+rb > 0 {
		d := float64(ra - rb)
		x += d * d / float64(ra+rb)
		df++
	}
	return x, df
}

// Sampling with speculation draws from the model's own distribution: the
// next-token distributions at the positions drafts are verified at, over
// many fixed seeds, are those of sampling without speculation (two-sample
// chi-square at p = 0.001). Accepting every draft, or resampling a
// rejected one from the full distribution, fails it.
func TestSpecSamplingKeepsTheDistribution(t *testing.T) {
	want := loadRef(t)
	// The reference twice, the second time cut short: the model tends to
	// go on copying it, which the lookup drafts.
	prompt := append(append(append([]int32(nil), want.PromptIDs...), want.GeneratedIDs[:30]...), want.PromptIDs...)
	prompt = append(prompt, want.GeneratedIDs[:12]...)
	plain := sampleCounts(t, newSpecEngine(t, SpecConfig{}, 16, 800, false), prompt, 1.5, 1)
	se := newSpecEngine(t, ngram4, 16, 800, false)
	sameDistribution(t, plain, sampleCounts(t, se, prompt, 1.5, 1_000_000), se)
}

// specSamples is how many seeded requests, of how many tokens each, the
// distribution tests draw.
const specSamples, specSteps = 600, 4

// sampleCounts generates specSamples requests of specSteps tokens from
// prompt with seeds from seed0 on and counts each position's tokens.
func sampleCounts(t *testing.T, e *Engine, prompt []int32, temperature float64, seed0 uint64) []map[int32]int {
	counts := make([]map[int32]int, specSteps)
	for i := range counts {
		counts[i] = map[int32]int{}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := range uint64(specSamples) {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			seed := seed0 + i
			toks, _ := generate(t, e, prompt, Params{MaxTokens: specSteps, IgnoreEOS: true, Seed: &seed, Sampling: model.Sampling{Temperature: temperature}})
			mu.Lock()
			defer mu.Unlock()
			for j, tk := range toks {
				counts[j][tk]++
			}
		}()
	}
	wg.Wait()
	return counts
}

// sameDistribution fails unless every position after the first has the
// same token distribution in plain and spec (chi-square at p = 0.001),
// and se, the speculating engine, had drafts both accepted and rejected.
func sameDistribution(t *testing.T, plain, spec []map[int32]int, se *Engine) {
	t.Helper()
	drafted, accepted := counter(se.m.SpecDraftTokens), counter(se.m.SpecAcceptedTokens)
	t.Logf("drafted %v, accepted %v over %d requests", drafted, accepted, specSamples)
	for j := 1; j < specSteps; j++ {
		x, df := homogeneity(plain[j], spec[j])
		if x > chiSquareCrit(df) {
			t.Errorf("token %d: chi-square %.1f with %d degrees of freedom (limit %.1f): speculation changed the distribution", j, x, df, chiSquareCrit(df))
		}
		t.Logf("token %d: chi-square %.1f, %d degrees of freedom, limit %.1f", j, x, df, chiSquareCrit(df))
	}
	if drafted < specSamples/2 || accepted == 0 || accepted == drafted {
		t.Errorf("drafted %v, accepted %v: the test needs drafts both accepted and rejected", drafted, accepted)
	}
}
