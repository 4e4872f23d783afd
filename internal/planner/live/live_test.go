package live

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/planner"
)

// The loop reads real workers' /metrics, and the router's /metrics then
// serves the desired counts and the reason, as prometheus-adapter reads them.
func TestLoopExportsDesiredReplicas(t *testing.T) {
	pre, dec, rt := metrics.ForModel("prefill", "m"), metrics.ForModel("decode", "m"), metrics.ForModel("router", "m")
	ps, ds := httptest.NewServer(pre.Handler()), httptest.NewServer(dec.Handler())
	defer ps.Close()
	defer ds.Close()
	p, err := planner.New(planner.Config{SLO: planner.SLO{TTFT: 500 * time.Millisecond, ITL: 50 * time.Millisecond},
		Capacity: planner.Capacity{PrefillTokensPerSec: 1000, DecodeStepBase: 10 * time.Millisecond, DecodeStepPerSeq: time.Millisecond,
			DecodeMaxBatch: 32, KVTokens: 8192}})
	if err != nil {
		t.Fatal(err)
	}
	l := New(Options{Planner: p, Self: rt.Registry, Targets: func() []Target {
		return []Target{{URL: ps.URL}, {URL: ds.URL}}
	}}, rt.Registerer)
	ctx := context.Background()
	t0 := time.Now()
	if _, ok := l.Step(ctx, t0); ok {
		t.Fatal("decided from one read")
	}
	// 3000 prompt tokens/s against 1000 per worker: prefill must grow.
	pre.PromptTokens.Add(30000)
	for range 100 {
		pre.TTFT.Observe(0.1)
	}
	dec.GenerationTokens.Add(1000)
	for range 10 {
		dec.E2E.Observe(1)
	}
	d, ok := l.Step(ctx, t0.Add(10*time.Second))
	if !ok || d.Prefill.Desired < 4 || d.Decode.Desired < 1 {
		t.Fatalf("decision %+v", d)
	}
	router := httptest.NewServer(rt.Handler())
	defer router.Close()
	resp, err := http.Get(router.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{
		`baton_planner_desired_replicas{model_name="m",role="prefill"} ` + strconv.Itoa(d.Prefill.Desired),
		`baton_planner_desired_replicas{model_name="m",role="decode"} ` + strconv.Itoa(d.Decode.Desired),
		`baton_planner_reason{model_name="m",reason="ttft_model",role="prefill"} 1`,
		`baton_planner_reason{model_name="m",reason="cooldown",role="prefill"} 0`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
