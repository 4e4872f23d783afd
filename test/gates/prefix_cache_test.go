package gates

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// The prefix cache's gates, on a standalone server: a write into a cached
// page is refused; a page that was not complete never enters the cache;
// eviction never frees a page a request reads; a lookup under another
// tenant's salt misses.

// startCached starts a standalone faults build with a prefix cache over
// 4-token pages and poisoned free pages.
func startCached(t *testing.T, guardsOff, faultSpec string, args ...string) *harness.Server {
	t.Helper()
	var env []string
	if guardsOff != "" {
		env = append(env, "BATON_GUARDS_OFF="+guardsOff)
	}
	if faultSpec != "" {
		env = append(env, "BATON_FAULTS="+faultSpec)
	}
	return harness.StartWith(t, harness.Options{Binary: faultsBinary(t), Env: env}, append([]string{"--page-size", "4", "--kv-poison"}, args...)...)
}

type cachedAnswer struct {
	code   int
	text   string
	cached int
	body   string
}

// askAs sends a greedy completion of prompt with the bearer key given.
func askAs(t *testing.T, s *harness.Server, key, prompt string, maxTokens int) cachedAnswer {
	t.Helper()
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0}`, prompt, maxTokens)
	code, _, b := harness.Post(t, s.URL+"/v1/completions", body, "Authorization", "Bearer "+key)
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			Details struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	a := cachedAnswer{code: code, body: string(b)}
	if code == 200 && json.Unmarshal(b, &c) == nil && len(c.Choices) == 1 {
		a.text, a.cached = c.Choices[0].Text, c.Usage.Details.CachedTokens
	}
	return a
}

// checkStandaloneClean adds a violation for pages a request still holds,
// refused releases, NaN logits or refused lifecycle moves.
func checkStandaloneClean(t *testing.T, s *harness.Server, v *violations) {
	t.Helper()
	if !waitFor(t, 10*time.Second, func() bool {
		m := harness.Metrics(t, s)
		return m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] == m["baton_kv_pages_capacity"]
	}) {
		m := harness.Metrics(t, s)
		v.add("pages held after every request ended: %v free, %v cached of %v", m["baton_kv_pages_free"], m["baton_kv_pages_cached"], m["baton_kv_pages_capacity"])
	}
	m := harness.Metrics(t, s)
	for _, name := range []string{"baton_kv_release_errors", "baton_nan_logits_total", "baton_lifecycle_illegal_moves_total"} {
		if m[name] != 0 {
			v.add("%s = %v", name, m[name])
		}
	}
}

// scenarioCacheWrite: with cache_rewrite the first request that reads a
// cached prefix starts one page early over other tokens, so its first step
// would store KV into a shared page. It must be refused (the request fails,
// the refusal is counted) and the page must still give the same answer.
func scenarioCacheWrite(t *testing.T, guardsOff string) violations {
	var v violations
	s := startCached(t, guardsOff, "cache_rewrite=true")
	first := askAs(t, s, "alice", longPrompt, 16)
	if first.code != 200 || first.cached != 0 {
		v.add("first request: %d, %d cached: %s", first.code, first.cached, first.body)
		return v
	}
	if bad := askAs(t, s, "alice", longPrompt, 16); bad.code == 200 {
		v.add("a request whose step wrote into a cached page got 200 (%q)", bad.text)
	}
	after := askAs(t, s, "alice", longPrompt, 16)
	if after.code != 200 || after.text != first.text || after.cached == 0 {
		v.add("after the refused write the cached prefix gave %d %q (%d cached), want %q from the cache", after.code, after.text, after.cached, first.text)
	}
	if m := harness.Metrics(t, s); m["baton_kv_shared_write_refusals"] < 1 {
		v.add("no write into a shared page was refused")
	}
	checkStandaloneClean(t, s, &v)
	return v
}

func TestGateCacheWriteRefused(t *testing.T) { requireClean(t, scenarioCacheWrite(t, "")) }

// scenarioCacheComplete: with cache_publish_early every request offers its
// prompt pages at admission, before any is written. None may enter the
// cache: the request computes its prompt and answers, and the next one
// reads the pages only once they are complete.
func scenarioCacheComplete(t *testing.T, guardsOff string) violations {
	var v violations
	s := startCached(t, guardsOff, "cache_publish_early=true")
	first := askAs(t, s, "alice", longPrompt, 16)
	if first.code != 200 || first.cached != 0 {
		v.add("a request whose unwritten pages were offered to the cache: %d, %d cached: %s", first.code, first.cached, first.body)
	}
	second := askAs(t, s, "alice", longPrompt, 16)
	if second.code != 200 || second.cached == 0 || (first.code == 200 && second.text != first.text) {
		v.add("the next request: %d, %d cached, %q (first %q): %s", second.code, second.cached, second.text, first.text, second.body)
	}
	checkStandaloneClean(t, s, &v)
	return v
}

func TestGateCacheOnlyCompletePages(t *testing.T) { requireClean(t, scenarioCacheComplete(t, "")) }

// scenarioCachePin: a long streaming request publishes its prompt pages and
// keeps reading them while it decodes; a second request that needs more
// pages than are free arrives meanwhile. Eviction must not take the pages
// the first one pins: the second waits for room, and both answer. The
// model is a slow one (random weights of a 100M-parameter shape), so that
// the first request is still decoding when the second arrives.
func scenarioCachePin(t *testing.T, guardsOff string) violations {
	var v violations
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"architectures":["LlamaForCausalLM"],"vocab_size":512,"hidden_size":1024,"num_hidden_layers":8,
"num_attention_heads":8,"num_key_value_heads":8,"intermediate_size":4096,"max_position_embeddings":1024,"rms_norm_eps":1e-5}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// 40 pages of 4 tokens. The long request holds 25 (9 of them its shared
	// prompt pages), the second needs 18 of the 15 left.
	s := startCached(t, guardsOff, "", "--model", cfg, "--load-format", "dummy", "--served-model-name", "stories260K", "--max-total-tokens", "160")
	long := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":60,"temperature":0,"ignore_eos":true,"stream":true}`, longPrompt)
	req, err := http.NewRequest(http.MethodPost, s.URL+"/v1/completions", strings.NewReader(long))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: {") {
	}
	// The long request has its first token, so its prompt pages are
	// shared, and it pins them.
	other := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":50,"temperature":0,"ignore_eos":true}`,
		"Tom had a big dog. The dog liked to run and jump in the yard all day long.")
	if code, _, b := harness.Post(t, s.URL+"/v1/completions", other, "Authorization", "Bearer bob"); code != 200 {
		v.add("the second request: %d %s", code, b)
	}
	tokens, failed := 0, ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.Contains(line, `"error"`):
			failed = line
		case strings.HasPrefix(line, "data: {"):
			tokens++
		}
	}
	if failed != "" || tokens < 59 {
		v.add("the long request, whose pinned prompt pages another request needed, ended after %d more chunks: %s", tokens, failed)
	}
	if m := harness.Metrics(t, s); m["baton_kv_read_gate_failures_total"] != 0 {
		v.add("%v steps refused by the read gate", m["baton_kv_read_gate_failures_total"])
	}
	checkStandaloneClean(t, s, &v)
	return v
}

func TestGateCacheEvictsOnlyUnpinned(t *testing.T) { requireClean(t, scenarioCachePin(t, "")) }

// scenarioTenantSalt: two API keys send the same prompt; the second reads
// nothing cached. The same key twice reads the cache and answers the same.
func scenarioTenantSalt(t *testing.T, guardsOff string) violations {
	var v violations
	s := startCached(t, guardsOff, "")
	a := askAs(t, s, "alice", longPrompt, 16)
	b := askAs(t, s, "bob", longPrompt, 16)
	salted := askAs(t, s, "alice", longPrompt+"", 16)
	if a.code != 200 || b.code != 200 || salted.code != 200 {
		v.add("answers %d, %d, %d", a.code, b.code, salted.code)
		return v
	}
	if b.cached != 0 {
		v.add("a second API key read %d cached tokens of the first key's prompt", b.cached)
	}
	if salted.cached == 0 || salted.text != a.text || b.text != a.text {
		v.add("the same key again read %d cached tokens and answered %q (first %q, other key %q)", salted.cached, salted.text, a.text, b.text)
	}
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":4,"temperature":0,"cache_salt":"project-x"}`, longPrompt)
	code, _, out := harness.Post(t, s.URL+"/v1/completions", body, "Authorization", "Bearer alice")
	if code != 200 || !strings.Contains(string(out), `"cached_tokens":0`) {
		v.add("the same key with a cache_salt: %d %s", code, out)
	}
	checkStandaloneClean(t, s, &v)
	return v
}

func TestGateCacheTenantsApart(t *testing.T) { requireClean(t, scenarioTenantSalt(t, "")) }

// scenarioHeldRecheck: decode keeps finished requests' pages; the same
// prompt again is reserved over the pages decode holds, and one of them is
// changed (held_corrupt) before Commit re-checks it. The request must fail
// (never 200 over the changed KV), the failure is counted, and the next
// request computes the prefix afresh and answers right.
func scenarioHeldRecheck(t *testing.T, guardsOff string) violations {
	var v violations
	env := []string{"BATON_FAULTS=held_corrupt=true"}
	if guardsOff != "" {
		env = append(env, "BATON_GUARDS_OFF="+guardsOff)
	}
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: []string{"--page-size", "4", "--kv-poison"},
		DecodeArgs: []string{"--disaggregation-decode-enable-radix-cache"}, DecodeEnv: env, Binary: faultsBinary(t)})
	first := askAs(t, c.Router, "alice", longPrompt, 16)
	if first.code != 200 {
		v.add("first request: %d %s", first.code, first.body)
		return v
	}
	d := c.Decode[0]
	waitFor(t, 10*time.Second, func() bool {
		m := harness.Metrics(t, d)
		return m["baton_kv_pages_cached"] > 0 && m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] == m["baton_kv_pages_capacity"]
	})
	if bad := askAs(t, c.Router, "alice", longPrompt, 16); bad.code == 200 {
		v.add("a request over a held page changed since it was cached got 200 (%q, the first got %q)", bad.text, first.text)
	}
	if m := harness.Metrics(t, d); m[`baton_handoff_failures_total{reason="held_page",role="decode"}`] < 1 {
		v.add("no held page failed Commit's re-check")
	}
	if after := askAs(t, c.Router, "alice", longPrompt, 16); after.code != 200 || after.text != first.text {
		v.add("after the changed page was found the prompt gave %d %q, want %q", after.code, after.text, first.text)
	}
	checkClean(t, c, &v)
	return v
}

func TestGateHeldPagesRechecked(t *testing.T) { requireClean(t, scenarioHeldRecheck(t, "")) }
