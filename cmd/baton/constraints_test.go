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
	f, err := gguf.Parse(bundled.Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
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
	if _, err := cs.matcher(c, b); err != nil || cs.cache.Len() != 2 {
		t.Fatalf("matcher for a tenant that checked already: %v, %d compiled", err, cs.cache.Len())
	}
}
