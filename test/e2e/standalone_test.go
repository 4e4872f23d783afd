package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	testref "github.com/batonlm/baton/test/reference"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
)

type reference = testref.Greedy

func loadReference(t *testing.T) reference { return testref.Load(t) }

type completion struct {
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []float64            `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// checkGreedy asserts a completion equals the public reference: the same
// text (so the same tokens) and top-5 logprobs within 1e-3 at every position.
func checkGreedy(t *testing.T, ref reference, c completion) {
	t.Helper()
	if len(c.Choices) != 1 {
		t.Fatalf("%d choices", len(c.Choices))
	}
	ch := c.Choices[0]
	if ch.Text != ref.GeneratedText {
		t.Fatalf("text %q\nwant %q", ch.Text, ref.GeneratedText)
	}
	if c.Usage.PromptTokens != 5 || c.Usage.CompletionTokens != len(ref.GeneratedIDs) || ch.FinishReason != "length" {
		t.Fatalf("usage %+v finish %q", c.Usage, ch.FinishReason)
	}
	lp := ch.Logprobs
	if lp == nil || len(lp.TokenLogprobs) != len(ref.Top5) {
		t.Fatalf("logprobs missing or short: %+v", lp)
	}
	for i, top := range ref.Top5 {
		if math.Abs(lp.TokenLogprobs[i]-top[0].Logprob) > 1e-3 {
			t.Fatalf("position %d: logprob %v, want %v", i, lp.TokenLogprobs[i], top[0].Logprob)
		}
		for _, alt := range top {
			got, ok := lp.TopLogprobs[i][alt.Token]
			if !ok || math.Abs(got-alt.Logprob) > 1e-3 {
				t.Fatalf("position %d: top logprob of %q = %v (present %v), want %v", i, alt.Token, got, ok, alt.Logprob)
			}
		}
	}
}

func greedyBody(ref reference) string {
	return fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0,"logprobs":5}`, ref.Prompt, len(ref.GeneratedIDs))
}

// The reference continuation comes out token for token with 8 requests in
// one batch, prefill chunks of 2 tokens, and pages of 1, 16 and 64 tokens.
func TestGreedyReferenceBatchedChunkedPaged(t *testing.T) {
	ref := loadReference(t)
	for _, page := range []string{"1", "16", "64"} {
		t.Run("page"+page, func(t *testing.T) {
			s := startServer(t, "--kv-poison", "--page-size", page, "--chunked-prefill-size", "2")
			var wg sync.WaitGroup
			results := make([]completion, 8)
			codes := make([]int, 8)
			for i := range results {
				wg.Add(1)
				go func() {
					defer wg.Done()
					code, _, body := post(t, s.URL+"/v1/completions", greedyBody(ref))
					codes[i] = code
					_ = json.Unmarshal(body, &results[i])
				}()
			}
			wg.Wait()
			for i := range results {
				if codes[i] != 200 {
					t.Fatalf("request %d: status %d", i, codes[i])
				}
				checkGreedy(t, ref, results[i])
			}
			waitPagesFree(t, s)
		})
	}
}

type sseResult struct {
	chunks []map[string]any
	text   string
	done   bool
}

// readSSE reads a whole event stream, checking each data line is JSON (or
// [DONE]) and each text piece is valid UTF-8.
func readSSE(t *testing.T, r io.Reader, chat bool) sseResult {
	t.Helper()
	var res sseResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("not an SSE data line: %q", line)
		}
		if data == "[DONE]" {
			res.done = true
			continue
		}
		if res.done {
			t.Fatal("data after [DONE]")
		}
		var ch map[string]any
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		res.chunks = append(res.chunks, ch)
		choices, _ := ch["choices"].([]any)
		for _, c := range choices {
			cm := c.(map[string]any)
			var piece string
			if chat {
				d, _ := cm["delta"].(map[string]any)
				piece, _ = d["content"].(string)
			} else {
				piece, _ = cm["text"].(string)
			}
			if !utf8.ValidString(piece) {
				t.Fatalf("chunk text is not valid UTF-8: %q", piece)
			}
			res.text += piece
		}
	}
	return res
}

func TestStreamingMatchesNonStreaming(t *testing.T) {
	ref := loadReference(t)
	s := startServer(t, "--kv-poison")
	for _, chat := range []bool{false, true} {
		path, body := "/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":40,"temperature":0`
		if chat {
			path, body = "/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":40,"temperature":0`
		}
		code, _, plain := post(t, s.URL+path, body+"}")
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, plain)
		}
		var whole struct {
			Choices []struct {
				Text    string                   `json:"text"`
				Message struct{ Content string } `json:"message"`
			} `json:"choices"`
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(plain, &whole); err != nil {
			t.Fatal(err)
		}
		want := whole.Choices[0].Text + whole.Choices[0].Message.Content
		resp, err := http.Post(s.URL+path, "application/json", strings.NewReader(body+`,"stream":true,"stream_options":{"include_usage":true}}`))
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("content type %q", ct)
		}
		res := readSSE(t, resp.Body, chat)
		resp.Body.Close()
		if !res.done || res.text != want || want == "" {
			t.Fatalf("%s: stream text %q (done %v), want %q", path, res.text, res.done, want)
		}
		if !chat && want != ref.GeneratedText[:len(want)] {
			t.Fatalf("greedy completion %q is not a prefix of the reference", want)
		}
		last := res.chunks[len(res.chunks)-1]
		usage, _ := last["usage"].(map[string]any)
		if usage == nil || int(usage["completion_tokens"].(float64)) != whole.Usage.CompletionTokens {
			t.Fatalf("%s: last chunk has no matching usage: %v", path, last)
		}
	}
}

func TestStopStringsAndSeeds(t *testing.T) {
	ref := loadReference(t)
	s := startServer(t)
	// "Lily" first appears in the reference text; the answer must end right before it.
	code, _, body := post(t, s.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":64,"temperature":0,"stop":["Lily"]}`)
	var c completion
	_ = json.Unmarshal(body, &c)
	want := ref.GeneratedText[:strings.Index(ref.GeneratedText, "Lily")]
	if code != 200 || c.Choices[0].Text != want || c.Choices[0].FinishReason != "stop" {
		t.Fatalf("stop string: %d %s, want text %q", code, body, want)
	}
	// Streaming with the stop string must not leak any part of it.
	resp, err := http.Post(s.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":64,"temperature":0,"stop":["Lily"],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	res := readSSE(t, resp.Body, false)
	resp.Body.Close()
	if res.text != want {
		t.Fatalf("streamed stop text %q, want %q", res.text, want)
	}
	// The same seed gives the same sampled output; another seed (almost surely) another.
	sample := func(seed int) string {
		_, _, b := post(t, s.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":48,"temperature":1.0,"top_p":0.95,"top_k":40,"min_p":0.01,"seed":%d}`, seed))
		var c completion
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) == 0 {
			t.Fatalf("seeded request: %s", b)
		}
		return c.Choices[0].Text
	}
	a, b2, other := sample(7), sample(7), sample(8)
	if a != b2 {
		t.Fatalf("same seed, different output:\n%q\n%q", a, b2)
	}
	if a == other {
		t.Fatalf("seeds 7 and 8 gave the same 48-token sample %q", a)
	}
}

type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestErrorsHaveTheOpenAIShape(t *testing.T) {
	s := startServer(t, "--kv-poison", "--max-total-tokens", "256")
	long := strings.Repeat("Once upon a time there was a dog. ", 120)
	cases := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"bad json", "/v1/completions", `{"model":`, 400, ""},
		{"max_tokens 0", "/v1/completions", `{"model":"stories260K","prompt":"hi","max_tokens":0}`, 400, ""},
		{"n 0", "/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"hi"}],"n":0}`, 400, ""},
		{"unknown model", "/v1/completions", `{"model":"gpt-9","prompt":"hi"}`, 404, "model_not_found"},
		{"unknown route", "/v1/embeddings", `{}`, 404, ""},
		{"prompt over context", "/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q}`, long), 400, ""},
		{"prompt+max_tokens over pool", "/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":300}`, 400, ""},
	}
	for _, tc := range cases {
		code, hdr, body := post(t, s.URL+tc.path, tc.body)
		var e apiError
		if err := json.Unmarshal(body, &e); err != nil || code != tc.status || e.Error.Message == "" || e.Error.Type == "" {
			t.Fatalf("%s: status %d body %s", tc.name, code, body)
		}
		if !strings.HasPrefix(hdr.Get("Content-Type"), "application/json") {
			t.Fatalf("%s: content type %q", tc.name, hdr.Get("Content-Type"))
		}
		if tc.code != "" && (e.Error.Code == nil || *e.Error.Code != tc.code) {
			t.Fatalf("%s: code %v, want %s", tc.name, e.Error.Code, tc.code)
		}
	}
	m := metricsOf(t, s)
	if m["baton_requests_rejected_total"] < 2 {
		t.Fatalf("rejections not counted: %v", m["baton_requests_rejected_total"])
	}
	if code, body := get(t, s.URL+"/server_info"); code != 200 || !bytes.Contains(body, []byte(`"effective_context_length":256`)) {
		t.Fatalf("/server_info: %d %s", code, body)
	}
	if !strings.Contains(s.Stderr(), "lowering the effective maximum") {
		t.Fatal("no start-up warning about the context exceeding the pool")
	}
	waitPagesFree(t, s)
}

func TestAPIKey(t *testing.T) {
	s := startServer(t, "--api-key", "sesame")
	body := `{"model":"stories260K","prompt":"Once","max_tokens":2}`
	if code, _, b := post(t, s.URL+"/v1/completions", body); code != 401 || !bytes.Contains(b, []byte("invalid_api_key")) {
		t.Fatalf("no key: %d %s", code, b)
	}
	if code, _, _ := post(t, s.URL+"/v1/completions", body, "Authorization", "Bearer wrong"); code != 401 {
		t.Fatalf("wrong key: %d", code)
	}
	if code, _, b := post(t, s.URL+"/v1/completions", body, "Authorization", "Bearer sesame"); code != 200 {
		t.Fatalf("right key: %d %s", code, b)
	}
	if code, _ := get(t, s.URL+"/health"); code != 200 {
		t.Fatalf("/health must not need the key: %d", code)
	}
	// Every route the README lists as needing the key refuses a stranger
	// before reading the body.
	for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/tokenize", "/detokenize"} {
		if code, _, b := post(t, s.URL+path, `{}`); code != 401 || !bytes.Contains(b, []byte("invalid_api_key")) {
			t.Errorf("POST %s without the key: %d %s", path, code, b)
		}
	}
	for _, path := range []string{"/v1/models", "/v1/models/stories260K", "/server_info"} {
		if code, b := get(t, s.URL+path); code != 401 {
			t.Errorf("GET %s without the key: %d %s", path, code, b)
		}
	}
}

func TestModelsHealthMetrics(t *testing.T) {
	s := startServer(t, "--served-model-name", "tiny")
	code, body := get(t, s.URL+"/v1/models")
	if code != 200 || !bytes.Contains(body, []byte(`"id":"tiny"`)) {
		t.Fatalf("/v1/models: %d %s", code, body)
	}
	if code, _, _ := post(t, s.URL+"/v1/completions", `{"model":"tiny","prompt":"Once","max_tokens":3}`); code != 200 {
		t.Fatalf("served name: %d", code)
	}
	code, body = get(t, s.URL+"/metrics")
	for _, name := range []string{"baton_kv_pages_capacity", "baton_kv_pages_free", "baton_requests_total", "baton_num_running_reqs",
		"baton_num_queue_reqs", "baton_time_to_first_token_seconds", "baton_inter_token_latency_seconds", "baton_e2e_request_latency_seconds",
		"baton_prompt_tokens_total", "baton_generation_tokens_total"} {
		if code != 200 || !bytes.Contains(body, []byte(name)) {
			t.Fatalf("/metrics lacks %s", name)
		}
	}
	m := metricsOf(t, s)
	if m["baton_generation_tokens_total"] != 3 || m[`baton_requests_total{outcome="finished",role="standalone"}`] != 1 {
		t.Fatalf("counters: generation %v requests %v", m["baton_generation_tokens_total"], m[`baton_requests_total{outcome="finished",role="standalone"}`])
	}
}

// A client that disconnects mid-stream aborts its request and frees its pages.
func TestClientDisconnectFreesPages(t *testing.T) {
	// A dummy model with a long context, so that the request is still
	// generating when the client leaves however slow the machine is (the
	// bundled model would finish its 512 positions in well under a second).
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{"vocab_size":32000,"hidden_size":256,"num_hidden_layers":4,"num_attention_heads":4,
"intermediate_size":512,"max_position_embeddings":8192}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--kv-poison", "--model", cfg, "--load-format", "dummy", "--served-model-name", "d",
		"--tokenizer", filepath.Join(repoRoot(t), "testdata", "vocab", "ggml-vocab-llama-spm.gguf"))
	conn, err := net.Dial("tcp", strings.TrimPrefix(s.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	// max_tokens: completions stop at 16 by default, too soon to catch.
	body := `{"model":"d","prompt":"Once upon a time","stream":true,"ignore_eos":true,"temperature":0,"max_tokens":8000}`
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			break
		}
	}
	if m := metricsOf(t, s); m["baton_kv_pages_free"] == m["baton_kv_pages_capacity"] {
		t.Fatal("a streaming request holds no pages")
	}
	conn.Close()
	waitPagesFree(t, s)
	deadline := time.Now().Add(5 * time.Second)
	for metricsOf(t, s)[`baton_requests_total{outcome="aborted",role="standalone"}`] != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the disconnect was not counted as an abort")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --tokenizer serves a model with another file's tokenizer: here a dummy
// model with Llama 2's 32000-token vocabulary, tokenized by that vocabulary.
func TestTokenizerFlag(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.json")
	if err := os.WriteFile(cfg, []byte(`{"vocab_size":32000,"hidden_size":64,"num_hidden_layers":2,"num_attention_heads":4,
"intermediate_size":128,"max_position_embeddings":256}`), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--model", cfg, "--load-format", "dummy", "--served-model-name", "d",
		"--tokenizer", filepath.Join(repoRoot(t), "testdata", "vocab", "ggml-vocab-llama-spm.gguf"))
	code, _, body := post(t, s.URL+"/v1/completions", `{"model":"d","prompt":"Hello world","max_tokens":8,"ignore_eos":true,"temperature":0}`)
	var c completion
	if err := json.Unmarshal(body, &c); err != nil || code != 200 || c.Usage.PromptTokens != 3 || c.Usage.CompletionTokens != 8 || c.Choices[0].Text == "" {
		t.Fatalf("%d %s", code, body)
	}
}

// --chat-template replaces the model's template (here: the plain fallback).
func TestChatTemplateFlag(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "t.jinja")
	if err := os.WriteFile(tmpl, []byte("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--chat-template", tmpl)
	code, _, body := post(t, s.URL+"/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":64,"temperature":0}`)
	ref := loadReference(t)
	var c struct {
		Choices []struct{ Message struct{ Content string } } `json:"choices"`
		Usage   struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	// The template renders "<s>Once upon a time": the reference prompt exactly.
	if err := json.Unmarshal(body, &c); err != nil || code != 200 || c.Usage.PromptTokens != 5 || c.Choices[0].Message.Content != ref.GeneratedText {
		t.Fatalf("%d %s", code, body)
	}
	bad := filepath.Join(t.TempDir(), "bad.jinja")
	_ = os.WriteFile(bad, []byte("{% for %}"), 0o644)
	out, err := exec.Command(batonBinary(t), "serve", "--chat-template", bad, "--port", "0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--chat-template") {
		t.Fatalf("a broken template started: %v %s", err, out)
	}
}
