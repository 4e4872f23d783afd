package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/batonlm/baton/internal/model/hftest"
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

// writeQwenShaped writes a small model with random weights (hftest) as a
// Hugging Face directory, with a generation_config.json and the real
// Qwen3 tokenizer files.
func writeQwenShaped(t *testing.T, dir string, spec hftest.Spec) {
	t.Helper()
	hftest.Write(t, dir, spec, 11)
	hftest.WriteJSON(t, filepath.Join(dir, "generation_config.json"), map[string]any{"bos_token_id": 151643,
		"eos_token_id": []int{151645, 151643}, "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95})
	src := filepath.Join(repoRoot(t), "testdata", "tokenizers", "qwen3")
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
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
	for _, spec := range []hftest.Spec{
		{Arch: "Qwen3ForCausalLM", Vocab: 151936, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 128, Tie: true, DType: "BF16"},
		{Arch: "Qwen2ForCausalLM", Vocab: 151936, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 128, DType: "F16"},
	} {
		t.Run(spec.ModelType(), func(t *testing.T) {
			dir := t.TempDir()
			writeQwenShaped(t, dir, spec)
			args := []string{"--model", dir, "--served-model-name", "tiny-qwen"}
			pool := []string{"--max-total-tokens", "4096"} // the router holds no pool and refuses it
			s := startServer(t, append([]string{"--kv-poison"}, append(args, pool...)...)...)
			want := chatHello(t, s.URL)
			cl := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: append(args, pool...), RouterArgs: args})
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
