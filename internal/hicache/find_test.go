package hicache

import (
	"container/list"
	"slices"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/prefixcache"
)

// An L2 entry answers a Find only for the page it was cached as: the same
// tenant, the same parent in the chain and the same tokens, not merely the
// same key. Each case files a copy of an L2 entry under the key another
// page of alice's would have (a hash collision), differing from that page
// in one of the three only, and requires the Find for that page to miss;
// there is no L3 to answer instead.
func TestL2FindComparesTenantParentAndTokens(t *testing.T) {
	salt := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", "")
	a := prompt(0, 2) // two full pages and one token
	for _, tc := range []struct {
		name string
		// The Find: its prompt and the page it starts from; the page of a
		// whose L2 entry is copied under that page's key, and the tenant a
		// was computed for.
		find  []int32
		from  int
		aPage int
		aSalt prefixcache.Salt
		// sameParent makes the copy name the Find's parent (the roots of
		// two tenants colliding too).
		sameParent bool
	}{
		// Another first page: same tenant and parent (the root), other tokens.
		{"other tokens", prompt(1, 2), 0, 0, salt, false},
		// a's second page's tokens after another first page: same tenant
		// and tokens, other parent.
		{"other parent", slices.Concat(prompt(1, 1)[:ps], a[ps:]), 1, 1, salt, false},
		// a's first page, cached for bob: same parent and tokens, other
		// tenant.
		{"other tenant", a, 0, 0, prefixcache.TenantSalt(prefixcache.ScopeKey, "bob", ""), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := setup(t, 8, 64, WriteThrough, nil)
			f.compute(t, tc.aSalt, a)
			ka := f.cache.Keys(tc.aSalt, a)
			kf := f.cache.Keys(salt, tc.find)
			if ka[tc.aPage] == kf[tc.from] {
				t.Fatal("the keys are equal without a collision")
			}
			parent := f.cache.Root(salt)
			if tc.from > 0 {
				parent = kf[tc.from-1]
			}
			toks := tc.find[tc.from*ps : (tc.from+1)*ps]
			f.tiers.mu.Lock()
			e, ok := f.tiers.l2[ka[tc.aPage]]
			var forged slot
			if ok {
				forged = *e.Value.(*slot)
				if tc.sameParent {
					forged.Parent = parent
				}
				// An element of a list of its own: the copy shares the
				// entry's L2 slot but not its place in the LRU.
				f.tiers.l2[kf[tc.from]] = list.New().PushBack(&forged)
			}
			f.tiers.mu.Unlock()
			if !ok {
				t.Fatalf("page %d of a is not in L2: %+v", tc.aPage, f.tiers.Stats())
			}
			differ := map[string]bool{"other tenant": forged.saltHash != SaltHash(salt), "other parent": forged.Parent != parent,
				"other tokens": !equal(forged.Tokens, toks)}
			for what, d := range differ {
				if d != (what == tc.name) {
					t.Fatalf("the copied entry: %v, want %s only", differ, tc.name)
				}
			}
			if got := f.tiers.Find(salt, tc.find, tc.from, 2); len(got) != 0 {
				t.Fatalf("a Find for page %d found %d pages: an L2 entry of %s answered it", tc.from, len(got), tc.name)
			}
			// The entry still answers for the page it was cached as.
			if got := f.tiers.Find(tc.aSalt, a, tc.aPage, 2); len(got) == 0 || got[0].Tier != L2 {
				t.Fatalf("a's own Find from page %d found %+v", tc.aPage, got)
			}
		})
	}
}

// A load whose landed bytes fail the checksum kept from publish is counted
// where an operator sees it: baton_hicache_load_failures_total{reason=
// "checksum"} grows by the pages that load ended as misses (the failed page
// and every one after it), and nothing is counted as gone, from L2 as from
// L3.
func TestLoadChecksumFailureIsCounted(t *testing.T) {
	for _, tier := range []Tier{L2, L3} {
		t.Run(map[Tier]string{L2: "L2", L3: "L3"}[tier], func(t *testing.T) {
			st := newMemStore()
			f := setup(t, 4, 64, WriteBack, st)
			var salt prefixcache.Salt
			p := prompt(0, 3)
			f.compute(t, salt, p)
			f.pool.EvictCached(-1) // into L2
			if tier == L3 {
				f.tiers.Close() // L2 into L3
				f = setup(t, 4, 64, WriteBack, st)
			}
			// Every page's bytes change on the way into the pool, as
			// BATON_FAULTS=load_corrupt does.
			f.tiers.cfg.Faults.Landed = func(b []byte) { b[len(b)/2|3] ^= 0x40 }
			a, _, found := f.load(t, salt, p)
			if len(found) != 3 || found[0].Tier != tier {
				t.Fatalf("found %+v, want 3 pages in L%d", found, tier)
			}
			for _, id := range a.Pages {
				if in := f.pool.Info(id); in.State != kvpool.PageAllocated || in.Written != 0 {
					t.Fatalf("page %d after a corrupted load: %+v", id, in)
				}
			}
			if s := f.tiers.Stats(); s.ChecksumFails != 1 || s.LoadFailures != 3 || s.Loads != 0 {
				t.Fatalf("stats %+v, want 1 checksum failure ending 3 loads", s)
			}
			counted := func(reason string) float64 {
				var m dto.Metric
				if err := f.m.HiCacheLoadFailures.WithLabelValues(reason).Write(&m); err != nil {
					t.Fatal(err)
				}
				return m.GetCounter().GetValue()
			}
			if got := counted("checksum"); got != 3 {
				t.Fatalf("baton_hicache_load_failures_total{reason=\"checksum\"} = %v after a load from L%d failed its checksum, want 3", got, tier)
			}
			if got := counted("gone"); got != 0 {
				t.Fatalf("baton_hicache_load_failures_total{reason=\"gone\"} = %v, want 0: the pages were there, their bytes were wrong", got)
			}
			if err := f.pool.Release(a.Owner, a.Pages); err != nil {
				t.Fatal(err)
			}
		})
	}
}
