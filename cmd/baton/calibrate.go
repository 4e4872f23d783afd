package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/batonlm/baton/internal/bench"
	"github.com/batonlm/baton/internal/planner"
)

// benchCalibrateCmd measures one worker of each role behind a router and
// writes the planner's capacity file (--planner-capacity).
func benchCalibrateCmd() *cobra.Command {
	var (
		url, apiKey, out         string
		promptLens, batches      []int
		inputLen, outputLen, per int
		maxBatch, kvTokens       int
	)
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Measure a router's prefill and decode workers and write the planner's capacity file",
		Long: `Measure what one prefill and one decode worker do, through a router that has one
of each and hands every prompt over (--disagg-prefill-threshold 0, or --prompt-lens
past its threshold), and print the capacity file the router's --planner and baton
plan and sim read (--planner-capacity).

Prefill: one request at a time at each of --prompt-lens (1 output token); the time
to first token against the prompt length is a line whose slope is the time per
prompt token and whose intercept the cost of a request besides (the handoff
included). Decode: --per waves of each of --batches requests at once, prompts of
--input-len tokens and --output-len tokens out; the time per output token against
the batch is a line whose intercept and slope are a decode step's base time and its
time per sequence. Give --input-len and --output-len the sizes of the traffic the
planner is to size for: a step's time grows with the context its batch attends over.
--decode-max-batch and --kv-tokens are the decode worker's --max-running-requests
and pool, which the measurements do not show.`,
		Example: `  baton bench calibrate --url http://127.0.0.1:8000 --out capacity.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			c := planner.Calibration{DecodeMaxBatch: maxBatch, KVTokens: kvTokens}
			greedy := 0.0
			run := func(conc, prompts, in, outLen int) (*bench.Report, error) {
				rep, err := bench.Run(ctx, bench.Config{URL: url, APIKey: apiKey, Concurrency: conc, NumPrompts: prompts,
					InputLen: in, OutputLen: outLen, Temperature: &greedy})
				if err == nil && rep.Failed > 0 {
					err = fmt.Errorf("%d of %d requests failed", rep.Failed, prompts)
				}
				return rep, err
			}
			for _, n := range promptLens {
				rep, err := run(1, per, n, 1)
				if err != nil {
					return fmt.Errorf("prefill at %d tokens: %w", n, err)
				}
				c.TTFT = append(c.TTFT, planner.Point{X: rep.MeanInputTokens, Y: ms(rep.TTFT.Mean)})
				fmt.Fprintf(cmd.ErrOrStderr(), "prefill: %.0f prompt tokens, TTFT mean %.2f ms\n", rep.MeanInputTokens, rep.TTFT.Mean)
			}
			for _, b := range batches {
				rep, err := run(b, per*b, inputLen, outputLen)
				if err != nil {
					return fmt.Errorf("decode at %d at once: %w", b, err)
				}
				c.TPOT = append(c.TPOT, planner.Point{X: float64(b), Y: ms(rep.TPOT.Mean)})
				fmt.Fprintf(cmd.ErrOrStderr(), "decode: %d at once, TPOT mean %.3f ms\n", b, rep.TPOT.Mean)
			}
			capa, err := c.Capacity()
			if err != nil {
				return err
			}
			return writeCapacity(cmd.OutOrStdout(), out, capa)
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "http://127.0.0.1:8000", "router (or standalone server) base URL")
	f.StringVar(&apiKey, "api-key", "", "bearer key to send")
	f.StringVar(&out, "out", "", "file to write the capacity to (default: standard output)")
	f.IntSliceVar(&promptLens, "prompt-lens", []int{32, 256}, "prompt lengths in tokens of the prefill measurements (at least two)")
	f.IntSliceVar(&batches, "batches", []int{1, 8, 32}, "requests at once of the decode measurements (at least two)")
	f.IntVar(&inputLen, "input-len", 128, "prompt length in tokens of the decode measurements")
	f.IntVar(&outputLen, "output-len", 64, "tokens generated per request in the decode measurements")
	f.IntVar(&per, "per", 2, "requests per prefill measurement, waves per decode measurement")
	f.IntVar(&maxBatch, "decode-max-batch", measuredCapacity.DecodeMaxBatch, "the decode worker's --max-running-requests")
	f.IntVar(&kvTokens, "kv-tokens", measuredCapacity.KVTokens, "the decode worker's KV pool in tokens")
	return cmd
}

// ms is a report's milliseconds as a duration.
func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// writeCapacity writes c as --planner-capacity reads it, to path or, when
// path is empty, to w.
func writeCapacity(w io.Writer, path string, c planner.Capacity) error {
	b, err := json.MarshalIndent(capacityJSON{
		PrefillTokensPerSec: c.PrefillTokensPerSec, PrefillOverhead: c.PrefillOverhead.String(), Handoff: c.Handoff.String(),
		DecodeStepBase: c.DecodeStepBase.String(), DecodeStepPerSeq: c.DecodeStepPerSeq.String(),
		DecodeMaxBatch: c.DecodeMaxBatch, KVTokens: c.KVTokens}, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if path == "" {
		_, err = w.Write(b)
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
