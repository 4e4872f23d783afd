package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/planner"
	"github.com/batonlm/baton/internal/planner/live"
	"github.com/batonlm/baton/internal/planner/scrape"
	"github.com/batonlm/baton/internal/router"
)

// measuredCapacity is one worker of each role serving the bundled model
// (stories260K) on the 2-core machine the README's "Sizing the pools"
// figures come from: --threads 1, --max-total-tokens 8192, page size 16,
// --max-running-requests 64, fitted to baton bench serve at concurrency 1
// (prompts of 16 and 256 tokens: 0.039 ms a token and 3.7 ms besides) and
// at concurrency 1 and 32 (128-token answers: 0.13 and 2.73 ms a token).
var measuredCapacity = planner.Capacity{
	PrefillTokensPerSec: 25600, PrefillOverhead: 1300 * time.Microsecond, Handoff: 2400 * time.Microsecond,
	DecodeStepBase: 46 * time.Microsecond, DecodeStepPerSeq: 84 * time.Microsecond,
	DecodeMaxBatch: 64, KVTokens: 8192,
}

// plannerFlags are the planner's settings, shared by serve --role router
// --planner, plan and sim.
type plannerFlags struct {
	enabled                              bool
	interval                             time.Duration
	ttftSLO, itlSLO                      time.Duration
	capacityFile                         string
	upCooldown, downCooldown, downWindow time.Duration
	maxReplicas                          int
}

func (p *plannerFlags) register(fs *pflag.FlagSet, serve bool) {
	if serve {
		fs.BoolVar(&p.enabled, "planner", false, "router: read the workers' metrics every --planner-interval and export baton_planner_desired_replicas{role} for an autoscaler")
		fs.DurationVar(&p.interval, "planner-interval", 15*time.Second, "router: how often the planner reads the workers")
	}
	fs.DurationVar(&p.ttftSLO, "ttft-slo", 500*time.Millisecond, "planner: time to first token each request should meet")
	fs.DurationVar(&p.itlSLO, "itl-slo", 50*time.Millisecond, "planner: mean time between a request's tokens it should meet")
	fs.StringVar(&p.capacityFile, "planner-capacity", "", "planner: JSON file of one worker's measured capacity per role (default: the bundled model's on a 2-core CPU)")
	if !serve {
		fs.DurationVar(&p.upCooldown, "up-cooldown", time.Minute, "least time between two scale-ups of a role")
		fs.DurationVar(&p.downCooldown, "down-cooldown", 3*time.Minute, "least time after a change before a scale-down")
		fs.DurationVar(&p.downWindow, "down-window", 5*time.Minute, "how long the load must allow fewer workers before a scale-down")
		fs.IntVar(&p.maxReplicas, "max-replicas", 64, "most workers of a role")
	}
}

// capacityJSON is the calibration file's form: durations as Go strings.
type capacityJSON struct {
	PrefillTokensPerSec float64 `json:"prefill_tokens_per_sec"`
	PrefillOverhead     string  `json:"prefill_overhead"`
	Handoff             string  `json:"handoff"`
	DecodeStepBase      string  `json:"decode_step_base"`
	DecodeStepPerSeq    string  `json:"decode_step_per_seq"`
	DecodeMaxBatch      int     `json:"decode_max_batch"`
	KVTokens            int     `json:"kv_tokens"`
}

func (p *plannerFlags) capacity() (planner.Capacity, error) {
	if p.capacityFile == "" {
		return measuredCapacity, nil
	}
	b, err := os.ReadFile(p.capacityFile)
	if err != nil {
		return planner.Capacity{}, err
	}
	var cj capacityJSON
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cj); err != nil {
		return planner.Capacity{}, fmt.Errorf("%s: %w", p.capacityFile, err)
	}
	c := planner.Capacity{PrefillTokensPerSec: cj.PrefillTokensPerSec, DecodeMaxBatch: cj.DecodeMaxBatch, KVTokens: cj.KVTokens}
	for _, d := range []struct {
		s   string
		out *time.Duration
	}{{cj.PrefillOverhead, &c.PrefillOverhead}, {cj.Handoff, &c.Handoff}, {cj.DecodeStepBase, &c.DecodeStepBase}, {cj.DecodeStepPerSeq, &c.DecodeStepPerSeq}} {
		if d.s == "" {
			continue
		}
		if *d.out, err = time.ParseDuration(d.s); err != nil {
			return planner.Capacity{}, fmt.Errorf("%s: %w", p.capacityFile, err)
		}
	}
	return c, nil
}

func (p *plannerFlags) config() (planner.Config, error) {
	c, err := p.capacity()
	if err != nil {
		return planner.Config{}, err
	}
	return planner.Config{SLO: planner.SLO{TTFT: p.ttftSLO, ITL: p.itlSLO}, Capacity: c,
		UpCooldown: p.upCooldown, DownCooldown: p.downCooldown, DownWindow: p.downWindow, Max: p.maxReplicas}, nil
}

// startPlanner runs the router's planning loop when --planner is given,
// reading the workers the router knows (its discovery's view) and its
// own metrics.
func startPlanner(ctx context.Context, f *serveFlags, rt *router.Router, ms *metrics.Set, log *slog.Logger) error {
	if !f.planner.enabled {
		return nil
	}
	cfg, err := f.planner.config()
	if err != nil {
		return err
	}
	p, err := planner.New(cfg)
	if err != nil {
		return err
	}
	l := live.New(live.Options{Planner: p, Self: ms.Registry, APIKey: f.apiKey, Interval: f.planner.interval, Logger: log,
		Targets: func() []live.Target {
			var ts []live.Target
			for _, w := range rt.Workers() {
				if w.Healthy {
					ts = append(ts, live.Target{URL: w.URL, Role: w.Role})
				}
			}
			return ts
		}}, ms.Registerer)
	log.Info("planner on", "interval", f.planner.interval, "ttft_slo", cfg.SLO.TTFT, "itl_slo", cfg.SLO.ITL)
	go l.Run(ctx)
	return nil
}

func planCmd() *cobra.Command {
	var (
		pf     plannerFlags
		from   []string
		window time.Duration
		apiKey string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "plan",
		Short: "Say how many prefill and decode workers the load needs to meet the SLOs",
		Long: `Read the workers' /metrics twice, --window apart, and print how many prefill and
decode workers the load of that window needs to meet --ttft-slo and --itl-slo,
given one worker's measured capacity (--planner-capacity), with the reason.
--workers-from is a router's URL (its /server_info lists the workers, and its
own /metrics adds its queue and the clients' TTFT) or a list of worker URLs
(role from each one's metrics). One decision, undamped: the router's --planner
loop is the one that damps over time.`,
		Example: `  baton plan --workers-from http://127.0.0.1:8000 --ttft-slo 500ms --itl-slo 50ms`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := pf.config()
			if err != nil {
				return err
			}
			p, err := planner.New(cfg)
			if err != nil {
				return err
			}
			c := &http.Client{Timeout: 10 * time.Second}
			ctx := cmd.Context()
			targets, routerURL, err := planTargets(ctx, c, from, apiKey)
			if err != nil {
				return err
			}
			read := func() (scrape.Snapshot, error) {
				snap := scrape.Snapshot{At: time.Now(), Workers: map[string]scrape.Sample{}}
				for _, t := range targets {
					s, err := scrape.Fetch(ctx, c, t.URL, apiKey)
					if err != nil {
						return snap, err
					}
					if t.Role != "" {
						s.Role = t.Role
					}
					snap.Workers[t.URL] = s
				}
				if routerURL != "" {
					s, err := scrape.Fetch(ctx, c, routerURL, apiKey)
					if err != nil {
						return snap, err
					}
					snap.Router = &s
				}
				return snap, nil
			}
			a, err := read()
			if err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(window):
			}
			b, err := read()
			if err != nil {
				return err
			}
			o := scrape.Observe(a, b)
			d := p.Decide(b.At, o)
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"observation": o, "decision": d})
			}
			fmt.Fprintf(out, "window %s: %.0f prompt tok/s, %.0f output tok/s, mean prompt %.0f, mean output %.0f; TTFT p99 %s, ITL p99 %s; queued prefill %d, router %d; KV use %.0f%%\n",
				o.Window.Round(time.Millisecond), o.PromptTokensPerSec, o.GenTokensPerSec, o.MeanPromptTokens, o.MeanOutputTokens,
				o.TTFTP99.Round(time.Microsecond), o.ITLP99.Round(time.Microsecond), o.PrefillQueued, o.RouterQueued, 100*o.KVUsage)
			tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "role\tready\tdesired\treason\twhy")
			for _, rd := range []planner.RoleDecision{d.Prefill, d.Decode} {
				fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", rd.Role, rd.Current, rd.Desired, rd.Reason, rd.Why)
			}
			return tw.Flush()
		},
	}
	fs := cmd.Flags()
	pf.register(fs, false)
	fs.StringSliceVar(&from, "workers-from", []string{"http://127.0.0.1:8000"}, "a router's URL, or worker URLs (comma-separated or repeated)")
	fs.DurationVar(&window, "window", 10*time.Second, "time between the two reads the rates come from")
	fs.StringVar(&apiKey, "api-key", "", "bearer key for /metrics and /server_info")
	fs.BoolVar(&asJSON, "json", false, "print the observation and decision as JSON")
	return cmd
}

// planTargets turns --workers-from into the workers to read: one URL that
// is a router (its /server_info has a workers list) gives its workers and
// itself; otherwise each URL is a worker.
func planTargets(ctx context.Context, c *http.Client, from []string, apiKey string) ([]live.Target, string, error) {
	if len(from) == 1 {
		base := strings.TrimSuffix(from[0], "/")
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/server_info", nil)
		if err != nil {
			return nil, "", err
		}
		if apiKey != "" {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		resp, err := c.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		var info struct {
			Role    string                `json:"role"`
			Workers []router.WorkerStatus `json:"workers"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 8<<20)).Decode(&info); err == nil && info.Role == "router" {
			var ts []live.Target
			for _, w := range info.Workers {
				if w.Healthy {
					ts = append(ts, live.Target{URL: w.URL, Role: w.Role})
				}
			}
			return ts, base, nil
		}
	}
	var ts []live.Target
	for _, u := range from {
		ts = append(ts, live.Target{URL: strings.TrimSuffix(u, "/")})
	}
	return ts, "", nil
}
