package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// With --kv-cache-dtype f16 on every engine, greedy output through
// router, prefill and decode (both under --kv-poison) equals a standalone
// server's with the same dtype (auto's on the cpu backend), the workers
// report the dtype, and the
// handoff moves 2 bytes per K or V element: half of f32's.
func TestPDKVDTypeF16MatchesStandalone(t *testing.T) {
	pdF16MatchesStandalone(t, "")
}

// pdF16MatchesStandalone is TestPDKVDTypeF16MatchesStandalone's check with
// the workers on --transport transport, from a binary built with that
// tag ("": tcp, the default binary).
func pdF16MatchesStandalone(t *testing.T, transport string) {
	t.Helper()
	args := []string{"--kv-cache-dtype", "f16", "--page-size", "4", "--chunked-prefill-size", "8"}
	bin := ""
	workerArgs := args
	if transport != "" {
		bin = harness.Build(t, transport)
		workerArgs = append([]string{"--transport", transport}, args...)
	}
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, Binary: bin, WorkerArgs: workerArgs})
	// The standalone server leaves the dtype to auto, f16 on the cpu backend.
	sa := harness.StartWith(t, harness.Options{AutoKV: true}, append([]string{"--kv-poison"}, args[2:]...)...)
	for _, w := range append(c.Workers(), sa) {
		var info struct {
			DType string `json:"kv_cache_dtype"`
		}
		if code, b := harness.Get(t, w.URL+"/server_info"); code != 200 || json.Unmarshal(b, &info) != nil || info.DType != "f16" {
			t.Fatalf("%s /server_info: %d %s", w.URL, code, b)
		}
	}
	prompts := []string{"Once upon a time", "The cat sat on the", "Lily and Ben went to the park. They"}
	promptTokens := 0
	for _, p := range prompts {
		body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":40,"temperature":0}`, p)
		var got, want struct {
			Choices []struct{ Text string }
			Usage   struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		code1, _, b1 := post(t, c.Router.URL+"/v1/completions", body)
		code2, _, b2 := post(t, sa.URL+"/v1/completions", body)
		_ = json.Unmarshal(b1, &got)
		_ = json.Unmarshal(b2, &want)
		if code1 != 200 || code2 != 200 || len(got.Choices) != 1 || len(want.Choices) != 1 || got.Choices[0].Text != want.Choices[0].Text || got.Choices[0].Text == "" {
			t.Fatalf("prompt %q: PD %d %s\nstandalone %d %s", p, code1, b1, code2, b2)
		}
		promptTokens += got.Usage.PromptTokens
	}
	c.WaitClean(t)
	// stories260K: 5 layers, K and V rows of 4 KV heads x 8 dims.
	const perToken = 5 * 2 * 4 * 8
	// The prefill worker counts what its sessions landed; a decode worker
	// counts the frames it unpacked, which one-sided puts do not send.
	m := metricsOf(t, c.Decode[0])
	sent := metricsOf(t, c.Prefill[0])["baton_kv_transfer_bytes_total"]
	if sent <= 0 || int(sent)%(2*perToken) != 0 || int(sent) > 2*perToken*promptTokens {
		t.Fatalf("prefill landed %v KV bytes for %d prompt tokens; f16 is %d bytes a token", sent, promptTokens, 2*perToken)
	}
	if got := m["baton_kv_transfer_bytes_total"]; transport == "" && got != sent {
		t.Fatalf("decode received %v KV bytes, prefill landed %v", got, sent)
	}
	if m["baton_handoff_failures_total"] != 0 || m["baton_nan_logits_total"] != 0 {
		t.Fatalf("handoff failures %v, NaN logits %v", m["baton_handoff_failures_total"], m["baton_nan_logits_total"])
	}
}

// With no --kv-cache-dtype, a cpu engine stores f16 KV (auto), says so in
// /server_info, sizes its pool for 2-byte elements, and still continues
// the public reference (made with f32 KV) token for token, each chosen
// token's log-probability within what f16 rounding moves it (measured
// worst 2.9e-3 in internal/model).
func TestDefaultKVDTypeIsF16OnCPU(t *testing.T) {
	ref := loadReference(t)
	s := harness.StartWith(t, harness.Options{AutoKV: true}, "--kv-poison", "--max-total-tokens", "1024", "--page-size", "4")
	var info struct {
		DType  string `json:"kv_cache_dtype"`
		Tokens int    `json:"kv_pool_tokens"`
	}
	if code, b := harness.Get(t, s.URL+"/server_info"); code != 200 || json.Unmarshal(b, &info) != nil || info.DType != "f16" || info.Tokens != 1024 {
		t.Fatalf("/server_info: %d %s; want kv_cache_dtype f16 and 1024 pool tokens", code, b)
	}
	code, _, b := post(t, s.URL+"/v1/completions", greedyBody(ref))
	var c completion
	if code != 200 || json.Unmarshal(b, &c) != nil || len(c.Choices) != 1 || c.Choices[0].Logprobs == nil {
		t.Fatalf("greedy reference request: %d %s", code, b)
	}
	if got := c.Choices[0].Text; got != ref.GeneratedText {
		t.Fatalf("f16 KV: text %q\nwant %q", got, ref.GeneratedText)
	}
	for i, top := range ref.Top5 {
		if d := math.Abs(c.Choices[0].Logprobs.TokenLogprobs[i] - top[0].Logprob); d > 6e-3 {
			t.Fatalf("f16 KV: position %d logprob %v, reference %v", i, c.Choices[0].Logprobs.TokenLogprobs[i], top[0].Logprob)
		}
	}
}

// A prefill worker storing f16 KV and a decode worker storing f32 never
// pair: the router names the dtype in /server_info and its log, and a
// request gets 503 instead of decoding pages it would misread.
func TestPDKVDTypeMismatchRefused(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, NoRouter: true,
		PrefillArgs: []string{"--kv-cache-dtype", "f16"}})
	r := harness.StartWith(t, harness.Options{Unready: true}, "--role", "router", "--prefill", c.Prefill[0].URL, "--decode", c.Decode[0].URL)
	want := "dtype (prefill f16, decode f32)"
	var info struct {
		Refused []string `json:"refused_pairs"`
	}
	ok := false
	for range 200 {
		code, b := harness.Get(t, r.URL+"/server_info")
		if code == 200 && json.Unmarshal(b, &info) == nil && len(info.Refused) == 1 {
			ok = true
			break
		}
		time.Sleep(50 * time.Millisecond) // polling the router's probe loop, not ordering events
	}
	if !ok || !strings.Contains(info.Refused[0], want) {
		t.Fatalf("router /server_info refused_pairs %q, want one naming %q", info.Refused, want)
	}
	if !strings.Contains(r.Stderr(), "refusing prefill/decode pair") || !strings.Contains(r.Stderr(), want) {
		t.Fatalf("router log does not name the dtype mismatch:\n%s", r.Stderr())
	}
	if code, _, b := post(t, r.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once","max_tokens":4}`); code != 503 {
		t.Fatalf("a request through the unpaired router: %d %s", code, b)
	}
}
