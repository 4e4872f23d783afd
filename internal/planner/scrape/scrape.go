// Package scrape reads baton workers' /metrics (the Prometheus text
// exposition) and turns two reads of a fleet into the planner's
// Observation: rates between them, gauges at the second, histograms of the
// window between.
package scrape

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/batonlm/baton/internal/planner"
)

// Sample is what the planner needs from one process's metrics.
type Sample struct {
	Role string // the series' role label: prefill, decode or router
	// Counters.
	PromptTokens, GenTokens float64
	// Gauges.
	Queued, Running, TokenUsage float64
	// TTFT, ITL and E2E are the histograms; their counts are requests
	// (TTFT, E2E) and tokens (ITL).
	TTFT, ITL, E2E planner.Histogram
}

// Parse reads one exposition in the text format.
func Parse(r io.Reader) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("scrape: %w", err)
	}
	return FromFamilies(mfs), nil
}

// FromFamilies reads a gathered registry (the router's own) or a parsed
// exposition. Series of one name are summed; the role is the first role
// label found.
func FromFamilies(mfs map[string]*dto.MetricFamily) Sample {
	var s Sample
	val := func(name string) float64 {
		var v float64
		mf := mfs[name]
		if mf == nil {
			return 0
		}
		for _, m := range mf.GetMetric() {
			if s.Role == "" {
				for _, l := range m.GetLabel() {
					if l.GetName() == "role" {
						s.Role = l.GetValue()
					}
				}
			}
			switch {
			case m.Counter != nil:
				v += m.GetCounter().GetValue()
			case m.Gauge != nil:
				v += m.GetGauge().GetValue()
			case m.Untyped != nil:
				v += m.GetUntyped().GetValue()
			}
		}
		return v
	}
	hist := func(name string) planner.Histogram {
		var h planner.Histogram
		mf := mfs[name]
		if mf == nil {
			return h
		}
		for _, m := range mf.GetMetric() {
			ph := m.GetHistogram()
			if ph == nil {
				continue
			}
			one := planner.Histogram{Count: float64(ph.GetSampleCount())}
			for _, b := range ph.GetBucket() {
				one.Bounds = append(one.Bounds, b.GetUpperBound())
				one.Counts = append(one.Counts, float64(b.GetCumulativeCount()))
			}
			if n := len(one.Bounds); n == 0 || !math.IsInf(one.Bounds[n-1], 1) {
				one.Bounds = append(one.Bounds, math.Inf(1))
				one.Counts = append(one.Counts, one.Count)
			}
			h.Add(one)
		}
		return h
	}
	s.PromptTokens = val("baton_prompt_tokens_total")
	s.GenTokens = val("baton_generation_tokens_total")
	s.Queued = val("baton_num_queue_reqs")
	s.Running = val("baton_num_running_reqs")
	s.TokenUsage = val("baton_token_usage")
	s.TTFT = hist("baton_time_to_first_token_seconds")
	s.ITL = hist("baton_inter_token_latency_seconds")
	s.E2E = hist("baton_e2e_request_latency_seconds")
	return s
}

// Gathered reads a registry's Gather output (the router's own metrics).
func Gathered(mfs []*dto.MetricFamily) Sample {
	m := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		m[mf.GetName()] = mf
	}
	return FromFamilies(m)
}

// Fetch reads base's /metrics (base is a worker's HTTP address).
func Fetch(ctx context.Context, c *http.Client, base, apiKey string) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return Sample{}, err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("scrape %s: %s", base, resp.Status)
	}
	return Parse(io.LimitReader(resp.Body, 32<<20))
}

// Snapshot is one read of a fleet: each worker's sample by URL, and the
// router's own when there is one.
type Snapshot struct {
	At      time.Time
	Workers map[string]Sample
	Router  *Sample
}

// Observe is what the fleet did between prev and cur. A worker missing
// from prev (new, or restarted with its counters reset) contributes its
// gauges but no rates until the next window.
func Observe(prev, cur Snapshot) planner.Observation {
	dt := cur.At.Sub(prev.At).Seconds()
	o := planner.Observation{Window: cur.At.Sub(prev.At)}
	var prompt, gen, prefilled, finished float64
	var ttft, itl planner.Histogram
	for url, s := range cur.Workers {
		p, seen := prev.Workers[url]
		if seen && (s.PromptTokens < p.PromptTokens || s.GenTokens < p.GenTokens) {
			seen = false // restarted
		}
		switch s.Role {
		case planner.Prefill:
			o.Prefill++
			o.PrefillQueued += int(s.Queued)
			if seen {
				prompt += s.PromptTokens - p.PromptTokens
				prefilled += s.TTFT.Count - p.TTFT.Count
				ttft.Add(s.TTFT.Sub(p.TTFT))
			}
		case planner.Decode:
			o.Decode++
			o.DecodeRunning += int(s.Running)
			o.KVUsage = max(o.KVUsage, s.TokenUsage)
			if seen {
				gen += s.GenTokens - p.GenTokens
				finished += s.E2E.Count - p.E2E.Count
				itl.Add(s.ITL.Sub(p.ITL))
			}
		}
	}
	if cur.Router != nil {
		o.RouterQueued = int(cur.Router.Queued)
		if prev.Router != nil {
			// The router's TTFT is the client's: its queue, prefill's
			// and the handoff.
			ttft = cur.Router.TTFT.Sub(prev.Router.TTFT)
		}
	}
	if dt > 0 {
		o.PromptTokensPerSec, o.GenTokensPerSec = prompt/dt, gen/dt
	}
	if prefilled > 0 {
		o.MeanPromptTokens = prompt / prefilled
	}
	if finished > 0 {
		o.MeanOutputTokens = gen / finished
	}
	o.TTFTP99 = time.Duration(ttft.Quantile(0.99) * float64(time.Second))
	o.ITLP99 = time.Duration(itl.Quantile(0.99) * float64(time.Second))
	return o
}
