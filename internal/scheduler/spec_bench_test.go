package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	testref "github.com/batonlm/baton/test/reference"
	dto "github.com/prometheus/client_model/go"
)

// BenchmarkSpecDecode is one stream's greedy output tokens per second with
// and without ngram speculation, on a prompt that repeats itself (the
// input-echoing case speculation is for): the bundled stories260K, and
// random weights of a 110M llama shape. It reports the accept length
// (tokens per verifying step) and rate too.
//
//	go test ./internal/scheduler/ -run '^$' -bench SpecDecode
func BenchmarkSpecDecode(b *testing.B) {
	be := cpu.New(0)
	l, err := model.Load(model.LoadOptions{}, be)
	if err != nil {
		b.Fatal(err)
	}
	ref := testref.Load(b)
	var small []int32
	for range 3 {
		small = append(small, ref.PromptIDs...)
		small = append(small, ref.GeneratedIDs[:40]...)
	}
	c, w := dummy110M(b)
	var big []int32
	for i := range 64 {
		big = append(big, int32(1+(i*7919)%31999))
	}
	big = append(append(big, big...), big...)
	for _, m := range []struct {
		name   string
		model  *model.Model
		prompt []int32
		gen    int
	}{{"stories260K", l.Model, small, 256}, {"dummy110M", model.New(c, w, be), big, 64}} {
		for _, spec := range []SpecConfig{{}, {Algorithm: "ngram", DraftTokens: 4, Steps: 4}} {
			name := "off"
			if spec.Algorithm != "" {
				name = fmt.Sprintf("%s-k%d", spec.Algorithm, spec.draftLen())
			}
			b.Run(m.name+"/"+name, func(b *testing.B) {
				mc := m.model.Config
				pool, err := kvpool.New(kvpool.Config{NumPages: 256, PageSize: 16, Layers: mc.Layers, KVHeads: mc.KVHeads, HeadDim: mc.HeadDim})
				if err != nil {
					b.Fatal(err)
				}
				e := NewEngine(m.model, pool, Config{ContextLength: mc.ContextLength, MaxRunning: 4, Spec: spec}, metrics.New("standalone"))
				startEngine(b, e)
				var tokens int
				var decode time.Duration
				for b.Loop() {
					r := NewRequest("b", m.prompt, Params{MaxTokens: m.gen, IgnoreEOS: true})
					if err := e.Enqueue(r); err != nil {
						b.Fatal(err)
					}
					var first time.Time
					for {
						ev, ok := r.Next(b.Context())
						if !ok || ev.Err != nil {
							b.Fatalf("request ended: %v", ev.Err)
						}
						if ev.Token != nil {
							tokens++
							if first.IsZero() {
								first = time.Now() // decode speed: after the prompt
							}
						}
						if ev.Finish != "" {
							break
						}
					}
					decode += time.Since(first)
					tokens-- // the first token came with the prompt
				}
				b.ReportMetric(float64(tokens)/decode.Seconds(), "tok/s")
				if d := counter(e.m.SpecDraftTokens); d > 0 {
					a := counter(e.m.SpecAcceptedTokens)
					b.ReportMetric(a/d, "accept_rate")
					var h dto.Metric
					if err := e.m.SpecAcceptLength.Write(&h); err == nil && h.GetHistogram().GetSampleCount() > 0 {
						b.ReportMetric(h.GetHistogram().GetSampleSum()/float64(h.GetHistogram().GetSampleCount()), "accept_len")
					}
				}
			})
		}
	}
}

// dummy110M is random F32 weights of a 110M llama shape (768x12, vocab
// 32000), for the speculative decoding benchmarks.
func dummy110M(b *testing.B) (model.Config, *model.Weights) {
	c := model.Config{Arch: "llama", Name: "dummy", Vocab: 32000, Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, HeadDim: 64, FF: 2048,
		ContextLength: 2048, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 10000}}
	w, err := model.DummyWeights(&c, kernels.F32)
	if err != nil {
		b.Fatal(err)
	}
	return c, w
}
