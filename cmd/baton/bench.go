package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/batonlm/baton/internal/bench"
)

// benchCmd groups the load generators: serve, and calibrate, which
// measures a fleet for the planner.
func benchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark a running server",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(benchServeCmd(), benchCalibrateCmd())
	return cmd
}

func benchServeCmd() *cobra.Command {
	var (
		cfg           bench.Config
		asJSON        bool
		progress      bool
		allowFailures bool
		temperature   float64
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Load an OpenAI-compatible server with streamed completions and report latency and throughput",
		Long: `Send --num-prompts streamed completions (POST /v1/completions with stream,
max_tokens = --output-len, ignore_eos and stream_options.include_usage), at most
--concurrency at once, arriving at --request-rate per second (Poisson; default:
all at once). Prompts are words drawn from a fixed list with --seed, cut to
--input-len tokens as the server's /tokenize counts them (baton's, vLLM's and
SGLang's shape; a server without it gets --input-len words, about one token each
in the usual vocabularies); the report gives the mean input tokens the server
counted. Works against any OpenAI-compatible server: baton, vLLM, SGLang,
llama-server.

Prints request and token throughput and TTFT, TPOT, inter-token and end-to-end
latency at mean, p50, p90 and p99; --json prints the same as one JSON object.
Exits non-zero when any request failed, unless --allow-failures (then only when
none succeeded).`,
		Example: `  baton bench serve --url http://127.0.0.1:8000 --concurrency 8 --num-prompts 200 --input-len 256 --output-len 128`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if temperature >= 0 {
				cfg.Temperature = &temperature
			}
			out := cmd.OutOrStdout()
			// The bar is for a person watching; it would corrupt --json or a
			// log that stdout is piped into.
			if f, ok := out.(*os.File); ok && progress && term.IsTerminal(int(f.Fd())) {
				bar := progressbar.NewOptions(cfg.NumPrompts, progressbar.OptionSetWriter(out),
					progressbar.OptionSetDescription("requests"), progressbar.OptionShowCount(),
					progressbar.OptionClearOnFinish(), progressbar.OptionSetPredictTime(true))
				cfg.Progress = func(done, _ int) { _ = bar.Set(done) }
			}
			// Ctrl-C stops the run: requests in flight are cancelled, and
			// a partial report would mix cut streams into the figures.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			rep, runErr := bench.Run(ctx, cfg)
			if rep == nil {
				return runErr
			}
			if err := writeReport(out, rep, asJSON); err != nil {
				return err
			}
			if runErr == nil && rep.Failed > 0 && !allowFailures {
				// Figures over the requests that happened to succeed can
				// flatter an overloaded server: a failed request fails the run.
				return fmt.Errorf("%d of %d requests failed (--allow-failures to accept the figures of the rest)", rep.Failed, rep.Failed+rep.Completed)
			}
			return runErr
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8000", "server base URL (a trailing /v1 is fine)")
	fs.StringVar(&cfg.Model, "model", "", "model name to request (default: the first of the server's /v1/models)")
	fs.IntVar(&cfg.Concurrency, "concurrency", 1, "most requests in flight at once")
	fs.IntVar(&cfg.NumPrompts, "num-prompts", 100, "requests to send in all")
	fs.IntVar(&cfg.WarmupRequests, "warmup-requests", 1, "requests sent first, of the same lengths, and left out of the figures (a server's first requests carry one-time work); 0: none")
	fs.IntVar(&cfg.InputLen, "input-len", 128, "prompt length in tokens, as the server's /tokenize counts them (a server without it: words, about one token each)")
	fs.IntVar(&cfg.OutputLen, "output-len", 128, "tokens to generate per request (max_tokens, with ignore_eos)")
	fs.Float64Var(&cfg.RequestRate, "request-rate", 0, "mean requests per second, Poisson arrivals (0: all at once)")
	fs.StringVar(&cfg.APIKey, "api-key", "", "bearer key to send")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed for prompts and arrival times")
	fs.IntVar(&cfg.SharedPrefixLen, "shared-prefix-len", 0, "start each prompt with one of --num-prefixes shared prefixes of this many words (SGLang's generated-shared-prefix workload); --input-len words follow")
	fs.IntVar(&cfg.NumPrefixes, "num-prefixes", 1, "how many distinct shared prefixes, used in turn")
	fs.BoolVar(&cfg.Echo, "echo", false, "input-echoing workload (edit or summarise a given text): each prompt is its --input-len text, an instruction to repeat it word for word, and the repeat's first words; the report adds the server's speculative accept figures when it exposes them")
	fs.Float64Var(&temperature, "temperature", -1, "temperature sent with every request (0: greedy, as SGLang's and vLLM's benchmarks send); -1: none, the server's default")
	fs.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fs.BoolVar(&progress, "progress", true, "show a progress bar when stdout is a terminal")
	fs.BoolVar(&allowFailures, "allow-failures", false, "exit 0 when some requests failed (the report counts them)")
	return cmd
}

func writeReport(w io.Writer, rep *bench.Report, asJSON bool) error {
	if !asJSON {
		return rep.WriteText(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(rep); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}
