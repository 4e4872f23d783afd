package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/bench"
	"github.com/batonlm/baton/test/harness"
)

// TestBenchAgainstStandalone runs the load generator against a real
// server: streamed completions with usage and ignore_eos must come back
// whole, so that every request yields exactly --output-len tokens.
func TestBenchAgainstStandalone(t *testing.T) {
	s := startServer(t, "--api-key", "bench-key")
	const n, out = 8, 12
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := bench.Run(ctx, bench.Config{URL: s.URL, APIKey: "bench-key", Concurrency: 4, NumPrompts: n, InputLen: 16, OutputLen: out, Seed: 1})
	if err != nil {
		t.Fatalf("%v (report %+v)", err, rep)
	}
	if rep.Completed != n || rep.Failed != 0 {
		t.Fatalf("completed %d, failed %d: %+v", rep.Completed, rep.Failed, rep.Errors)
	}
	if rep.Model != "stories260K" {
		t.Errorf("model %q, want the server's own name from /v1/models", rep.Model)
	}
	if !rep.UsageReported || rep.TotalOutputTokens != n*out {
		t.Errorf("usage %v, output tokens %d, want %d (ignore_eos makes every request generate max_tokens)", rep.UsageReported, rep.TotalOutputTokens, n*out)
	}
	// --input-len is tokens as the server counts them: stories260K's
	// 512-token vocabulary splits a word into about three, so each prompt
	// is cut to the most words that make 16 tokens or fewer (a word more
	// would pass 16, and no word is more than a few tokens).
	if !rep.PromptsMeasured || rep.TotalInputTokens > n*16 || rep.MeanInputTokens < 12 {
		t.Errorf("measured %v, input tokens %d (mean %.1f) for %d prompts of 16 tokens", rep.PromptsMeasured, rep.TotalInputTokens, rep.MeanInputTokens, n)
	}
	// One gap per text chunk after the first: a token that ends inside a
	// UTF-8 character (stories260K has byte tokens) shares its chunk with
	// the next, and which tokens come out can vary with batching, so at
	// most out-1 gaps per request, and most of them.
	if rep.ITL.N > n*(out-1) || rep.ITL.N < n*(out-1)*3/4 || rep.TTFT.N != n || rep.TTFT.P50 <= 0 || rep.E2E.P50 < rep.TTFT.P50 {
		t.Errorf("latencies: TTFT %+v ITL %+v E2E %+v", rep.TTFT, rep.ITL, rep.E2E)
	}
	if rep.MaxConcurrentRequests != 4 || rep.OutputThroughput <= 0 {
		t.Errorf("concurrency %d, output throughput %v", rep.MaxConcurrentRequests, rep.OutputThroughput)
	}
}

// TestBenchCommand runs `baton bench serve --json` as a user would.
func TestBenchCommand(t *testing.T) {
	s := startServer(t)
	got, err := runCommand(context.Background(), 60*time.Second, repoRoot(t), cleanEnv(), batonBinary(t),
		"bench", "serve", "--url", s.URL, "--num-prompts", "3", "--concurrency", "3", "--input-len", "8", "--output-len", "4", "--json")
	if err != nil {
		if strings.Contains(got, `unknown command "bench"`) {
			t.Fatal("baton has no bench command: cmd/baton/main.go must register it with root.AddCommand(benchCmd())")
		}
		t.Fatal(err)
	}
	var rep bench.Report
	// The binary logs nothing on stdout, but runCommand mixes in stderr:
	// the report is the JSON object from the first brace on.
	if i := strings.Index(got, "{"); i >= 0 {
		got = got[i:]
	}
	if err := json.Unmarshal([]byte(got), &rep); err != nil {
		t.Fatalf("not a JSON report: %v\n%s", err, got)
	}
	if rep.Completed != 3 || rep.TotalOutputTokens != 12 {
		t.Errorf("report %+v", rep)
	}
}

// BenchmarkSharedPrefix is SGLang's generated-shared-prefix workload on a
// standalone server, with the prefix cache and without: 16 requests whose
// prompts share one prefix of 1,500 tokens, each with 64 tokens of its
// own and 32 generated tokens, 4 at a time, on a
// random-weight llama of 512x8. It reports TTFT p50, output throughput and
// the input tokens read from the cache; run it with make bench-prefix.
func BenchmarkSharedPrefix(b *testing.B) {
	cfg := filepath.Join(b.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"architectures":["LlamaForCausalLM"],"vocab_size":512,"hidden_size":512,"num_hidden_layers":8,
"num_attention_heads":8,"num_key_value_heads":8,"intermediate_size":1408,"max_position_embeddings":4096,"rms_norm_eps":1e-5}`), 0o644); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		flags []string
	}{{"cache", nil}, {"no-cache", []string{"--disable-radix-cache"}}} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				s := harness.Start(b, append([]string{"--model", cfg, "--load-format", "dummy", "--served-model-name", "dummy"}, tc.flags...)...)
				rep, err := bench.Run(context.Background(), bench.Config{URL: s.URL, Concurrency: 4, NumPrompts: 16, InputLen: 64, OutputLen: 32,
					SharedPrefixLen: 1500, NumPrefixes: 1, Seed: 1})
				if err != nil || rep.Failed > 0 {
					b.Fatalf("%v: %+v", err, rep)
				}
				b.ReportMetric(rep.TTFT.P50, "ttft-p50-ms")
				b.ReportMetric(rep.OutputThroughput, "out-tok/s")
				b.ReportMetric(float64(rep.TotalCachedTokens), "cached-tokens")
				if err := s.Stop(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkHiCache measures the hierarchical cache on SGLang's
// generated-shared-prefix workload: 16 prefixes of 1,000 tokens, used in
// turn by 48 requests (each prefix three times; 32 tokens of their own, 8
// generated), one at a time, on the random-weight llama of
// BenchmarkSharedPrefix. Three standalone servers: an L1 (KV pool) that
// holds about a tenth of the prefixes' working set with a 1 GiB L2 behind
// it, an L1 big enough for all of it, and no cache (every prefix
// recomputed). It reports each one's TTFT p50 and the ratios of the tiered
// one to the others (the targets: within 1.5x of the big L1, at most 0.3x
// of recomputing); run it with make bench-hicache.
func BenchmarkHiCache(b *testing.B) {
	cfg := filepath.Join(b.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"architectures":["LlamaForCausalLM"],"vocab_size":512,"hidden_size":512,"num_hidden_layers":8,
"num_attention_heads":8,"num_key_value_heads":8,"intermediate_size":1408,"max_position_embeddings":4096,"rms_norm_eps":1e-5}`), 0o644); err != nil {
		b.Fatal(err)
	}
	const prefixes, prefixLen = 16, 1000
	runs := []struct {
		name  string
		flags []string
	}{
		{"tiered", []string{"--max-total-tokens", "1600", "--hicache-size", "1"}},
		{"big-l1", []string{"--max-total-tokens", "20000"}},
		{"recompute", []string{"--max-total-tokens", "20000", "--disable-radix-cache"}},
	}
	for range b.N {
		p50 := map[string]float64{}
		for _, r := range runs {
			s := harness.Start(b, append([]string{"--model", cfg, "--load-format", "dummy", "--served-model-name", "dummy"}, r.flags...)...)
			rep, err := bench.Run(context.Background(), bench.Config{URL: s.URL, Concurrency: 1, NumPrompts: 3 * prefixes, InputLen: 32, OutputLen: 8,
				SharedPrefixLen: prefixLen, NumPrefixes: prefixes, Seed: 1})
			if err != nil || rep.Failed > 0 {
				b.Fatalf("%s: %v: %+v", r.name, err, rep)
			}
			p50[r.name] = rep.TTFT.P50
			b.ReportMetric(rep.TTFT.P50, r.name+"-ttft-p50-ms")
			b.ReportMetric(float64(rep.TotalCachedTokens), r.name+"-cached-tokens")
			if r.name == "tiered" {
				m := harness.Metrics(b, s)
				b.ReportMetric(m[`baton_hicache_hit_pages_total{role="standalone",tier="l2"}`], "tiered-l2-hit-pages")
				if m["baton_kv_read_before_ready_total"] != 0 {
					b.Fatalf("read before ready: %v", m["baton_kv_read_before_ready_total"])
				}
			}
			if err := s.Stop(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(p50["tiered"]/p50["big-l1"], "tiered/big-l1")
		b.ReportMetric(p50["tiered"]/p50["recompute"], "tiered/recompute")
	}
}

// TestBenchCalibrate measures a real router + prefill + decode as a user
// would, writes the planner's capacity file, and the simulator reads it:
// prefill's tokens/s and a decode step's time come out positive, and the
// decode bounds are the ones given.
func TestBenchCalibrate(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1})
	file := filepath.Join(t.TempDir(), "capacity.json")
	if out, err := runCommand(context.Background(), 120*time.Second, repoRoot(t), cleanEnv(), batonBinary(t),
		"bench", "calibrate", "--url", c.Router.URL, "--prompt-lens", "16,440", "--batches", "1,4", "--per", "3",
		"--input-len", "32", "--output-len", "16", "--decode-max-batch", "48", "--kv-tokens", "4096", "--out", file); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var capa struct {
		PrefillTokensPerSec float64 `json:"prefill_tokens_per_sec"`
		DecodeStepBase      string  `json:"decode_step_base"`
		DecodeMaxBatch      int     `json:"decode_max_batch"`
		KVTokens            int     `json:"kv_tokens"`
	}
	if err := json.Unmarshal(b, &capa); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	if base, err := time.ParseDuration(capa.DecodeStepBase); err != nil || base <= 0 || capa.PrefillTokensPerSec <= 0 ||
		capa.DecodeMaxBatch != 48 || capa.KVTokens != 4096 {
		t.Fatalf("capacity %s", b)
	}
	if m := metricsOf(t, c.Decode[0]); m["baton_kv_reservations_total"] == 0 {
		t.Error("the prompts were not handed over: calibrate measured no prefill worker")
	}
	out, err := runCommand(context.Background(), 60*time.Second, repoRoot(t), cleanEnv(), batonBinary(t),
		"sim", "--planner-capacity", file, "--trace", "poisson", "--duration", "10s", "--rate", "2", "--json")
	if err != nil || !strings.Contains(out, `"Requests"`) {
		t.Fatalf("sim on the measured capacity: %v\n%s", err, out)
	}
}
