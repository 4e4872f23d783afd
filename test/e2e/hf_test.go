package e2e

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// Hugging Face model directories served end to end: the stories260K
// checkpoint as safetensors (same tokens as the GGUF, standalone and PD),
// and Qwen3/Qwen2-shaped models with random weights and the real Qwen3
// tokenizer, asked for chat completions.

// storiesHFDir is the absolute path of the HF copy of stories260K.
func storiesHFDir(t *testing.T) string {
	return filepath.Join(repoRoot(t), "testdata", "stories260K-hf")
}

// startHFCluster starts a router with one prefill and one decode worker,
// all three given args, so that the router loads the same model
// directory's tokenizer as the workers.
func startHFCluster(t *testing.T, args ...string) *harness.Cluster {
	t.Helper()
	return harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: args, RouterArgs: args})
}

// The safetensors copy of stories260K gives the public reference token for
// token, standalone and through router + prefill + decode.
func TestHFStoriesGreedyReference(t *testing.T) {
	ref := loadReference(t)
	args := []string{"--model", storiesHFDir(t), "--served-model-name", "stories260K"}
	t.Run("standalone", func(t *testing.T) {
		s := startServer(t, append([]string{"--kv-poison", "--page-size", "4", "--chunked-prefill-size", "3"}, args...)...)
		code, _, body := post(t, s.URL+"/v1/completions", greedyBody(ref))
		var c completion
		if err := json.Unmarshal(body, &c); err != nil || code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		checkGreedy(t, ref, c)
		waitPagesFree(t, s)
	})
	t.Run("pd", func(t *testing.T) {
		cl := startHFCluster(t, args...)
		code, _, body := post(t, cl.Router.URL+"/v1/completions", greedyBody(ref))
		var c completion
		if err := json.Unmarshal(body, &c); err != nil || code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		checkGreedy(t, ref, c)
		cl.WaitClean(t)
	})
}

// hfShape is a small model with random weights, written as a Hugging Face
// directory next to a real tokenizer.
type hfShape struct {
	arch, modelType                            string
	vocab, dim, layers, heads, kvHeads, hd, ff int
	tie, qkvBias, qkNorm                       bool
	dtype                                      string // BF16 or F16

	rng     *rand.Rand
	tensors []stEntry
	data    []byte
}

type stEntry struct {
	name  string
	shape []int
	begin int
}

func (h *hfShape) put(name string, shape []int, center, amp float64) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	h.tensors = append(h.tensors, stEntry{name, shape, len(h.data)})
	for i := 0; i < n; i++ {
		v := float32(center + amp*(2*h.rng.Float64()-1))
		var bits uint16
		if h.dtype == "BF16" {
			bits = uint16(math.Float32bits(v) >> 16)
		} else {
			bits = f16(v)
		}
		h.data = binary.LittleEndian.AppendUint16(h.data, bits)
	}
}

// f16 converts to IEEE half by truncation (values here are small and normal).
func f16(v float32) uint16 {
	b := math.Float32bits(v)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23&0xff) - 127 + 15
	if exp <= 0 {
		return sign
	}
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

// write lays out config.json, generation_config.json, model.safetensors
// and copies of the tokenizer files into dir.
func (h *hfShape) write(t *testing.T, dir string) {
	t.Helper()
	h.rng = rand.New(rand.NewPCG(11, 12))
	mat := func(name string, rows, cols int) { h.put(name, []int{rows, cols}, 0, 1/math.Sqrt(float64(cols))) }
	qd, kvd := h.heads*h.hd, h.kvHeads*h.hd
	mat("model.embed_tokens.weight", h.vocab, h.dim)
	h.put("model.norm.weight", []int{h.dim}, 1, 0.1)
	if !h.tie {
		mat("lm_head.weight", h.vocab, h.dim)
	}
	for l := 0; l < h.layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		h.put(p+"input_layernorm.weight", []int{h.dim}, 1, 0.1)
		h.put(p+"post_attention_layernorm.weight", []int{h.dim}, 1, 0.1)
		mat(p+"self_attn.q_proj.weight", qd, h.dim)
		mat(p+"self_attn.k_proj.weight", kvd, h.dim)
		mat(p+"self_attn.v_proj.weight", kvd, h.dim)
		mat(p+"self_attn.o_proj.weight", h.dim, qd)
		mat(p+"mlp.gate_proj.weight", h.ff, h.dim)
		mat(p+"mlp.up_proj.weight", h.ff, h.dim)
		mat(p+"mlp.down_proj.weight", h.dim, h.ff)
		if h.qkvBias {
			h.put(p+"self_attn.q_proj.bias", []int{qd}, 0, 0.3)
			h.put(p+"self_attn.k_proj.bias", []int{kvd}, 0, 0.3)
			h.put(p+"self_attn.v_proj.bias", []int{kvd}, 0, 0.3)
		}
		if h.qkNorm {
			h.put(p+"self_attn.q_norm.weight", []int{h.hd}, 1, 0.3)
			h.put(p+"self_attn.k_norm.weight", []int{h.hd}, 1, 0.3)
		}
	}
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	for i, e := range h.tensors {
		end := len(h.data)
		if i+1 < len(h.tensors) {
			end = h.tensors[i+1].begin
		}
		header[e.name] = map[string]any{"dtype": h.dtype, "shape": e.shape, "data_offsets": []int{e.begin, end}}
	}
	hb, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	var file bytes.Buffer
	file.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(hb))))
	file.Write(hb)
	file.Write(h.data)
	files := map[string][]byte{"model.safetensors": file.Bytes()}
	cfg := map[string]any{
		"architectures": []string{h.arch}, "model_type": h.modelType, "vocab_size": h.vocab, "hidden_size": h.dim,
		"num_hidden_layers": h.layers, "num_attention_heads": h.heads, "num_key_value_heads": h.kvHeads, "head_dim": h.hd,
		"intermediate_size": h.ff, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"tie_word_embeddings": h.tie, "hidden_act": "silu", "attention_bias": h.qkvBias, "bos_token_id": 151643, "eos_token_id": 151645,
	}
	gen := map[string]any{"bos_token_id": 151643, "eos_token_id": []int{151645, 151643}, "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95}
	for name, v := range map[string]any{"config.json": cfg, "generation_config.json": gen} {
		if files[name], err = json.Marshal(v); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(repoRoot(t), "testdata", "tokenizers", "qwen3")
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if files[name], err = os.ReadFile(filepath.Join(src, name)); err != nil {
			t.Fatal(err)
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

type chatResult struct {
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// chatHello asks for a greedy chat completion of the conversation that
// chat-template-cases.json records as case a (9 prompt tokens with the
// Qwen3 template and tokenizer).
func chatHello(t *testing.T, url string) chatResult {
	t.Helper()
	body := `{"model":"tiny-qwen","messages":[{"role":"user","content":"Hello"}],"max_tokens":12,"temperature":0,"ignore_eos":true}`
	code, _, b := post(t, url+"/v1/chat/completions", body)
	var r chatResult
	if err := json.Unmarshal(b, &r); err != nil || code != 200 || len(r.Choices) != 1 {
		t.Fatalf("chat completion: %d %s", code, b)
	}
	if r.Usage.PromptTokens != 9 {
		t.Fatalf("prompt has %d tokens; the Qwen3 template and tokenizer give 9 for this conversation", r.Usage.PromptTokens)
	}
	if r.Usage.CompletionTokens != 12 || r.Choices[0].Message.Role != "assistant" {
		t.Fatalf("completion: %+v", r)
	}
	return r
}

// Qwen3- and Qwen2-shaped directories with random weights (q/k norms and
// tied BF16 embeddings; q/k/v biases and F16) serve chat completions with
// the real Qwen3 tokenizer and chat template, standalone and in PD mode,
// with the same greedy answer both ways.
func TestHFQwenShapedChat(t *testing.T) {
	for _, shape := range []hfShape{
		{arch: "Qwen3ForCausalLM", modelType: "qwen3", vocab: 151936, dim: 64, layers: 2, heads: 4, kvHeads: 2, hd: 32, ff: 128, tie: true, qkNorm: true, dtype: "BF16"},
		{arch: "Qwen2ForCausalLM", modelType: "qwen2", vocab: 151936, dim: 64, layers: 2, heads: 4, kvHeads: 2, hd: 16, ff: 128, qkvBias: true, dtype: "F16"},
	} {
		t.Run(shape.modelType, func(t *testing.T) {
			dir := t.TempDir()
			shape.write(t, dir)
			args := []string{"--model", dir, "--served-model-name", "tiny-qwen", "--max-total-tokens", "4096"}
			s := startServer(t, append([]string{"--kv-poison"}, args...)...)
			want := chatHello(t, s.URL)
			cl := startHFCluster(t, args...)
			got := chatHello(t, cl.Router.URL)
			if got.Choices[0].Message.Content != want.Choices[0].Message.Content {
				t.Fatalf("PD answer %q, standalone %q", got.Choices[0].Message.Content, want.Choices[0].Message.Content)
			}
			waitPagesFree(t, s)
			cl.WaitClean(t)
		})
	}
}

// generation_config.json's sampling settings fill what a request leaves
// out, standalone and at the router: top_k 1 there makes a request with no
// sampling fields greedy, so it returns the reference; a request that sets
// top_k itself keeps its own.
func TestGenerationConfigDefaults(t *testing.T) {
	dir := t.TempDir()
	src := storiesHFDir(t)
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "generation_config.json" {
			b = []byte(`{"bos_token_id": 1, "eos_token_id": 2, "do_sample": true, "top_k": 1, "max_new_tokens": 64}`)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ref := loadReference(t)
	name := filepath.Base(dir)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: []string{"--model", dir}, RouterArgs: []string{"--model", dir}})
	sa := startServer(t, "--model", dir)
	for _, url := range []string{sa.URL, c.Router.URL} {
		code, _, body := post(t, url+"/v1/completions", `{"model":"`+name+`","prompt":"Once upon a time"}`)
		var got completion
		if err := json.Unmarshal(body, &got); err != nil || code != 200 || got.Choices[0].Text != ref.GeneratedText {
			t.Fatalf("%s: a request without sampling fields did not follow generation_config (greedy, 64 tokens): %d %s", url, code, body)
		}
		diverged := false
		for seed := 1; seed <= 3 && !diverged; seed++ {
			_, _, body = post(t, url+"/v1/completions", `{"model":"`+name+`","prompt":"Once upon a time","top_k":0,"temperature":1.5,"seed":`+strconv.Itoa(seed)+`}`)
			_ = json.Unmarshal(body, &got)
			diverged = len(got.Choices) == 1 && got.Choices[0].Text != ref.GeneratedText
		}
		if !diverged {
			t.Fatalf("%s: a request's own top_k was overridden by generation_config", url)
		}
	}
}
