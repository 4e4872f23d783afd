package scrape

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/metrics"
)

// Two real workers' metric sets, served over HTTP and read twice, give the
// window's rates, gauges and percentiles.
func TestObserveRealExposition(t *testing.T) {
	pre, dec, rt := metrics.ForModel("prefill", "m"), metrics.ForModel("decode", "m"), metrics.ForModel("router", "m")
	srv := map[string]*httptest.Server{}
	for name, s := range map[string]*metrics.Set{"prefill": pre, "decode": dec, "router": rt} {
		srv[name] = httptest.NewServer(s.Handler())
		defer srv[name].Close()
	}
	ctx := context.Background()
	read := func(at time.Time) Snapshot {
		snap := Snapshot{At: at, Workers: map[string]Sample{}}
		for _, name := range []string{"prefill", "decode", "router"} {
			s, err := Fetch(ctx, http.DefaultClient, srv[name].URL, "")
			if err != nil {
				t.Fatal(err)
			}
			if s.Role != name {
				t.Fatalf("%s's sample says role %q", name, s.Role)
			}
			if name == "router" {
				snap.Router = &s
			} else {
				snap.Workers[srv[name].URL] = s
			}
		}
		return snap
	}
	pre.PromptTokens.Add(1000) // before the window: not counted
	t0 := time.Unix(1000, 0)
	first := read(t0)

	pre.PromptTokens.Add(2000) // 10 prompts of 200 tokens in 10 s
	for range 10 {
		pre.TTFT.Observe(0.02)
	}
	pre.Queued.Set(3)
	dec.GenerationTokens.Add(500) // 5 answers of 100 tokens
	for range 5 {
		dec.E2E.Observe(1)
	}
	for i := range 100 {
		dec.ITL.Observe(0.004 + 0.0001*float64(i%10))
	}
	dec.ITL.Observe(0.2) // one slow token in a hundred and one
	dec.Running.Set(7)
	dec.TokenUsage.Set(0.75)
	rt.Queued.Set(2)
	for range 99 {
		rt.TTFT.Observe(0.03)
	}
	rt.TTFT.Observe(2)

	o := Observe(first, read(t0.Add(10*time.Second)))
	for name, c := range map[string][2]float64{
		"prompt tok/s": {o.PromptTokensPerSec, 200}, "gen tok/s": {o.GenTokensPerSec, 50},
		"mean prompt": {o.MeanPromptTokens, 200}, "mean output": {o.MeanOutputTokens, 100},
		"prefill queued": {float64(o.PrefillQueued), 3}, "router queued": {float64(o.RouterQueued), 2},
		"decode running": {float64(o.DecodeRunning), 7}, "kv usage": {o.KVUsage, 0.75},
		"prefill": {float64(o.Prefill), 1}, "decode": {float64(o.Decode), 1},
	} {
		if c[0] != c[1] {
			t.Errorf("%s = %v, want %v", name, c[0], c[1])
		}
	}
	// The router's TTFT: 99 of 100 at 30ms are in (25ms, 50ms].
	if o.TTFTP99 <= 25*time.Millisecond || o.TTFTP99 > 50*time.Millisecond {
		t.Errorf("TTFT p99 %v, want in (25ms, 50ms]", o.TTFTP99)
	}
	// ITL: the 100th of 101 is in (2.5ms, 5ms].
	if o.ITLP99 <= 2500*time.Microsecond || o.ITLP99 > 5*time.Millisecond {
		t.Errorf("ITL p99 %v, want in (2.5ms, 5ms]", o.ITLP99)
	}
}

func TestParseRefusesGarbage(t *testing.T) {
	if _, err := Parse(strings.NewReader("baton_x{ 1\n")); err == nil {
		t.Fatal("a broken exposition parsed")
	}
}
