package prefixcache

import (
	"slices"
	"testing"
)

// A lookup hits a cached page only if the entry's parent is the key of the
// page before it in the prompt's own chain: two chains whose pages hold the
// same tokens but follow different pages never hit each other's page, even
// when a hash collision files one under the other's key (the index keeps
// each page's parent and compares it, as it does the tokens).
func TestLookupComparesParent(t *testing.T) {
	p, c := newCache(t, 8)
	salt := TenantSalt(ScopeKey, "k", "")
	// a and b differ in their first page and hold the same tokens in
	// their second.
	a := slices.Concat(seq(4, 100), seq(4, 200), []int32{7})
	b := slices.Concat(seq(4, 300), seq(4, 200), []int32{7})
	computed(t, p, c, salt, 1, a)
	bFirst := computed(t, p, c, salt, 2, b[:5]) // b's first page only
	ka, kb := c.Keys(salt, a), c.Keys(salt, b)
	if ka[1] == kb[1] {
		t.Fatal("the chains' second keys are equal without a collision")
	}
	// Stand in for a hash collision: a's second page, whose parent is a's
	// first page, filed under the key b's second page would have.
	c.mu.Lock()
	e, ok := c.index[ka[1]]
	if !ok || e.parent != ka[0] || !equal(e.tokens, b[4:8]) {
		c.mu.Unlock()
		t.Fatalf("a's second page is not indexed as expected: %+v", e)
	}
	c.index[kb[1]] = e
	c.mu.Unlock()
	hit := c.Lookup(salt, b)
	if len(hit) != 1 || hit[0].Page != bFirst.Pages[0] {
		t.Fatalf("b's lookup hit %v, want only its own first page %d: a page of another chain (parent %v, b's parent %v) was found",
			hit, bFirst.Pages[0], ka[0], kb[0])
	}
	// a's own chain still finds both its pages.
	if hit := c.Lookup(salt, a); len(hit) != 2 {
		t.Fatalf("a's lookup hit %v, want its 2 pages", hit)
	}
}
