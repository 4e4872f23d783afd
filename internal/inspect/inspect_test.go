package inspect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestInspect(t *testing.T) {
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"", []string{"format:          gguf", "architecture:    llama (llama)", "parameters:      292,800", "F32 292,800", "context length:  512",
			"adjacent pairs", "loads:           yes", `SentencePiece-style BPE from gguf (llama), 512 tokens`, `bos:             1 "<s>" (added: true)`,
			`eos:             2 "</s>" (added: false)`, "chat template:   none"}},
		{"../../testdata/stories260K-hf", []string{"format:          safetensors (1 file(s): model.safetensors, 48 tensors, 1.1 MiB)",
			"architecture:    llama (LlamaForCausalLM)", "served name:     stories260K-hf", "parameters:      292,800", "rotate-half (neox)",
			"generation:      eos [2]", "loads:           yes", "from tokenizer.json (llama), 512 tokens", `bos:             1 "<s>" (added: true)`}},
		{"../../testdata/vocab/ggml-vocab-gpt-2.gguf", []string{"loads:           NO:", "byte-level BPE from gguf (gpt2), 50257 tokens"}},
	} {
		got, err := Inspect(tc.path)
		if err != nil {
			t.Fatalf("%q: %v", tc.path, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%q: no %q in\n%s", tc.path, w, got)
			}
		}
		t.Logf("%s", got)
	}
	if _, err := Inspect("no/such/file.gguf"); err == nil {
		t.Error("a missing file inspected")
	}
	// A Qwen3-shaped directory with the real tokenizer but no weights.
	dir := t.TempDir()
	cfg := `{"architectures":["Qwen3ForCausalLM"],"vocab_size":151936,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
		"num_key_value_heads":2,"head_dim":32,"intermediate_size":128,"max_position_embeddings":40960,"rope_theta":1000000,"tie_word_embeddings":true}`
	files := map[string][]byte{"config.json": []byte(cfg), "generation_config.json": []byte(`{"eos_token_id":[151645,151643],"temperature":0.6}`)}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join("../../testdata/tokenizers/qwen3", name))
		if err != nil {
			t.Fatal(err)
		}
		files[name] = b
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := Inspect(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"architecture:    qwen3 (Qwen3ForCausalLM)", "context length:  40960", "per-head q/k RMSNorm, tied embeddings",
		"generation:      eos [151645 151643], temperature 0.6", "loads:           NO: model: " + dir + " has no model.safetensors",
		"byte-level BPE from tokenizer.json (gpt2), 151669 tokens", "bos:             none (added: false)", `eos:             151645 "<|im_end|>"`,
		`151643 "<|endoftext|>", 151645 "<|im_end|>"`, "chat template:   yes"} {
		if !strings.Contains(got, w) {
			t.Errorf("no %q in\n%s", w, got)
		}
	}
}
