package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// repeatBody asks for a greedy continuation of a prompt that repeats
// itself, where the n-gram lookup drafts from the start.
func repeatBody(ref reference, n int) string {
	p := ref.Prompt + ref.GeneratedText[:80]
	return fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0,"ignore_eos":true}`, p+p+p, n)
}

// Standalone with ngram speculation: the greedy reference comes out token
// for token with its logprobs (4 at once, 4-token pages so drafts cross
// pages), a long greedy continuation of a repetitive prompt equals the one
// without speculation, drafts were verified, and every page comes back.
func TestStandaloneSpeculativeGreedy(t *testing.T) {
	ref := loadReference(t)
	plain := startServer(t, "--kv-poison", "--page-size", "4")
	spec := startServer(t, "--kv-poison", "--page-size", "4", "--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "5", "--speculative-num-steps", "5")
	greedyConcurrently(t, spec.URL, ref, 4)
	var want, got completion
	for _, x := range []struct {
		s   *server
		out *completion
	}{{plain, &want}, {spec, &got}} {
		code, _, body := post(t, x.s.URL+"/v1/completions", repeatBody(ref, 200))
		if code != 200 || json.Unmarshal(body, x.out) != nil || len(x.out.Choices) != 1 {
			t.Fatalf("status %d: %s", code, body)
		}
	}
	if got.Choices[0].Text != want.Choices[0].Text || got.Usage != want.Usage {
		t.Fatalf("speculation changed greedy output:\n got %q %+v\nwant %q %+v", got.Choices[0].Text, got.Usage, want.Choices[0].Text, want.Usage)
	}
	waitPagesFree(t, spec)
	m := metricsOf(t, spec)
	if m["baton_spec_draft_tokens_total"] == 0 || m["baton_spec_accepted_tokens_total"] == 0 || m["baton_spec_accept_length_count"] != 5 {
		t.Fatalf("spec metrics: drafted %v accepted %v accept-length observations %v", m["baton_spec_draft_tokens_total"],
			m["baton_spec_accepted_tokens_total"], m["baton_spec_accept_length_count"])
	}
	if m["baton_kv_release_errors"] != 0 || m["baton_kv_read_gate_failures_total"] != 0 {
		t.Fatalf("pool: release errors %v, read gate failures %v", m["baton_kv_release_errors"], m["baton_kv_read_gate_failures_total"])
	}
	checkSpecUsage(t, spec.URL, plain.URL, ref)
}

// A decode worker with ngram speculation serves the greedy reference
// through the router, token for token, and its drafts are counted there.
func TestPDSpeculativeDecodeGreedyReference(t *testing.T) {
	ref := loadReference(t)
	c := startCluster(t, 1, 1, nil, []string{"--speculative-algorithm", "ngram"})
	for _, n := range []int{1, 8} {
		greedyConcurrently(t, c.Router.URL, ref, n)
	}
	code, _, body := post(t, c.Router.URL+"/v1/completions", repeatBody(ref, 100))
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	checkSpecUsage(t, c.Router.URL, "", ref)
	c.WaitClean(t)
	m := metricsOf(t, c.Decode[0])
	if m["baton_spec_draft_tokens_total"] == 0 || m["baton_spec_accepted_tokens_total"] == 0 || m["baton_kv_read_gate_failures_total"] != 0 {
		t.Fatalf("decode spec metrics: drafted %v accepted %v read gate failures %v", m["baton_spec_draft_tokens_total"],
			m["baton_spec_accepted_tokens_total"], m["baton_kv_read_gate_failures_total"])
	}
}

// specUsage is the usage of an answer with its speculation figures.
type specUsage struct {
	CompletionTokens   int      `json:"completion_tokens"`
	SpecVerifyCt       *int     `json:"spec_verify_ct"`
	SpecDraftTokenNum  *int     `json:"spec_draft_token_num"`
	SpecAcceptTokenNum *int     `json:"spec_accept_token_num"`
	SpecAcceptLength   *float64 `json:"spec_accept_length"`
	SpecAcceptRate     *float64 `json:"spec_accept_rate"`
}

// checkSpecUsage asks spec (a server or router that speculates) for a
// repetitive continuation, whole and streamed with include_usage: the
// usage carries its draft and accepted tokens, steps, accept length and
// rate. A server without speculation (plain, when given) sends none of them.
func checkSpecUsage(t *testing.T, spec, plain string, ref reference) {
	t.Helper()
	check := func(u specUsage, what string) {
		t.Helper()
		if u.SpecVerifyCt == nil || u.SpecDraftTokenNum == nil || u.SpecAcceptTokenNum == nil || u.SpecAcceptLength == nil || u.SpecAcceptRate == nil ||
			*u.SpecDraftTokenNum == 0 || *u.SpecAcceptTokenNum == 0 || *u.SpecAcceptTokenNum > *u.SpecDraftTokenNum ||
			*u.SpecVerifyCt == 0 || *u.SpecVerifyCt > u.CompletionTokens || *u.SpecAcceptLength <= 1 ||
			*u.SpecAcceptRate != float64(*u.SpecAcceptTokenNum)/float64(*u.SpecDraftTokenNum) {
			b, _ := json.Marshal(u)
			t.Fatalf("%s: usage %s", what, b)
		}
	}
	var whole struct{ Usage specUsage }
	code, _, body := post(t, spec+"/v1/completions", repeatBody(ref, 200))
	if code != 200 || json.Unmarshal(body, &whole) != nil {
		t.Fatalf("status %d: %s", code, body)
	}
	check(whole.Usage, "whole")
	streamed := strings.Replace(repeatBody(ref, 200), `"max_tokens"`, `"stream":true,"stream_options":{"include_usage":true},"max_tokens"`, 1)
	code, _, body = post(t, spec+"/v1/completions", streamed)
	var last struct{ Usage *specUsage }
	for _, line := range strings.Split(string(body), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			if err := json.Unmarshal([]byte(data), &last); err != nil {
				t.Fatalf("chunk %q: %v", data, err)
			}
		}
	}
	if code != 200 || last.Usage == nil {
		t.Fatalf("status %d: %s", code, body)
	}
	check(*last.Usage, "streamed")
	if plain == "" {
		return
	}
	code, _, body = post(t, plain+"/v1/completions", repeatBody(ref, 20))
	if code != 200 || strings.Contains(string(body), "spec_") {
		t.Fatalf("a server without speculation: status %d: %s", code, body)
	}
}
