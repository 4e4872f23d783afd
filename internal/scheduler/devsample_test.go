package scheduler

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
)

// The engine's device sampling path (a kernels.RowSampler backend) on the
// reference backend, with a RowSampler that makes the CPU sampler's very
// choice from each row's edits and u: the engine must then give every
// request exactly what the CPU path gives it, alone or batched, and fail
// a NaN row as the CPU path does. The kernels' own agreement with the CPU
// sampler is tested in internal/kernels/cuda (sample_test.go).

// rowSamplerBackend is a backend whose RowSampler is the CPU sampler.
type rowSamplerBackend struct {
	kernels.Backend
	mu   sync.Mutex
	rows int // rows sampled through SampleRows
}

// fixedU is a random source whose Float64 is u (math/rand/v2 divides the
// low 53 bits of Uint64 by 2^53).
type fixedU struct{ u float64 }

func (f *fixedU) Uint64() uint64 { return uint64(f.u * (1 << 53)) }

func (b *rowSamplerBackend) SampleRows(logits []float32, vocab int, rows []kernels.SampleRow, out []kernels.SampleResult) {
	b.mu.Lock()
	b.rows += len(rows)
	b.mu.Unlock()
	var s model.Sampler
	for i, r := range rows {
		raw := logits[r.Row*vocab : (r.Row+1)*vocab]
		if hasNaN(raw) {
			out[i] = kernels.SampleResult{NaN: true}
			continue
		}
		w := slices.Clone(raw)
		for _, e := range r.Edits {
			v := w[e.ID] + e.Bias
			if e.Repeat {
				if v > 0 {
					v /= r.Repetition
				} else {
					v *= r.Repetition
				}
			}
			w[e.ID] = v - e.Penalty
		}
		var p model.Sampling
		var rng *rand.Rand
		if r.Draw {
			p = model.Sampling{Temperature: r.Temperature, TopK: r.TopK, TopP: r.TopP, MinP: r.MinP}
			rng = rand.New(&fixedU{r.U})
		}
		id := s.SampleAfter(w, p, rng, model.History{Ban: r.Ban, Allow: r.Allow}).ID
		sc := s.Score(raw, id, r.TopLogprobs)
		res := kernels.SampleResult{ID: sc.ID, Logprob: sc.Logprob}
		for _, a := range sc.Top {
			res.Top = append(res.Top, kernels.TokenLogprob(a))
		}
		out[i] = res
	}
}

func (b *rowSamplerBackend) sampled() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rows
}

// Seeded requests of every kind of sampling, run together on an engine
// that samples on the "device" and one by one on the CPU path, give the
// same tokens and logprobs (prompt logprobs included: those rows come to
// the host).
func TestEngineDeviceSamplingMatchesHost(t *testing.T) {
	want := loadRef(t)
	dev := &rowSamplerBackend{Backend: ref.New()}
	de := engineOn(t, dev)
	he := engineOn(t, ref.New())
	seed := func(s uint64) *uint64 { return &s }
	params := []Params{
		{MaxTokens: 12},
		{MaxTokens: 12, Seed: seed(1), Sampling: model.Sampling{Temperature: 1, TopLogprobs: 3}},
		{MaxTokens: 12, Seed: seed(2), Sampling: model.Sampling{Temperature: 0.8, TopK: 20, TopP: 0.9}},
		{MaxTokens: 12, Seed: seed(3), Sampling: model.Sampling{Temperature: 1.2, MinP: 0.05, RepetitionPenalty: 1.3}},
		{MaxTokens: 12, Seed: seed(4), Sampling: model.Sampling{Temperature: 1, PresencePenalty: 0.5, FrequencyPenalty: 0.5,
			LogitBias: map[int32]float64{want.GeneratedIDs[0]: -5}}},
		{MaxTokens: 12, MinTokens: 6, Seed: seed(5), Sampling: model.Sampling{Temperature: 1, TopK: 5}},
		{MaxTokens: 4, PromptLogprobs: true, Seed: seed(6), Sampling: model.Sampling{Temperature: 1, TopLogprobs: 2}},
	}
	// Host: one at a time.
	hostOut := make([][]model.Sampled, len(params))
	for i, p := range params {
		r := NewRequest("h", want.PromptIDs, p)
		if err := he.Enqueue(r); err != nil {
			t.Fatal(err)
		}
		hostOut[i], _ = collect(t, r)
	}
	// Device: all at once.
	reqs := make([]*Request, len(params))
	for i, p := range params {
		reqs[i] = NewRequest("d", want.PromptIDs, p)
		if err := de.Enqueue(reqs[i]); err != nil {
			t.Fatal(err)
		}
	}
	for i, r := range reqs {
		got, _ := collect(t, r)
		if len(got) != len(hostOut[i]) {
			t.Fatalf("request %d: %d tokens on the device path, %d on the host", i, len(got), len(hostOut[i]))
		}
		for j, g := range got {
			h := hostOut[i][j]
			if g.ID != h.ID || math.Abs(float64(g.Logprob-h.Logprob)) > 1e-5 || len(g.Top) != len(h.Top) {
				t.Fatalf("request %d token %d: device path %+v, host %+v", i, j, g, h)
			}
		}
	}
	if dev.sampled() == 0 {
		t.Fatal("the engine never sampled on the device")
	}
}

// engineOn is a running engine for the bundled model on be.
func engineOn(t *testing.T, be kernels.Backend) *Engine {
	t.Helper()
	lm, pool := storiesPoolOn(t, be, 16, 300)
	c := lm.Config
	e := NewEngine(lm, pool, Config{ContextLength: c.ContextLength, ChunkSize: 512, MaxRunning: 16, IsEOG: func(id int32) bool { return id == 2 }}, metrics.New("standalone"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// The NaN gate on the device path: the row's NaN flag fails the request
// with the host path's error and metric, and no token goes out.
func TestNaNLogitsAreNeverSampledOnDevice(t *testing.T) {
	be := &rowSamplerBackend{Backend: ref.New()}
	e, ms := manualEngineOn(t, be)
	r := startManual(t, e)
	before := be.sampled()
	kv := e.pool.KV()
	kv.Data[kv.KOffset(int(r.pages[0]), 0, 0)] = float32(math.NaN())
	e.step()
	if be.sampled() == before {
		t.Fatal("the step did not sample on the device")
	}
	ev := lastEvent(t, r)
	if ev.Token != nil || ev.Finish != FinishError || !strings.Contains(ev.Err.Error(), "NaN logits") {
		t.Fatalf("event %+v, want a NaN-logits failure and no token", ev)
	}
	if n := testutilValue(t, ms, "baton_nan_logits_total"); n != 1 {
		t.Fatalf("NaN logits counted %v times, want 1", n)
	}
}
