package main

import (
	"testing"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// One tenant's compiled schema is never warm for another: a fast first
// answer would tell the second tenant that the first sent the same schema.
func TestConstraintsPerTenant(t *testing.T) {
	tok := bundledTokenizer(t)
	cs := newConstraints(tok)
	c := scheduler.Constraint{Kind: "json_schema", Spec: `{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]}`}
	a := prefixcache.TenantSalt(prefixcache.ScopeKey, "key-a", "")
	b := prefixcache.TenantSalt(prefixcache.ScopeKey, "key-b", "")
	for i, tenant := range []prefixcache.Salt{a, a, b} {
		if err := cs.check(c, tenant); err != nil {
			t.Fatal(err)
		}
		if want := []int{1, 1, 2}[i]; cs.cache.Len() != want {
			t.Fatalf("after check %d: %d compiled grammars, want %d", i, cs.cache.Len(), want)
		}
	}
	if _, err := cs.matcher(c, b, nil); err != nil || cs.cache.Len() != 2 {
		t.Fatalf("matcher for a tenant that checked already: %v, %d compiled", err, cs.cache.Len())
	}
}

// A continuation's matcher starts past the output generated so far: after
// "ab" under ab+c only b and c may come, as on the pair that generated it,
// and output the constraint refuses is an error, not a fresh start.
func TestConstraintMatcherStartsPastGenerated(t *testing.T) {
	tok := bundledTokenizer(t)
	id := func(s string) int32 {
		t.Helper()
		v, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		return v
	}
	a, b, c := id("a"), id("b"), id("c")
	cs := newConstraints(tok)
	var tenant prefixcache.Salt
	allowed := func(m scheduler.Matcher, id int32) bool {
		mask := make([]uint64, m.MaskWords())
		m.FillMask(mask)
		return mask[id/64]&(1<<(id%64)) != 0
	}
	fresh, err := cs.matcher(scheduler.Constraint{Kind: "regex", Spec: "ab+c"}, tenant, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !allowed(fresh, a) || allowed(fresh, b) {
		t.Fatal("a fresh matcher of ab+c does not start at a")
	}
	m, err := cs.matcher(scheduler.Constraint{Kind: "regex", Spec: "ab+c"}, tenant, []int32{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if allowed(m, a) || !allowed(m, b) || !allowed(m, c) {
		t.Errorf("after ab: a %v, b %v, c %v allowed; want b and c only", allowed(m, a), allowed(m, b), allowed(m, c))
	}
	if _, err := cs.matcher(scheduler.Constraint{Kind: "regex", Spec: "ab+c"}, tenant, []int32{b}); err == nil {
		t.Error("output the constraint refuses gave a matcher")
	}
}

// bundledTokenizer is the bundled model's tokenizer.
func bundledTokenizer(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	f, err := gguf.Parse(bundled.Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}
