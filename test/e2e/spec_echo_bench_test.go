package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/internal/bench"
	"github.com/batonlm/baton/internal/model/copymodel"
	"github.com/batonlm/baton/test/harness"
)

// copyModel is a copymodel checkpoint of shape s, written once under the
// temporary directory and reused by later runs (the 1.1B one is 2.2 GB).
func copyModel(b *testing.B, name string, s copymodel.Shape) string {
	b.Helper()
	dir := filepath.Join(os.TempDir(), "baton-copymodel-"+name+"-v1")
	done := filepath.Join(dir, "complete")
	if _, err := os.Stat(done); err == nil {
		return dir
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := copymodel.Write(dir, s, 1); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		b.Fatal(err)
	}
	return dir
}

// BenchmarkSpecEcho measures ngram speculative decoding where it is meant
// to pay: greedy `bench serve --echo` requests (a text of 128 tokens, an
// instruction to repeat it, the repeat's first words) on models whose
// weights are constructed to copy their input (internal/model/copymodel:
// an induction circuit in two layers of the 134M and TinyLlama 1.1B
// shapes; the other layers add zero but cost what they cost). Their
// accept rate is near 1, so these figures are what verification costs and
// gives at a high accept rate on real shapes, not a trained model's
// accept rate. Generations stop at 112 tokens, short of the spec guard's
// 128; the guard-256 case generates 256 with the guard at its defaults,
// to show whether its loop rule stops a healthy echo. Run it with make
// bench-spec-echo.
func BenchmarkSpecEcho(b *testing.B) {
	tok := filepath.Join(repoRoot(b), "testdata", "vocab", "ggml-vocab-llama-spm.gguf")
	ngram := []string{"--speculative-algorithm", "ngram"}
	greedy := 0.0
	for _, tc := range []struct {
		name                  string
		model                 string
		shape                 copymodel.Shape
		streams, prompts, out int
		flags                 []string
	}{
		{"134M/streams=1/off", "134m", copymodel.Shape134M, 1, 4, 112, nil},
		{"134M/streams=1/ngram", "134m", copymodel.Shape134M, 1, 4, 112, ngram},
		{"134M/streams=32/off", "134m", copymodel.Shape134M, 32, 32, 112, nil},
		{"134M/streams=32/ngram", "134m", copymodel.Shape134M, 32, 32, 112, ngram},
		{"134M/streams=32/ngram-no-backoff", "134m", copymodel.Shape134M, 32, 32, 112, append(ngram, "--speculative-disable-by-batch-size", "0")},
		{"134M/guard-256/ngram", "134m", copymodel.Shape134M, 1, 2, 256, ngram},
		{"1.1B/streams=1/off", "1.1b", copymodel.Shape1B, 1, 2, 112, nil},
		{"1.1B/streams=1/ngram", "1.1b", copymodel.Shape1B, 1, 2, 112, ngram},
	} {
		b.Run(tc.name, func(b *testing.B) {
			dir := copyModel(b, tc.model, tc.shape)
			for range b.N {
				s := harness.Start(b, append([]string{"--model", dir, "--tokenizer", tok, "--served-model-name", "copy"}, tc.flags...)...)
				rep, err := bench.Run(context.Background(), bench.Config{URL: s.URL, Concurrency: tc.streams, NumPrompts: tc.prompts,
					InputLen: 128, OutputLen: tc.out, Echo: true, Temperature: &greedy, Seed: 1})
				// The guard-256 case may end every request with
				// spec_anomaly: that is its figure, not a failure.
				if err != nil && (rep == nil || rep.Failed == 0 || tc.out <= 128) {
					b.Fatalf("%v: %+v", err, rep)
				}
				m := harness.Metrics(b, s)
				b.ReportMetric(rep.OutputThroughput, "out-tok/s")
				b.ReportMetric(rep.SpecAcceptRate, "accept-rate")
				if n := m["baton_spec_accept_length_count"]; n > 0 {
					b.ReportMetric(m["baton_spec_accept_length_sum"]/n, "accept-len")
				}
				b.ReportMetric(m["baton_spec_anomalies_total"], "spec-anomalies")
				b.ReportMetric(float64(rep.Failed), "failed")
				if rep.Failed > 0 {
					b.Logf("%d of %d requests failed: %+v", rep.Failed, tc.prompts, rep.Errors)
				}
				if err := s.Stop(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
