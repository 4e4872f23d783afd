package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// prefixPrompt is long enough to fill several 4-token pages.
const prefixPrompt = "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her red ball."

type cachedCompletion struct {
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			TopLogprobs []map[string]float64 `json:"top_logprobs"`
		} `json:"logprobs"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		Details          *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (c cachedCompletion) cached(t *testing.T) int {
	t.Helper()
	if c.Usage.Details == nil {
		t.Fatal("usage has no prompt_tokens_details")
	}
	return c.Usage.Details.CachedTokens
}

func askCached(t *testing.T, url, path, body, key string) cachedCompletion {
	t.Helper()
	var h []string
	if key != "" {
		h = []string{"Authorization", "Bearer " + key}
	}
	code, _, b := post(t, url+path, body, h...)
	if code != 200 {
		t.Fatalf("%s: %d %s", path, code, b)
	}
	var c cachedCompletion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return c
}

func sameTop(t *testing.T, what string, got, want cachedCompletion) {
	t.Helper()
	if got.Choices[0].Text != want.Choices[0].Text {
		t.Fatalf("%s: text %q, want %q", what, got.Choices[0].Text, want.Choices[0].Text)
	}
	g, w := got.Choices[0].Logprobs, want.Choices[0].Logprobs
	if g == nil || w == nil || len(g.TopLogprobs) != len(w.TopLogprobs) {
		t.Fatalf("%s: logprobs %+v, want %+v", what, g, w)
	}
	for i := range w.TopLogprobs {
		for tok, lp := range w.TopLogprobs[i] {
			if x, ok := g.TopLogprobs[i][tok]; !ok || math.Abs(x-lp) > 1e-4 {
				t.Fatalf("%s: position %d top logprob of %q = %v (present %v), want %v", what, i, tok, x, ok, lp)
			}
		}
	}
}

// The standalone prefix cache: the same key sending a prompt again reads
// its pages and answers the same; another key, no key or another
// cache_salt reads nothing; n > 1 choices share the prompt's pages; the
// next turn of a chat reads the earlier turn's; the pool accounts for
// every page afterwards.
func TestStandalonePrefixCache(t *testing.T) {
	s := startServer(t, "--page-size", "4", "--kv-poison")
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":16,"temperature":0,"logprobs":5}`, prefixPrompt)
	first := askCached(t, s.URL, "/v1/completions", body, "key-a")
	if first.cached(t) != 0 {
		t.Fatalf("the first request read %d cached tokens", first.cached(t))
	}
	n := first.Usage.PromptTokens
	again := askCached(t, s.URL, "/v1/completions", body, "key-a")
	if want := (n - 1) / 4 * 4; again.cached(t) != want {
		t.Fatalf("the same key again read %d cached tokens, want %d of %d", again.cached(t), want, n)
	}
	sameTop(t, "cached", again, first)
	for _, tc := range []struct{ name, key, body string }{
		{"another key", "key-b", body},
		{"no key", "", body},
		{"another cache_salt", "key-a", strings.Replace(body, `"prompt"`, `"cache_salt":"s1","prompt"`, 1)},
	} {
		c := askCached(t, s.URL, "/v1/completions", tc.body, tc.key)
		if c.cached(t) != 0 {
			t.Fatalf("%s read %d cached tokens", tc.name, c.cached(t))
		}
		sameTop(t, tc.name, c, first)
	}

	// n > 1: the prompt counts once and the later choices read its pages.
	m0 := metricsOf(t, s)
	nb := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":8,"temperature":0.9,"seed":3,"n":3}`, prefixPrompt+" The end.")
	c := askCached(t, s.URL, "/v1/completions", nb, "key-n")
	if len(c.Choices) != 3 || c.Usage.PromptTokens <= n || c.Usage.PromptTokens >= 2*n {
		t.Fatalf("n=3: %d choices, usage %+v", len(c.Choices), c.Usage)
	}
	m1 := metricsOf(t, s)
	if hit := m1["baton_prefix_cache_hit_tokens_total"] - m0["baton_prefix_cache_hit_tokens_total"]; hit < float64(2*((c.Usage.PromptTokens-1)/4*4)) {
		t.Fatalf("n=3 choices read %v cached tokens, want the prompt's pages twice", hit)
	}

	// A chat's second turn reads the first turn's pages.
	turn1 := `{"model":"stories260K","messages":[{"role":"user","content":"Tell me a story about Lily and her red ball in the park."}],"max_tokens":12,"temperature":0}`
	a1 := askCached(t, s.URL, "/v1/chat/completions", turn1, "key-chat")
	answer, _ := json.Marshal(a1.Choices[0].Message.Content)
	turn2 := fmt.Sprintf(`{"model":"stories260K","messages":[{"role":"user","content":"Tell me a story about Lily and her red ball in the park."},{"role":"assistant","content":%s},{"role":"user","content":"And then?"}],"max_tokens":4,"temperature":0}`, answer)
	a2 := askCached(t, s.URL, "/v1/chat/completions", turn2, "key-chat")
	if a2.cached(t) < (a1.Usage.PromptTokens-4)/4*4 || a2.cached(t) == 0 {
		t.Fatalf("second turn read %d cached tokens; the first turn's prompt had %d", a2.cached(t), a1.Usage.PromptTokens)
	}

	m := metricsOf(t, s)
	if m["baton_prefix_cache_hit_tokens_total"] == 0 || m["baton_prefix_cache_queried_tokens_total"] < m["baton_prefix_cache_hit_tokens_total"] ||
		m["baton_prefix_cache_hit_rate"] <= 0 || m["baton_kv_pages_cached"] == 0 || m["baton_kv_shared_write_refusals"] != 0 {
		t.Fatalf("prefix cache metrics: %v", m)
	}
	code, info := get(t, s.URL+"/server_info")
	if code != 200 || !strings.Contains(string(info), `"prefix_cache":{`) || !strings.Contains(string(info), `"enabled":true`) {
		t.Fatalf("/server_info: %d %s", code, info)
	}
	waitPagesFree(t, s)
	if m := metricsOf(t, s); m["baton_nan_logits_total"] != 0 || m["baton_kv_release_errors"] != 0 {
		t.Fatalf("after the run: %v", m)
	}
}

// With --disable-radix-cache every prompt is computed in full, and every
// page goes back to the free list.
func TestStandalonePrefixCacheDisabled(t *testing.T) {
	s := startServer(t, "--page-size", "4", "--disable-radix-cache")
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":4,"temperature":0}`, prefixPrompt)
	for range 2 {
		if c := askCached(t, s.URL, "/v1/completions", body, "k"); c.cached(t) != 0 {
			t.Fatalf("cache off, yet %d cached tokens", c.cached(t))
		}
	}
	waitPagesFree(t, s)
	if m := metricsOf(t, s); m["baton_kv_pages_free"] != m["baton_kv_pages_capacity"] {
		t.Fatalf("pages kept with the cache off: %v", m)
	}
}

// Through the router, prefill's prefix cache skips computing a cached
// prefix for the same key (its pages are still shipped to decode and
// checked), answers the same, and reports cached_tokens; another key reads
// nothing. Every pool accounts for itself afterwards.
func TestPDPrefixCache(t *testing.T) {
	c := startCluster(t, 1, 1, []string{"--page-size", "4", "--kv-poison"}, nil)
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":16,"temperature":0,"logprobs":5}`, prefixPrompt)
	first := askCached(t, c.Router.URL, "/v1/completions", body, "key-a")
	if first.cached(t) != 0 {
		t.Fatalf("the first request read %d cached tokens", first.cached(t))
	}
	n := first.Usage.PromptTokens
	again := askCached(t, c.Router.URL, "/v1/completions", body, "key-a")
	if want := (n - 1) / 4 * 4; again.cached(t) != want {
		t.Fatalf("the same key again read %d cached tokens, want %d of %d", again.cached(t), want, n)
	}
	sameTop(t, "cached through PD", again, first)
	other := askCached(t, c.Router.URL, "/v1/completions", body, "key-b")
	if other.cached(t) != 0 {
		t.Fatalf("another key read %d cached tokens", other.cached(t))
	}
	sameTop(t, "another key through PD", other, first)
	p := metricsOf(t, c.Prefill[0])
	if p["baton_prefix_cache_hit_tokens_total"] != float64(again.cached(t)) || p["baton_kv_shared_write_refusals"] != 0 {
		t.Fatalf("prefill metrics: %v", p)
	}
	for _, w := range c.Workers() {
		waitPagesFree(t, w)
		if m := metricsOf(t, w); m["baton_kv_release_errors"] != 0 || m["baton_nan_logits_total"] != 0 || m["baton_kv_pages_quarantined"] != 0 {
			t.Fatalf("%s after the run: %v", w.URL, m)
		}
	}
}

// With --policy cache_aware the router sends a prompt back to the prefill
// worker that cached it, so the same key's second request reads it there;
// another key's goes by what each worker holds.
func TestPDCacheAwareRouting(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 2, Decode: 1, WorkerArgs: []string{"--page-size", "4", "--kv-poison"},
		RouterArgs: []string{"--policy", "cache_aware"}})
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":8,"temperature":0}`, prefixPrompt)
	for i := range 3 {
		a := askCached(t, c.Router.URL, "/v1/completions", body, "key-a")
		if i > 0 && a.cached(t) == 0 {
			t.Fatalf("request %d of the same key read nothing cached: the router sent it to another prefill worker", i)
		}
	}
	if b := askCached(t, c.Router.URL, "/v1/completions", body, "key-b"); b.cached(t) != 0 {
		t.Fatalf("another key read %d cached tokens", b.cached(t))
	}
	hits := 0.0
	for _, p := range c.Prefill {
		hits += metricsOf(t, p)["baton_prefix_cache_hit_tokens_total"]
	}
	if hits == 0 {
		t.Fatal("no prefill worker counted a hit")
	}
	for _, w := range c.Workers() {
		waitPagesFree(t, w)
	}
}

// With --disaggregation-decode-enable-radix-cache decode keeps a finished
// request's pages: the same key's prompt again is reserved over the prefix
// decode holds, prefill ships only the rest (fewer bytes), and the answer
// is the same. Another key's prompt holds nothing.
func TestPDDecodeRadixCache(t *testing.T) {
	c := startCluster(t, 1, 1, []string{"--page-size", "4", "--kv-poison"}, []string{"--disaggregation-decode-enable-radix-cache"})
	d := c.Decode[0]
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":16,"temperature":0,"logprobs":5}`, prefixPrompt)
	first := askCached(t, c.Router.URL, "/v1/completions", body, "key-a")
	waitPagesFree(t, d) // finished: its pages are cached on decode
	m0 := metricsOf(t, d)
	again := askCached(t, c.Router.URL, "/v1/completions", body, "key-a")
	m1 := metricsOf(t, d)
	sameTop(t, "decode-cached", again, first)
	n := first.Usage.PromptTokens
	if held := m1["baton_prefix_cache_hit_tokens_total"] - m0["baton_prefix_cache_hit_tokens_total"]; held != float64((n-1)/4*4) {
		t.Fatalf("decode held %v tokens of the %d-token prompt, want %d", held, n, (n-1)/4*4)
	}
	firstBytes, againBytes := m0["baton_kv_transfer_bytes_total"], m1["baton_kv_transfer_bytes_total"]-m0["baton_kv_transfer_bytes_total"]
	if againBytes <= 0 || againBytes*4 > firstBytes {
		t.Fatalf("the held prompt still moved %v bytes (the first %v)", againBytes, firstBytes)
	}
	other := askCached(t, c.Router.URL, "/v1/completions", body, "key-b")
	sameTop(t, "other key", other, first)
	if m2 := metricsOf(t, d); m2["baton_prefix_cache_hit_tokens_total"] != m1["baton_prefix_cache_hit_tokens_total"] {
		t.Fatalf("another key's reservation held %v tokens", m2["baton_prefix_cache_hit_tokens_total"]-m1["baton_prefix_cache_hit_tokens_total"])
	}
	for _, w := range c.Workers() {
		waitPagesFree(t, w)
		if m := metricsOf(t, w); m["baton_kv_release_errors"] != 0 || m["baton_nan_logits_total"] != 0 || m["baton_kv_pages_quarantined"] != 0 ||
			m["baton_kv_shared_write_refusals"] != 0 || m[`baton_handoff_failures_total{reason="held_page",role="decode"}`] != 0 {
			t.Fatalf("%s after the run: %v", w.URL, m)
		}
	}
}

// /v1/responses requests carry their tenant like the others: another key's
// same input reads nothing cached, the same key's again does.
func TestStandalonePrefixCacheResponses(t *testing.T) {
	s := startServer(t, "--page-size", "4")
	body := fmt.Sprintf(`{"model":"stories260K","input":%q,"max_output_tokens":4,"temperature":0}`, prefixPrompt)
	hits := func() float64 { return metricsOf(t, s)["baton_prefix_cache_hit_tokens_total"] }
	for i, tc := range []struct {
		key string
		hit bool
	}{{"key-a", false}, {"key-b", false}, {"key-a", true}} {
		before := hits()
		if code, _, b := post(t, s.URL+"/v1/responses", body, "Authorization", "Bearer "+tc.key); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
		if got := hits() > before; got != tc.hit {
			t.Fatalf("request %d (%s) read cached tokens: %v, want %v", i, tc.key, got, tc.hit)
		}
	}
}

// With decode caches on and --policy cache_aware, the router sends a
// tenant's repeated prompt back to the decode worker that holds it.
func TestPDCacheAwareDecodeRouting(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 2, WorkerArgs: []string{"--page-size", "4", "--kv-poison"},
		DecodeArgs: []string{"--disaggregation-decode-enable-radix-cache"}, RouterArgs: []string{"--policy", "cache_aware"}})
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":8,"temperature":0}`, prefixPrompt)
	var n int
	for range 3 {
		n = askCached(t, c.Router.URL, "/v1/completions", body, "key-a").Usage.PromptTokens
		for _, d := range c.Decode {
			waitPagesFree(t, d) // finished, its pages cached
		}
	}
	held := 0.0
	for _, d := range c.Decode {
		held += metricsOf(t, d)["baton_prefix_cache_hit_tokens_total"]
	}
	if want := float64(2 * ((n - 1) / 4 * 4)); held != want {
		t.Fatalf("decode workers held %v tokens over the two repeats, want %v", held, want)
	}
}
