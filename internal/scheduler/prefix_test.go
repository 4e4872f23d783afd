package scheduler

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
)

func newCachedEngine(t *testing.T, pageSize, pages, chunk int) *Engine {
	t.Helper()
	lm, pool := storiesPool(t, pageSize, pages)
	c := lm.Config
	e := NewEngine(lm, pool, Config{ContextLength: c.ContextLength, ChunkSize: chunk, MaxRunning: 16, IsEOG: func(id int32) bool { return id == 2 },
		PrefixCache: prefixcache.New(pool, "stories260K", prefixcache.Guards{})}, metrics.New("standalone"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// run submits one request and returns its tokens and the cached count its
// first event reported.
func run(t *testing.T, e *Engine, prompt []int32, p Params) ([]model.Sampled, int) {
	t.Helper()
	r := NewRequest("r", prompt, p)
	if err := e.Enqueue(r); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var toks []model.Sampled
	cached := -1
	for {
		ev, ok := r.Next(ctx)
		if !ok {
			t.Fatal("timed out")
		}
		if ev.Token != nil {
			if cached < 0 {
				cached = ev.CachedTokens
			}
			toks = append(toks, *ev.Token)
		}
		if ev.Finish != "" {
			if ev.Err != nil {
				t.Fatalf("request failed: %v", ev.Err)
			}
			return toks, cached
		}
	}
}

func sameTokens(t *testing.T, what string, got, want []model.Sampled) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d tokens, want %d", what, len(got), len(want))
	}
	for i := range want {
		if got[i].ID != want[i].ID {
			t.Fatalf("%s: token %d = %d, want %d", what, i, got[i].ID, want[i].ID)
		}
		for k := range want[i].Top {
			if got[i].Top[k].ID != want[i].Top[k].ID || math.Abs(float64(got[i].Top[k].Logprob-want[i].Top[k].Logprob)) > 1e-4 {
				t.Fatalf("%s: position %d alt %d: %+v, want %+v", what, i, k, got[i].Top[k], want[i].Top[k])
			}
		}
	}
}

// waitAccounted waits until no request holds a page: every page is free or
// cached, and nothing was refused.
func waitAccounted(t *testing.T, e *Engine) kvpool.Stats {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := e.Pool().Stats()
		if st.Free+st.Cached == st.Total {
			if st.ReleaseErrors != 0 || st.SharedWriteRefusals != 0 {
				t.Fatalf("pool %+v", st)
			}
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("pages held after the requests ended: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A prompt whose prefix is cached reads it and computes only the rest; the
// output is the uncached output (greedy tokens equal, top-5 logprobs within
// 1e-4), another tenant reads nothing, and every page is accounted for.
func TestPrefixCacheHitSameOutput(t *testing.T) {
	want := loadRef(t)
	const ps = 4
	e := newCachedEngine(t, ps, 512, 512)
	alice, bob := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", ""), prefixcache.TenantSalt(prefixcache.ScopeKey, "bob", "")
	p := Params{MaxTokens: len(want.GeneratedIDs), Sampling: model.Sampling{TopLogprobs: 5}, Tenant: alice}
	first, cached := run(t, e, want.PromptIDs, p)
	if cached != 0 {
		t.Fatalf("first request read %d cached tokens", cached)
	}
	for j, tk := range first {
		if tk.ID != want.GeneratedIDs[j] {
			t.Fatalf("uncached token %d = %d, want %d", j, tk.ID, want.GeneratedIDs[j])
		}
	}
	n := len(want.PromptIDs)
	wantHit := (n - 1) / ps * ps
	second, cached := run(t, e, want.PromptIDs, p)
	if cached != wantHit {
		t.Fatalf("second request read %d cached tokens, want %d (prompt %d)", cached, wantHit, n)
	}
	sameTokens(t, "cached run", second, first)

	pb := p
	pb.Tenant = bob
	other, cached := run(t, e, want.PromptIDs, pb)
	if cached != 0 {
		t.Fatalf("another tenant read %d cached tokens", cached)
	}
	sameTokens(t, "other tenant", other, first)

	// A prompt that continues the first request's output (the next turn of
	// a chat) reads the pages the first request generated too.
	turn2 := append(append(append([]int32(nil), want.PromptIDs...), want.GeneratedIDs...), want.PromptIDs[1:]...)
	_, cached = run(t, e, turn2, Params{MaxTokens: 4, Tenant: alice})
	if wantMin := (n + len(want.GeneratedIDs) - 1) / ps * ps; cached < wantMin {
		t.Fatalf("next turn read %d cached tokens, want at least %d", cached, wantMin)
	}
	st := waitAccounted(t, e)
	if st.Cached == 0 || st.Shared != st.Cached {
		t.Fatalf("pool after the run %+v", st)
	}
	cs := e.cfg.PrefixCache.Stats()
	if cs.HitTokens == 0 || cs.QueriedTokens < uint64(3*n) {
		t.Fatalf("cache stats %+v", cs)
	}
}

// Eviction under pressure: a pool too small to keep every prefix serves
// each request, evicts only unpinned pages and accounts for all of them.
func TestPrefixCacheEvictsUnderPressure(t *testing.T) {
	want := loadRef(t)
	const ps = 4
	n := len(want.PromptIDs)
	per := (n + 8 + ps - 1) / ps
	e := newCachedEngine(t, ps, per*3, 512)
	var base []model.Sampled
	for i := range 8 {
		salt := prefixcache.TenantSalt(prefixcache.ScopeKey, string(rune('a'+i%4)), "")
		toks, _ := run(t, e, want.PromptIDs, Params{MaxTokens: 8, Sampling: model.Sampling{TopLogprobs: 5}, Tenant: salt})
		if base == nil {
			base = toks
		}
		sameTokens(t, "under eviction", toks, base)
	}
	st := waitAccounted(t, e)
	if st.Evictions == 0 {
		t.Fatalf("no eviction in a pool of %d pages: %+v", per*3, st)
	}
}

// Prompt logprobs need every prompt position's logits: such a request
// computes its whole prompt even when its prefix is cached.
func TestPrefixCachePromptLogprobsComputeAll(t *testing.T) {
	want := loadRef(t)
	e := newCachedEngine(t, 4, 256, 512)
	run(t, e, want.PromptIDs, Params{MaxTokens: 2})
	_, cached := run(t, e, want.PromptIDs, Params{MaxTokens: 2, PromptLogprobs: true})
	if cached != 0 {
		t.Fatalf("prompt logprobs request read %d cached tokens", cached)
	}
	waitAccounted(t, e)
}

// Requests of one tenant that arrive together with the same prompt do not
// all compute it: the first does, the others wait for its pages and read
// them. Another tenant's request does not wait.
func TestPrefixCacheWaitsForPrefixInFlight(t *testing.T) {
	want := loadRef(t)
	e := newCachedEngine(t, 4, 512, 512)
	alice := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", "")
	var rs []*Request
	for i := range 5 {
		p := Params{MaxTokens: 4, Tenant: alice}
		if i == 4 {
			p.Tenant = prefixcache.TenantSalt(prefixcache.ScopeKey, "bob", "")
		}
		r := NewRequest("r", want.PromptIDs, p)
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
		rs = append(rs, r)
	}
	hits := 0
	for i, r := range rs {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ev, ok := r.Next(ctx)
		cancel()
		if !ok || ev.Token == nil {
			t.Fatalf("request %d: %+v", i, ev)
		}
		if ev.CachedTokens > 0 {
			hits++
			if i == 4 {
				t.Fatal("another tenant's request read the cache")
			}
		}
		collect(t, r)
	}
	if hits != 3 {
		t.Fatalf("%d of the 3 later requests of the tenant read the first one's pages", hits)
	}
	waitAccounted(t, e)
}
