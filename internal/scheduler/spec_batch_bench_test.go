package scheduler

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
)

// BenchmarkSpecStreams is output tokens per second of greedy decoding at 1,
// 8, 16 and 32 concurrent streams on random weights of a 110M llama shape, with
// speculation off, ngram, ngram backing off at 8 running requests, and a
// draft model (the target's first 2 of 12 layers). Random weights do not
// copy their input; greedy, they fall into loops after a while, which the
// lookup drafts from, so the 1-stream figure is an upper bound of what an
// echoing model gives only where its output repeats. The 32-stream rows
// show what drafting costs a compute-bound batch and what the back-off
// gives back.
//
//	go test ./internal/scheduler/ -run '^$' -bench SpecStreams -benchtime 1x
func BenchmarkSpecStreams(b *testing.B) {
	be := cpu.New(0)
	c, w := dummy110M(b)
	target := model.New(c, w, be)
	dc := c
	dc.Layers = 2
	dw := *w
	dw.Layers = w.Layers[:2]
	prompt := func(i int) []int32 {
		var p []int32
		for j := range 96 {
			p = append(p, int32(1+((i+1)*7919+j*104729)%31999))
		}
		return p
	}
	const gen = 64
	for _, streams := range []int{1, 8, 16, 32} {
		for _, sc := range []struct {
			name string
			spec SpecConfig
		}{
			{"off", SpecConfig{}},
			{"ngram-k4", SpecConfig{Algorithm: "ngram", DraftTokens: 4, Steps: 4}},
			{"ngram-k4-backoff8", SpecConfig{Algorithm: "ngram", DraftTokens: 4, Steps: 4, DisableBatch: 8}},
			{"draft2L-k4", SpecConfig{Algorithm: "draft", DraftTokens: 4, Steps: 4}},
		} {
			b.Run(fmt.Sprintf("streams%d/%s", streams, sc.name), func(b *testing.B) {
				pool, err := kvpool.New(kvpool.Config{NumPages: 32 * 12, PageSize: 16, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim})
				if err != nil {
					b.Fatal(err)
				}
				spec := sc.spec
				if spec.Algorithm == "draft" {
					dp, err := kvpool.New(kvpool.Config{NumPages: 32 * 12, PageSize: 16, Layers: dc.Layers, KVHeads: dc.KVHeads, HeadDim: dc.HeadDim})
					if err != nil {
						b.Fatal(err)
					}
					spec.Draft = &DraftModel{Model: model.New(dc, &dw, be), Pool: dp}
				}
				e := NewEngine(target, pool, Config{ContextLength: c.ContextLength, MaxRunning: 32, ChunkSize: 4096, Spec: spec}, metrics.New("standalone"))
				startEngine(b, e)
				var tokens int
				var decode time.Duration
				for b.Loop() {
					// Decode speed: from the last first token to the last
					// token, every stream decoding all along.
					var mu sync.Mutex
					var firstAll, lastAll time.Time
					var wg sync.WaitGroup
					for i := range streams {
						r := NewRequest("b", prompt(i), Params{MaxTokens: gen, IgnoreEOS: true})
						if err := e.Enqueue(r); err != nil {
							b.Fatal(err)
						}
						wg.Go(func() {
							n := 0
							for {
								ev, ok := r.Next(b.Context())
								if !ok || ev.Err != nil {
									b.Errorf("request ended: %v", ev.Err)
									return
								}
								if ev.Token != nil {
									n++
									if n == 1 {
										mu.Lock()
										if now := time.Now(); now.After(firstAll) {
											firstAll = now
										}
										mu.Unlock()
									}
								}
								if ev.Finish != "" {
									mu.Lock()
									lastAll = time.Now()
									tokens += n - 1
									mu.Unlock()
									return
								}
							}
						})
					}
					wg.Wait()
					decode += lastAll.Sub(firstAll)
				}
				b.ReportMetric(float64(tokens)/decode.Seconds(), "tok/s")
				if d := counter(e.m.SpecDraftTokens); d > 0 {
					b.ReportMetric(counter(e.m.SpecAcceptedTokens)/d, "accept_rate")
				}
			})
		}
	}
}
