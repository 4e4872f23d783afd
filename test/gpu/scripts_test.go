package gpu

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// TestServeBenchAndTable runs test/gpu/serve-bench.sh as run.sh does, on
// the cpu backend with a small model of the Qwen3 tokenizer's vocabulary,
// then test/gpu/table.sh over its reports and over benchmark lines in the
// form the GPU steps print: the two scripts a GPU run ends with work
// before a GPU machine runs them, and the table's limits follow from the
// copy bandwidth.
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
	cmd := exec.Command("bash", "serve-bench.sh", bin, out)
	cmd.Env = append(os.Environ(), "MODEL="+cfg, "DEVICE=cpu", "DTYPE=f32", "INPUT_LEN=32", "OUTPUT_LEN=8", "PROMPTS=4", "PD_MEM=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("serve-bench.sh: %v\n%s", err, b)
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
	b, err := exec.Command("bash", "table.sh", out).CombinedOutput()
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
}
