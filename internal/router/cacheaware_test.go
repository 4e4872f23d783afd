package router

import (
	"testing"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

func TestCacheAwareChoice(t *testing.T) {
	r := &Router{cacheThreshold: DefaultCacheThreshold, balanceAbs: DefaultBalanceAbsThreshold, balanceRel: DefaultBalanceRelThreshold}
	w0 := &worker{url: "w0", info: &pdv1.WorkerInfo{}}
	w1 := &worker{url: "w1", info: &pdv1.WorkerInfo{}}
	ws := []*worker{w0, w1}
	alice, bob := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", ""), prefixcache.TenantSalt(prefixcache.ScopeKey, "bob", "")
	prompt := make([]int32, 64)
	for i := range prompt {
		prompt[i] = int32(i)
	}
	keys := promptKeys(alice, prompt, 16)
	if len(keys) != 4 {
		t.Fatalf("%d keys", len(keys))
	}
	if got, _ := r.chooseCacheAware(ws, keys, rolePrefill); got != w0 {
		t.Fatalf("nothing cached anywhere: got %s, want the first of the emptiest", got.url)
	}
	if got, _ := r.chooseCacheAware(ws, keys, rolePrefill); got != w0 {
		t.Fatalf("the same prompt again went to %s, not to the worker holding it", got.url)
	}
	// Another tenant's same prompt matches nothing: it goes where least is held.
	if got, _ := r.chooseCacheAware(ws, promptKeys(bob, prompt, 16), rolePrefill); got != w1 {
		t.Fatalf("another tenant's prompt went to %s", got.url)
	}
	// A prompt sharing 1 page of 4 is below the threshold: least held.
	other := append(append([]int32(nil), prompt[:16]...), make([]int32, 48)...)
	w1.tree.insert(promptKeys(bob, make([]int32, 160), 16)) // w1 now holds more than w0
	if got, _ := r.chooseCacheAware(ws, promptKeys(alice, other, 16), rolePrefill); got != w0 {
		t.Fatalf("a weak match went to %s, want the worker holding least", got.url)
	}
	// Load a little out of balance still follows the cache...
	w0.info.Running = 20
	if got, _ := r.chooseCacheAware(ws, keys, rolePrefill); got != w0 {
		t.Fatalf("within the thresholds the prompt went to %s", got.url)
	}
	// ...far out of balance goes by load.
	w0.info.Running = 40
	if got, _ := r.chooseCacheAware(ws, keys, rolePrefill); got != w1 {
		t.Fatalf("out of balance the prompt went to %s, not the idlest", got.url)
	}
}

// What the router remembers per worker stays bounded: past the bound the
// keys sent longest ago go, the latest stay.
func TestApproxTreeBounded(t *testing.T) {
	tr := &approxTree{keys: map[request.CacheKey]uint64{}}
	salt := prefixcache.TenantSalt(prefixcache.ScopeKey, "k", "")
	var last []request.CacheKey
	// Each prompt is 256 pages; twice the bound's worth of them.
	for i := range 2 * maxTreeKeys / 256 {
		prompt := make([]int32, 4096)
		for j := range prompt {
			prompt[j] = int32(i*7 + j)
		}
		last = promptKeys(salt, prompt, 16)
		tr.insert(last)
		if len(tr.keys) > maxTreeKeys {
			t.Fatalf("%d keys held, bound %d", len(tr.keys), maxTreeKeys)
		}
	}
	if len(tr.keys) < maxTreeKeys/4 {
		t.Fatalf("only %d keys held after the bound was reached", len(tr.keys))
	}
	if tr.match(last) != len(last) {
		t.Fatal("the latest prompt was forgotten")
	}
}

// Decode workers are chosen the same way, by their own load.
func TestCacheAwareDecodeChoice(t *testing.T) {
	r := &Router{cacheThreshold: DefaultCacheThreshold, balanceAbs: DefaultBalanceAbsThreshold, balanceRel: DefaultBalanceRelThreshold}
	d0 := &worker{url: "d0", info: &pdv1.WorkerInfo{Queued: 100}} // queue depth is not decode load
	d1 := &worker{url: "d1", info: &pdv1.WorkerInfo{}}
	ws := []*worker{d0, d1}
	keys := promptKeys(prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", ""), make([]int32, 64), 16)
	if got, _ := r.chooseCacheAware(ws, keys, roleDecode); got != d0 {
		t.Fatalf("nothing held anywhere: got %s", got.url)
	}
	if got, _ := r.chooseCacheAware(ws, keys, roleDecode); got != d0 {
		t.Fatalf("the same prompt again went to %s", got.url)
	}
	d0.assigned = 40
	if got, _ := r.chooseCacheAware(ws, keys, roleDecode); got != d1 {
		t.Fatalf("out of balance the prompt went to %s", got.url)
	}
}
