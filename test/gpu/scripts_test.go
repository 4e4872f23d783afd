package gpu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// TestServeBenchAndTable runs test/gpu/serve-bench.sh as run.sh does, on
// the cpu backend with a small model of the Qwen3 tokenizer's vocabulary
// (standalone and PD over tcp, TTFT runs at two prompt lengths with
// decode's handoff counters, the cuda-ipc runs skipped with a line saying
// so) and a small llama of the Llama SPM vocabulary in f32 and q4_k_m,
// then test/gpu/table.sh over its reports and over benchmark lines in the
// form the GPU steps print: the two scripts a GPU run ends with work
// before a GPU machine runs them, and the table's limits follow from the
// copy bandwidth. A second table over made-up reports checks the
// arithmetic of the TTFT overhead, handoff and synth-1b rows.
func TestServeBenchAndTable(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("curl is not installed (make test installs it: deploy/local/deps.sh test)")
	}
	bin := harness.Binary(t)
	out := t.TempDir()
	cfg := filepath.Join(out, "tiny.json")
	if err := os.WriteFile(cfg, []byte(`{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 64,
 "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
 "vocab_size": 151936, "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
 "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 151643, "eos_token_id": 151645}`), 0o644); err != nil {
		t.Fatal(err)
	}
	synth := filepath.Join(out, "synth.json")
	if err := os.WriteFile(synth, []byte(`{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
 "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
 "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-05, "rope_theta": 10000,
 "tie_word_embeddings": false, "hidden_act": "silu"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	lens := []string{"TTFT_LENS=16 64", "SYNTH_DTYPES=f32 q4_k_m"}
	cmd := exec.Command("bash", "serve-bench.sh", bin, out)
	cmd.Env = append(append(os.Environ(), "MODEL="+cfg, "DEVICE=cpu", "DTYPE=f32", "INPUT_LEN=32", "OUTPUT_LEN=8", "PROMPTS=4", "PD_MEM=",
		"TTFT_PROMPTS=3", "SYNTH_MODEL="+synth), lens...)
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("serve-bench.sh: %v\n%s", err, b)
	}
	if !strings.Contains(string(b), "served: the cuda-ipc runs skipped: cuda-ipc needs both workers on --device cuda (DEVICE=cpu)") {
		t.Errorf("serve-bench.sh on cpu does not say it skipped cuda-ipc:\n%s", b)
	}
	logs := map[string]string{
		"bandwidth.log": "BenchmarkGPUAttentionDecode/bf16/seqs64/ctx4096/heads32-8/hd128-16 \t20\t123 ns/op\t3000 attn_GB/s\t4000 copy_GB/s\t1.5 attn/copy_read\t1.000 splits\n" +
			"BenchmarkGPUAttentionPrefill/bf16/prompt4096/heads32-8/hd64-16 \t20\t123 ns/op\t300.0 attn_TFLOP/s\t700.0 peak_TFLOP/s\t0.4286 attn/peak\n" +
			"BenchmarkGPUMatMul/peak/bf16-gemmex/8192x8192x8192-16 \t20\t1500000 ns/op\t750.0 TFLOP/s\n",
		"model.log": "BenchmarkGPUModel1B/decode/batch1/ctx512-16 \t3\t4600000 ns/op\t200.0 tok/s\n" +
			"BenchmarkGPUModel1B/prefill/batch1/prompt512-16 \t3\t5120000 ns/op\t100000 tok/s\t240.0 TFLOP/s\n" +
			"BenchmarkGPUModel1B/prefill/batch1/prompt4096-16 \t3\t30000000 ns/op\t136533 tok/s\t375.0 TFLOP/s\n",
	}
	for name, text := range logs {
		if err := os.WriteFile(filepath.Join(out, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tab := exec.Command("bash", "table.sh", out)
	tab.Env = append(os.Environ(), lens...)
	b, err = tab.CombinedOutput()
	if err != nil {
		t.Fatalf("table.sh: %v\n%s", err, b)
	}
	table := string(b)
	// 4000 GB/s over 2.48 GB of weights and 512 positions of bf16 K/V.
	for _, want := range []string{
		"| copy bandwidth (cuMemcpyDtoD, read + write) | 4000 GB/s |",
		"| decode step, dummy 1.24B f16, batch 1, ctx 512 | 200 tok/s | 1602 tok/s | 0.12 |",
		"| paged decode attention, bf16 KV, seqs64 x ctx4096, GQA 32/8, hd 128 | 3000 GB/s | read = copy | 1.50 |",
		// Prefill against the GemmEx peak of the same run.
		"| tensor-core peak (cuBLAS GemmEx, bf16, 8192³) | 750 TFLOP/s |",
		"| prefill, same model, 1 x 512 (goal 100000 tok/s) | 100000 tok/s, 240.0 TFLOP/s | peak 750 TFLOP/s | 0.32 |",
		"| prefill, same model, 1 x 4096 | 136533 tok/s, 375.0 TFLOP/s | peak 750 TFLOP/s | 0.50 |",
		"| prefill, same model, 32 x 128 | - tok/s, - TFLOP/s | peak 750 TFLOP/s | - |",
		"| prefill attention, bf16 KV, 1 x 4096, GQA 32/8, hd 64 (goal 0.5 of peak) | 300.0 TFLOP/s | peak 750 TFLOP/s | 0.40 |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for _, mode := range []string{"standalone", "pd"} {
		for _, c := range []string{"1", "32"} {
			line := "512 in / 128 out, " + mode + ", " + c + " stream(s) | "
			i := strings.Index(table, line)
			if i < 0 || strings.HasPrefix(table[i+len(line):], "-") {
				t.Errorf("no served figure for %s at %s streams:\n%s", mode, c, table)
			}
		}
	}
	// Measured on cpu: the rows are there with figures; the cuda-ipc ones
	// and their handoffs read "-".
	for _, want := range []string{
		"| PD TTFT p50 over standalone, tcp, 1 x 16 in, KV auto (bf16 on cuda) | ",
		"| PD TTFT p50 over standalone, tcp, 1 x 64 in, KV auto (bf16 on cuda) | ",
		"| KV handoff, tcp, 1 x 64 in: decode's bytes landed / transfer seconds (first page to Commit); a prompt's KV / TTFT overhead | ",
		"| served 32 streams, PD over tcp / standalone | ",
		"| served, dummy synth-1b (TinyLlama 1.1B shape) f32, 512 in / 128 out, standalone, 1 stream(s) | ",
		"| served, dummy synth-1b (TinyLlama 1.1B shape) q4_k_m, 512 in / 128 out, standalone, 32 stream(s) | ",
	} {
		i := strings.Index(table, want)
		if i < 0 || strings.HasPrefix(table[i+len(want):], "-") {
			t.Errorf("no figure in the row %q:\n%s", want, table)
		}
	}
	for _, want := range []string{
		"| PD TTFT p50 over standalone, cuda-ipc, 1 x 64 in, KV auto (bf16 on cuda) | - - ",
		"| served 32 streams, PD over cuda-ipc / standalone (goal >= 0.9) | - / ",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for _, l := range []string{"16", "64"} {
		kv, err := os.ReadFile(filepath.Join(out, "served-pd-ttft"+l+".kv"))
		// TTFT_PROMPTS and the one warm-up request: the table divides the
		// bytes by the handoffs counted, so each is a prompt's.
		if err != nil || !strings.Contains(string(kv), "handoffs 4\n") || strings.Contains(string(kv), "bytes 0\n") {
			t.Errorf("decode's counters around the tcp TTFT run at %s tokens: %v\n%s", l, err, kv)
		}
	}
	checkTableArithmetic(t)
}

// checkTableArithmetic runs table.sh over made-up reports of the GPU run's
// shape: 4000 GB/s of copy bandwidth (2000 GB/s for a copy's bytes), a PD
// TTFT 5 ms over standalone at 512 tokens over tcp with 58.7 MB of KV a
// prompt, 2 ms at 4096 over cuda-ipc with 469.8 MB, and a synth-1b run.
func checkTableArithmetic(t *testing.T) {
	out := t.TempDir()
	report := func(p50, tps float64) string {
		return fmt.Sprintf("{\n  \"output_throughput\": %g,\n  \"ttft_ms\": {\n    \"mean\": 1,\n    \"p50\": %g,\n    \"p90\": 1\n  }\n}\n", tps, p50)
	}
	files := map[string]string{
		"bandwidth.log":                      "BenchmarkGPUAttentionDecode/bf16/seqs64/ctx4096/heads32-8/hd128-16 \t20\t123 ns/op\t3000 attn_GB/s\t4000 copy_GB/s\t1.5 attn/copy_read\t1.000 splits\n",
		"served-standalone-ttft512-c1.json":  report(20, 100),
		"served-pd-ttft512-c1.json":          report(25, 100),
		"served-pd-ttft512.kv":               "bytes 293601280\nseconds 0.05\nhandoffs 5\n",
		"served-standalone-ttft4096-c1.json": report(100, 10),
		"served-pd-ipc-ttft4096-c1.json":     report(102, 10),
		"served-pd-ipc-ttft4096.kv":          "bytes 2348810240\nseconds 0.1\nhandoffs 5\n",
		"served-standalone-c32.json":         report(30, 3000),
		"served-pd-ipc-c32.json":             report(40, 2800),
		"served-pd-ipc-shipped.kv":           "device 1200\nhost 0\n",
		"served-synth-q4_k_m-c1.json":        report(5, 1200),
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(out, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := exec.Command("bash", "table.sh", out).CombinedOutput()
	if err != nil {
		t.Fatalf("table.sh: %v\n%s", err, b)
	}
	table := string(b)
	for _, want := range []string{
		// 58,720,256 bytes a prompt copied at 2000 GB/s: 0.029 ms; 5 ms
		// of overhead is 170 times that, 11.7 GB/s; decode's counters say
		// 293,601,280 bytes in 0.05 s.
		"| PD TTFT p50 over standalone, tcp, 1 x 512 in, KV auto (bf16 on cuda) (goal <= 10 ms) | 25.0 - 20.0 = 5.0 ms | KV 58.7 MB a prompt, copied in 0.03 ms | 170.30 |",
		"| KV handoff, tcp, 1 x 512 in: decode's bytes landed / transfer seconds (first page to Commit); a prompt's KV / TTFT overhead | 5.9 GB/s; 11.7 GB/s | copy / 2: 2000 GB/s | 0.00 |",
		"| PD TTFT p50 over standalone, cuda-ipc, 1 x 4096 in, KV auto (bf16 on cuda) | 102.0 - 100.0 = 2.0 ms | KV 469.8 MB a prompt, copied in 0.23 ms | 8.51 |",
		"| KV handoff, cuda-ipc, 1 x 4096 in: decode's bytes landed / transfer seconds (first page to Commit); a prompt's KV / TTFT overhead | 23.5 GB/s; 234.9 GB/s | copy / 2: 2000 GB/s | 0.01 |",
		"| PD TTFT p50 over standalone, cuda-ipc, 1 x 512 in, KV auto (bf16 on cuda) (goal <= 10 ms) | - - 20.0 = - ms | KV - MB a prompt, copied in - ms | - |",
		"| served 32 streams, PD over cuda-ipc / standalone (goal >= 0.9) | 2800 / 3000 tok/s | | 0.93 |",
		"| cuda-ipc pages shipped from the device / from host memory (goal: all from the device) | 1200 / 0 | | |",
		// 667,152,384 bytes a step of Q4_K and Q6_K at 4000 GB/s.
		"| served, dummy synth-1b (TinyLlama 1.1B shape) q4_k_m, 512 in / 128 out, standalone, 1 stream(s) | 1200 tok/s, TTFT p50 5.0 ms, ITL p50 - ms | 5996 tok/s (0.67 GB a step) | 0.20 |",
		// 2,068,840,448 bytes of f16.
		"| served, dummy synth-1b (TinyLlama 1.1B shape) f16, 512 in / 128 out, standalone, 32 stream(s) | - tok/s, TTFT p50 - ms, ITL p50 - ms | 61870 tok/s (2.07 GB a step) | - |",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}
