package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/fleetsim"
)

func simCmd() *cobra.Command {
	var (
		pf             plannerFlags
		gen            fleetsim.Gen
		trace          string
		prefill, dec   int
		pageSize       int
		startup, every time.Duration
		compare        bool
		target         float64
		maxSearch      int
		asJSON         bool
		writeTrace     string
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Simulate a fleet on a trace: SLO attainment and worker-hours, fixed or planned",
		Long: `Replay a trace on a model of the fleet (prefill queues, batched decode bounded by
its KV pool, the handoff between), built from one worker's measured capacity
(--planner-capacity), and print the share of requests that met --ttft-slo and
--itl-slo and the worker-hours spent. --trace is poisson, burst or day (generated
from --rate, --duration and the length flags with --seed) or a CSV file
(arrival_s,prompt_tokens,output_tokens). With --planner the planner resizes the
fleet every --interval and workers it adds serve after --startup-delay; otherwise
the fleet is --prefill:--decode. --compare runs the planner, the fixed ratios 1:1,
1:2 and 1:4 each at the fewest workers that meet --target, and the cheapest fixed
fleet found by search.`,
		Example: `  baton sim --trace day --duration 1h --rate 120 --ttft-slo 50ms --itl-slo 2ms --compare`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pc, err := pf.config()
			if err != nil {
				return err
			}
			var reqs []fleetsim.Request
			switch trace {
			case "poisson", "burst", "day":
				gen.Shape = fleetsim.Shape(trace)
				reqs, err = fleetsim.Generate(gen)
			default:
				var f *os.File
				if f, err = os.Open(trace); err == nil {
					reqs, err = fleetsim.ParseTrace(f)
					f.Close()
				}
			}
			if err != nil {
				return err
			}
			if writeTrace != "" {
				f, err := os.Create(writeTrace)
				if err != nil {
					return err
				}
				if err := fleetsim.WriteTrace(f, reqs); err != nil {
					return err
				}
				if err := f.Close(); err != nil {
					return err
				}
			}
			base := fleetsim.Config{Capacity: pc.Capacity, SLO: pc.SLO, PageSize: pageSize, Prefill: prefill, Decode: dec,
				Interval: every, StartupDelay: startup}
			var rows []simRow
			run := func(name string, c fleetsim.Config) (fleetsim.Result, error) {
				r, err := fleetsim.Run(c, reqs)
				if err == nil {
					rows = append(rows, simRow{name, c.Prefill, c.Decode, c.Planner != nil, r})
				}
				return r, err
			}
			if !compare {
				c := base
				if pf.enabled {
					c.Planner = &pc
				}
				if _, err := run("run", c); err != nil {
					return err
				}
				return printSim(cmd.OutOrStdout(), rows, asJSON)
			}
			planned := base
			planned.Prefill, planned.Decode, planned.Planner = 1, 1, &pc
			if _, err := run("planner", planned); err != nil {
				return err
			}
			meets := func(p, d int) (fleetsim.Result, bool, error) {
				c := base
				c.Prefill, c.Decode = p, d
				r, err := fleetsim.Run(c, reqs)
				return r, r.Attainment() >= target, err
			}
			for _, ratio := range []int{1, 2, 4} {
				k := 1
				for ; k < maxSearch; k++ {
					if _, ok, err := meets(k, k*ratio); err != nil {
						return err
					} else if ok {
						break
					}
				}
				c := base
				c.Prefill, c.Decode = k, k*ratio
				if _, err := run(fmt.Sprintf("fixed 1:%d", ratio), c); err != nil {
					return err
				}
			}
			// The cheapest fixed fleet: for each prefill count, the
			// fewest decode workers that meet the target.
			bestP, bestD := 0, 0
			for p := 1; p <= maxSearch; p++ {
				for d := 1; d <= maxSearch && (bestP == 0 || p+d < bestP+bestD); d++ {
					if _, ok, err := meets(p, d); err != nil {
						return err
					} else if ok {
						bestP, bestD = p, d
						break
					}
				}
			}
			if bestP > 0 {
				c := base
				c.Prefill, c.Decode = bestP, bestD
				if _, err := run("best fixed", c); err != nil {
					return err
				}
			}
			return printSim(cmd.OutOrStdout(), rows, asJSON)
		},
	}
	fs := cmd.Flags()
	pf.register(fs, false)
	fs.BoolVar(&pf.enabled, "planner", false, "let the planner resize the fleet (without --compare)")
	fs.StringVar(&trace, "trace", "day", "poisson, burst, day, or a CSV file of arrival_s,prompt_tokens,output_tokens")
	fs.DurationVar(&gen.Duration, "duration", time.Hour, "generated trace: its length (a day shape puts a whole day in it)")
	fs.Float64Var(&gen.Rate, "rate", 60, "generated trace: requests/s (poisson: mean; burst: between bursts; day: the peak)")
	fs.Float64Var(&gen.PromptMean, "prompt-mean", 128, "generated trace: mean prompt tokens")
	fs.Float64Var(&gen.OutputMean, "output-mean", 256, "generated trace: mean output tokens")
	fs.Float64Var(&gen.CV, "cv", 0.5, "generated trace: lengths' coefficient of variation (log-normal; 0: fixed)")
	fs.IntVar(&gen.PromptMax, "prompt-max", 256, "generated trace: longest prompt")
	fs.IntVar(&gen.OutputMax, "output-max", 256, "generated trace: longest output")
	fs.Uint64Var(&gen.Seed, "seed", 1, "generated trace: seed")
	fs.StringVar(&writeTrace, "write-trace", "", "write the trace to this CSV file")
	fs.IntVar(&prefill, "prefill", 1, "prefill workers (fixed; the planner's start)")
	fs.IntVar(&dec, "decode", 1, "decode workers (fixed; the planner's start)")
	fs.IntVar(&pageSize, "page-size", 16, "decode's KV page in tokens")
	fs.DurationVar(&startup, "startup-delay", 30*time.Second, "time from a worker asked for to it serving")
	fs.DurationVar(&every, "interval", 15*time.Second, "planner: time between decisions")
	fs.BoolVar(&compare, "compare", false, "the planner against fixed 1:1, 1:2, 1:4 and the cheapest fixed fleet")
	fs.Float64Var(&target, "target", 0.99, "compare: the share of requests a fleet must meet both SLOs for")
	fs.IntVar(&maxSearch, "max-search", 16, "compare: most workers of a role the search tries")
	fs.BoolVar(&asJSON, "json", false, "print the results as JSON")
	return cmd
}

type simRow struct {
	Name    string          `json:"name"`
	Prefill int             `json:"prefill"`
	Decode  int             `json:"decode"`
	Planned bool            `json:"planned"`
	Result  fleetsim.Result `json:"result"`
}

func printSim(w io.Writer, rows []simRow, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "fleet\tprefill:decode\tSLO met\tTTFT met\tITL met\tworker-hours\tTTFT p99\tITL p99 (mean/request)")
	for _, r := range rows {
		fleet := fmt.Sprintf("%d:%d", r.Prefill, r.Decode)
		if r.Planned {
			fleet = fmt.Sprintf("max %d:%d", r.Result.MaxPrefill, r.Result.MaxDecode)
		}
		res := r.Result
		n := float64(max(res.Requests, 1))
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%.2f%%\t%.2f%%\t%.2f\t%.1fms\t%.2fms\n", r.Name, fleet, 100*res.Attainment(),
			100*float64(res.TTFTMet)/n, 100*float64(res.ITLMet)/n, res.WorkerHours, 1000*res.TTFTP99, 1000*res.ITLP99)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, r := range rows {
		if r.Planned {
			fmt.Fprintf(w, "planner: %d changes over %d requests\n", len(r.Result.Changes), r.Result.Requests)
		}
	}
	return nil
}
