package scheduler

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/model/synth"
)

// A mixture of experts served by the engine gives, under batching (8
// requests at once, prefill in chunks of 2 or whole), the tokens of the
// model's own greedy decoding of one sequence: a step's rows are routed
// each to its own experts whatever else shares the step.
func TestEngineMoEGreedyUnderBatching(t *testing.T) {
	for _, s := range []synth.Shape{
		{Vocab: 600, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FF: 32, Context: 256, DType: "F16", Arch: "qwen3moe", Experts: 8, ExpertsUsed: 2},
		{Vocab: 600, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FF: 96, Context: 256, DType: "F32", Experts: 4, ExpertsUsed: 2},
	} {
		path := filepath.Join(t.TempDir(), "moe.gguf")
		// A wide spread of weights, so that the greedy choices are clear of
		// rounding.
		if err := synth.Write(path, s, synth.Options{Seed: 9, Std: 0.3}); err != nil {
			t.Fatal(err)
		}
		l, err := model.Load(model.LoadOptions{Path: path}, cpu.New(2))
		if err != nil {
			t.Fatal(err)
		}
		// Each request has a prompt of its own, so rows of different
		// requests route to different experts in one step: a gather or
		// scatter that mixed rows up would hand one request another's.
		const steps, requests = 12, 8
		prompts := make([][]int32, requests)
		wants := make([][]model.Sampled, requests)
		for i := range prompts {
			prompts[i] = []int32{1, 34 + int32(i), 200, 17 + 3*int32(i), 99, 5, 310 - int32(i), 42, 8}
			want, err := l.Model.GreedyDecode(prompts[i], steps, 16, 512, 0)
			if err != nil {
				t.Fatal(err)
			}
			wants[i] = want
		}
		for _, tc := range []struct{ page, chunk int }{{16, 512}, {4, 2}} {
			c := l.Model.Config
			pool, err := kvpool.New(kvpool.Config{NumPages: 2048 / tc.page, PageSize: tc.page, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
			if err != nil {
				t.Fatal(err)
			}
			e := NewEngine(l.Model, pool, Config{ContextLength: c.ContextLength, ChunkSize: tc.chunk, MaxRunning: 8}, metrics.New("standalone"))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { e.Run(ctx); close(done) }()
			what := fmt.Sprintf("%s page %d chunk %d", c.Arch, tc.page, tc.chunk)
			var wg sync.WaitGroup
			for i := range requests {
				wg.Add(1)
				go func() {
					defer wg.Done()
					want := wants[i]
					r := NewRequest("r", prompts[i], Params{MaxTokens: steps})
					if err := e.Enqueue(r); err != nil {
						t.Error(err)
						return
					}
					toks, fin := collect(t, r)
					if fin != FinishLength || len(toks) != steps {
						t.Errorf("%s: finish %q after %d tokens", what, fin, len(toks))
						return
					}
					for j := range toks {
						if toks[j].ID != want[j].ID {
							t.Errorf("%s: token %d = %d, want %d", what, j, toks[j].ID, want[j].ID)
							return
						}
					}
				}()
			}
			wg.Wait()
			waitFree(t, e)
			cancel()
			<-done
		}
		l.Model.Close()
	}
}
