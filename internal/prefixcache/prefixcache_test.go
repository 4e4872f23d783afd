package prefixcache

import (
	"errors"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
)

const ps = 4

func newCache(t *testing.T, pages int) (*kvpool.Pool, *Cache) {
	t.Helper()
	p, err := kvpool.New(kvpool.Config{NumPages: pages, PageSize: ps, Layers: 1, KVHeads: 1, HeadDim: 2, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	return p, New(p, "test model", Guards{})
}

func seq(n int, base int32) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = base + int32(i)
	}
	return s
}

// computed allocates pages for tokens as a request would, marks them
// written and publishes them; it returns the request's allocation.
func computed(t *testing.T, p *kvpool.Pool, c *Cache, salt Salt, room uint64, tokens []int32) kvpool.Allocation {
	t.Helper()
	hit := c.Lookup(salt, tokens)
	a, err := p.AllocPinned(room, p.PagesFor(len(tokens))-len(hit), hit)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.MarkPositions(a.Owner, a.Pages, len(tokens)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Publish(salt, a.Owner, a.Pages, tokens); err != nil {
		t.Fatal(err)
	}
	return a
}

func TestTenantSalt(t *testing.T) {
	a, b := TenantSalt(ScopeKey, "key-a", ""), TenantSalt(ScopeKey, "key-b", "")
	if a == b {
		t.Fatal("two API keys got one salt")
	}
	if TenantSalt(ScopeKey, "key-a", "") != a {
		t.Fatal("the salt is not a function of the key")
	}
	if TenantSalt(ScopeKey, "ab", "c") == TenantSalt(ScopeKey, "a", "bc") {
		t.Fatal("key and cache_salt run together")
	}
	if TenantSalt(ScopeKey, "key-a", "s1") == a || TenantSalt(ScopeKey, "key-a", "s1") == TenantSalt(ScopeKey, "key-a", "s2") {
		t.Fatal("cache_salt does not split a key's tenant")
	}
	if TenantSalt(ScopeGlobal, "key-a", "") != TenantSalt(ScopeGlobal, "key-b", "") {
		t.Fatal("global scope still splits by key")
	}
	if TenantSalt(ScopeGlobal, "key-a", "s1") == TenantSalt(ScopeGlobal, "key-a", "") {
		t.Fatal("global scope drops cache_salt")
	}
	if _, err := ParseScope("tenant"); err == nil {
		t.Fatal("a bad scope parsed")
	}
}

func TestLookupFindsOwnTenantOnly(t *testing.T) {
	p, c := newCache(t, 16)
	alice, bob := TenantSalt(ScopeKey, "alice", ""), TenantSalt(ScopeKey, "bob", "")
	prompt := seq(10, 100) // 2 full pages and 2 tokens
	a := computed(t, p, c, alice, 1, prompt)
	if s := c.Stats(); s.Pages != 2 {
		t.Fatalf("published %d pages, want the 2 full ones", s.Pages)
	}
	if hit := c.Lookup(bob, prompt); len(hit) != 0 {
		t.Fatalf("another tenant found %v", hit)
	}
	hit := c.Lookup(alice, prompt)
	if len(hit) != 2 || hit[0].Page != a.Pages[0] || hit[1].Page != a.Pages[1] {
		t.Fatalf("hit %v, pages %v", hit, a.Pages)
	}
	// At least one token is left to compute: a prompt of exactly 2 pages
	// reuses one.
	if hit := c.Lookup(alice, prompt[:8]); len(hit) != 1 {
		t.Fatalf("8-token prompt reused %d pages", len(hit))
	}
	// A prompt that differs in page 2 reuses page 1 only; in page 1, none.
	other := append(seq(4, 100), seq(6, 500)...)
	if hit := c.Lookup(alice, other); len(hit) != 1 {
		t.Fatalf("diverging prompt reused %d pages", len(hit))
	}
	if hit := c.Lookup(alice, seq(10, 101)); len(hit) != 0 {
		t.Fatalf("different prompt reused %d pages", len(hit))
	}
	// The same prompt from another salt computes its own copy; both stay.
	computed(t, p, c, bob, 2, prompt)
	if s := c.Stats(); s.Pages != 4 {
		t.Fatalf("%d pages after the second tenant", s.Pages)
	}
}

func TestLookupComparesTokens(t *testing.T) {
	p, c := newCache(t, 8)
	salt := TenantSalt(ScopeKey, "k", "")
	prompt := seq(6, 1)
	computed(t, p, c, salt, 1, prompt)
	// Stand in for a hash collision: the key is right, the tokens are not.
	k := c.Keys(salt, prompt)[0]
	c.mu.Lock()
	e := c.index[k]
	e.tokens = seq(4, 50)
	c.index[k] = e
	c.mu.Unlock()
	if hit := c.Lookup(salt, prompt); len(hit) != 0 {
		t.Fatalf("a page with other tokens was found: %v", hit)
	}
}

func TestPublishRefusesIncompletePage(t *testing.T) {
	p, c := newCache(t, 4)
	salt := TenantSalt(ScopeKey, "k", "")
	a, err := p.Alloc(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.MarkPositions(a.Owner, a.Pages, 6); err != nil {
		t.Fatal(err)
	}
	// The tokens claim 2 full pages; the second holds 2 of 4.
	n, err := c.Publish(salt, a.Owner, a.Pages, seq(8, 1))
	if n != 1 || !errors.Is(err, kvpool.ErrNotWritten) {
		t.Fatalf("published %d, err %v", n, err)
	}
	if s := c.Stats(); s.Pages != 1 {
		t.Fatalf("index holds %d pages", s.Pages)
	}
	if in := p.Info(a.Pages[1]); in.State != kvpool.PageAllocated {
		t.Fatalf("incomplete page is %v", in.State)
	}
}

func TestEvictionDropsKeys(t *testing.T) {
	p, c := newCache(t, 4)
	salt := TenantSalt(ScopeKey, "k", "")
	prompt := seq(9, 1)
	a := computed(t, p, c, salt, 1, prompt)
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Cached != 2 || s.Free != 2 {
		t.Fatalf("pool %+v", s)
	}
	// A pinned reader keeps page 0; an allocation of 2 evicts page 1 only.
	hit := c.Lookup(salt, prompt[:5])
	r, err := p.AllocPinned(2, 1, hit)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Alloc(3, 2); err != nil {
		t.Fatal(err)
	}
	if got := c.Lookup(salt, prompt); len(got) != 1 || got[0] != hit[0] {
		t.Fatalf("after eviction lookup found %v, want %v", got, hit)
	}
	if s := c.Stats(); s.Pages != 1 {
		t.Fatalf("index holds %d pages", s.Pages)
	}
	_ = r
}

func TestCount(t *testing.T) {
	_, c := newCache(t, 4)
	c.Count(100, 0)
	c.Count(100, 64)
	if s := c.Stats(); s.QueriedTokens != 200 || s.HitTokens != 64 || s.HitRate() != 0.32 {
		t.Fatalf("stats %+v rate %v", s, s.HitRate())
	}
}

// TestRootDependsOnKVDType: pages of one model stored in another KV dtype
// hold other bytes, so their chains start from other roots and never
// match.
func TestRootDependsOnKVDType(t *testing.T) {
	var salt Salt
	roots := map[kvpool.CacheKey]kernels.DType{}
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
		p, err := kvpool.New(kvpool.Config{NumPages: 2, PageSize: ps, Layers: 1, KVHeads: 1, HeadDim: 2, KVDType: dt})
		if err != nil {
			t.Fatal(err)
		}
		r := New(p, "test model", Guards{}).root(salt)
		if other, ok := roots[r]; ok {
			t.Fatalf("%s and %s KV share the root key", dt, other)
		}
		roots[r] = dt
	}
}
