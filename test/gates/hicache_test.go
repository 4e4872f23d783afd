package gates

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// The hierarchical cache's gate, on a standalone server whose pool holds
// a few prompts while many go through: their prefixes go down to host
// memory (L2) and come back by loads that fault injection slows and
// reorders. Every answer must equal the one computed without any cache,
// and nothing may be read before its load ended (read-before-ready 0, no
// NaN). With the scheduler's wait switched off the read gate must refuse
// the loading pages; with the read gate off too, the poisoned pages are
// read, and the answers go wrong.

const hicachePrompts = 6

func hicachePrompt(i int) string { return fmt.Sprintf("Story %d. %s", i, longPrompt) }

func scenarioHiCache(t *testing.T, guardsOff string) violations {
	var v violations
	// 40 pages of 4 tokens: about three prompts' worth.
	s := startCached(t, guardsOff, "seed=3,load_delay=80ms,load_jitter=true",
		"--max-total-tokens", "160", "--hicache-size", "0.01", "--hicache-write-policy", "write_back")
	want := make([]string, hicachePrompts)
	for i := range want {
		a := askAs(t, s, "alice", hicachePrompt(i), 16)
		if a.code != 200 {
			v.add("computing prompt %d: %d %s", i, a.code, a.body)
			return v
		}
		want[i] = a.text
	}
	// Again, all at once, in reverse: the early prompts are in L2 only.
	got := make([]cachedAnswer, hicachePrompts)
	var wg sync.WaitGroup
	for i := hicachePrompts - 1; i >= 0; i-- {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = askAs(t, s, "alice", hicachePrompt(i), 16)
		}()
	}
	wg.Wait()
	for i, a := range got {
		if a.code != 200 || a.text != want[i] {
			v.add("prompt %d read back from the tiers: %d %q, want %q computed: %s", i, a.code, a.text, want[i], a.body)
		}
	}
	m := harness.Metrics(t, s)
	if m["baton_kv_read_before_ready_total"] != 0 {
		v.add("%v reads of pages still loading were refused", m["baton_kv_read_before_ready_total"])
	}
	if l2 := series(m, "baton_hicache_hit_pages_total", `tier="l2"`); l2 == 0 || m["baton_hicache_load_waits_total"] == 0 {
		v.add("no page came back from L2 or no request waited for a load: %v L2 hits, %v waits", l2, m["baton_hicache_load_waits_total"])
	}
	checkStandaloneClean(t, s, &v)
	return v
}

// series sums the series of name whose labels include label.
func series(m map[string]float64, name, label string) float64 {
	sum := 0.0
	for k, x := range m {
		if strings.HasPrefix(k, name+"{") && strings.Contains(k, label) {
			sum += x
		}
	}
	return sum
}

func TestGateHiCacheLoads(t *testing.T) { requireClean(t, scenarioHiCache(t, "")) }

// Every load landing with a flipped byte (load_corrupt) is a miss: the
// checksum kept from publish refuses it, the request computes the pages,
// and the answers are the computed ones.
func TestGateHiCacheCorruptLoadIsAMiss(t *testing.T) {
	var v violations
	s := startCached(t, "", "load_corrupt=true", "--max-total-tokens", "160", "--hicache-size", "0.01")
	want := make([]string, hicachePrompts)
	for i := range want {
		want[i] = askAs(t, s, "alice", hicachePrompt(i), 16).text
	}
	for i := range 2 {
		if a := askAs(t, s, "alice", hicachePrompt(i), 16); a.code != 200 || a.text != want[i] || want[i] == "" {
			v.add("prompt %d over corrupted loads: %d %q, want %q: %s", i, a.code, a.text, want[i], a.body)
		}
	}
	m := harness.Metrics(t, s)
	if got := series(m, "baton_hicache_load_failures_total", `reason="checksum"`); got == 0 {
		v.add("no corrupted load was refused by its checksum")
	}
	if m["baton_kv_read_before_ready_total"] != 0 {
		v.add("%v reads before ready", m["baton_kv_read_before_ready_total"])
	}
	checkStandaloneClean(t, s, &v)
	requireClean(t, v)
}

// scenarioHiCacheNoReadGuard is the gate with the scheduler's wait off
// too, so that only the read gate stands between a step and a page still
// loading: switching the read gate off as well must show the read.
func scenarioHiCacheNoReadGuard(t *testing.T, guardsOff string) violations {
	return scenarioHiCache(t, "load_wait,"+guardsOff)
}

// scenarioHiCachePD: through the router, with a decode cache whose pool
// holds about three prompts and whose loads from L2 are slowed: a prompt
// decode evicted is reserved over pages still loading, prefill ships only
// the rest, and Commit waits for the loads before it re-checks the held
// pages. Prefill's pool is as small, so its prefix comes back from its own
// L2 (slowed and reordered too) before it ships the rest. The answer equals
// the one computed the first time, and no check fails.
func scenarioHiCachePD(t *testing.T, guardsOff string) violations {
	var v violations
	var env []string
	if guardsOff != "" {
		env = append(env, "BATON_GUARDS_OFF="+guardsOff)
	}
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, Binary: faultsBinary(t),
		WorkerArgs:  []string{"--page-size", "4", "--hicache-size", "0.01"},
		DecodeArgs:  []string{"--disaggregation-decode-enable-radix-cache", "--max-total-tokens", "160"},
		PrefillArgs: []string{"--max-total-tokens", "160"},
		PrefillEnv:  append(slices.Clone(env), "BATON_FAULTS=load_delay=50ms,load_jitter=true"),
		DecodeEnv:   append(slices.Clone(env), "BATON_FAULTS=load_delay=150ms"),
	})
	d := c.Decode[0]
	ask := func(i int) (int, string, string) {
		body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":16,"temperature":0}`, hicachePrompt(i))
		code, _, b := harness.Post(t, c.Router.URL+"/v1/completions", body, "Authorization", "Bearer alice")
		var r struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if code == 200 && json.Unmarshal(b, &r) == nil && len(r.Choices) == 1 {
			return code, r.Choices[0].Text, string(b)
		}
		return code, "", string(b)
	}
	want := make([]string, hicachePrompts)
	for i := range want {
		code, text, body := ask(i)
		if code != 200 {
			v.add("computing prompt %d: %d %s", i, code, body)
			return v
		}
		want[i] = text
		harness.WaitPagesFree(t, d)
	}
	for i := range 2 {
		if code, text, body := ask(i); code != 200 || text != want[i] {
			v.add("prompt %d again, its prefix loading on decode: %d %q, want %q: %s", i, code, text, want[i], body)
		}
	}
	m := harness.Metrics(t, d)
	if l2 := series(m, "baton_hicache_hit_pages_total", `tier="l2"`); l2 == 0 || m["baton_hicache_load_waits_total"] == 0 {
		v.add("decode: %v pages held from L2, %v Commits waited for loads", l2, m["baton_hicache_load_waits_total"])
	}
	for _, name := range []string{"baton_handoff_failures_total", "baton_kv_read_before_ready_total", "baton_nan_logits_total", "baton_kv_release_errors"} {
		if m[name] != 0 {
			v.add("decode: %s = %v", name, m[name])
		}
	}
	// Prefill's pool is as small: its prefix came back from its own L2.
	if pm := harness.Metrics(t, c.Prefill[0]); series(pm, "baton_hicache_hit_pages_total", `tier="l2"`) == 0 || pm["baton_kv_read_before_ready_total"] != 0 {
		v.add("prefill: %v pages from L2, %v reads before ready", series(pm, "baton_hicache_hit_pages_total", `tier="l2"`), pm["baton_kv_read_before_ready_total"])
	}
	for _, w := range c.Workers() {
		harness.WaitPagesFree(t, w)
	}
	return v
}

func TestGateHiCachePD(t *testing.T) { requireClean(t, scenarioHiCachePD(t, "")) }
