package router

import (
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

// PolicyCacheAware sends a request to the prefill and decode workers most
// likely to hold its prompt's prefix in their prefix caches, unless the
// load is out of balance (SGLang router's cache_aware policy and
// thresholds). A decode worker without a cache loses nothing by it: the
// choice then only keeps a tenant's prompts together.
const PolicyCacheAware = "cache_aware"

// Defaults of the cache_aware thresholds, SGLang router's.
const (
	DefaultCacheThreshold      = 0.5
	DefaultBalanceAbsThreshold = 32
	DefaultBalanceRelThreshold = 1.0001
)

// maxTreeKeys bounds what the router remembers per worker: about 4M
// tokens of prefixes at 16-token pages. Past it the oldest half goes.
const maxTreeKeys = 1 << 18

// approxTree is the router's guess of what one prefill worker caches: the
// chain keys (per tenant) of the full prompt pages it sent there, with when
// each was last sent. A guess only: the worker evicts on its own.
type approxTree struct {
	keys map[request.CacheKey]uint64
	tick uint64
}

// match is how many leading keys the tree holds.
func (t *approxTree) match(keys []request.CacheKey) int {
	if t == nil {
		return 0
	}
	n := 0
	for n < len(keys) {
		if _, ok := t.keys[keys[n]]; !ok {
			break
		}
		n++
	}
	return n
}

func (t *approxTree) size() int {
	if t == nil {
		return 0
	}
	return len(t.keys)
}

func (t *approxTree) insert(keys []request.CacheKey) {
	t.tick++
	for _, k := range keys {
		t.keys[k] = t.tick
	}
	if len(t.keys) <= maxTreeKeys {
		return
	}
	// Forget the older half: the entries last sent before the median tick.
	cut := t.tick - (t.tick-t.oldest())/2
	for k, at := range t.keys {
		if at < cut {
			delete(t.keys, k)
		}
	}
}

func (t *approxTree) oldest() uint64 {
	o := t.tick
	for _, at := range t.keys {
		o = min(o, at)
	}
	return o
}

// chooseCacheAware picks the worker of a role for a prompt whose page keys
// are keys. Load out of balance (the busiest has more than abs more
// requests than the idlest, and more than rel times as many) picks the
// idlest. Otherwise the worker holding the longest prefix takes it if that
// is more than the cache threshold of the prompt's pages; else the worker
// with the least cached (most room), ties to the less loaded. The chosen
// worker is then taken to hold the prompt's pages; held is how many of
// them it was thought to hold before.
func (r *Router) chooseCacheAware(ws []*worker, keys []request.CacheKey, role string) (best *worker, held int) {
	load := (*worker).prefillLoad
	if role == roleDecode {
		load = (*worker).decodeRunning
	}
	lo, hi := ws[0], ws[0]
	for _, w := range ws[1:] {
		if load(w) < load(lo) {
			lo = w
		}
		if load(w) > load(hi) {
			hi = w
		}
	}
	if l, h := load(lo), load(hi); h-l > r.balanceAbs && float64(h) > r.balanceRel*float64(l) {
		best = lo
	} else {
		bestMatch := -1
		for _, w := range ws {
			if m := w.tree.match(keys); m > bestMatch || (m == bestMatch && load(w) < load(best)) {
				best, bestMatch = w, m
			}
		}
		if len(keys) == 0 || float64(bestMatch) <= r.cacheThreshold*float64(len(keys)) {
			best = nil
			for _, w := range ws {
				if best == nil || w.tree.size() < best.tree.size() ||
					(w.tree.size() == best.tree.size() && load(w) < load(best)) {
					best = w
				}
			}
		}
	}
	held = best.tree.match(keys)
	if best.tree == nil {
		best.tree = &approxTree{keys: map[request.CacheKey]uint64{}}
	}
	best.tree.insert(keys)
	return best, held
}

// promptKeys are the page keys the cache_aware policy compares, at the
// page size of the pair's layout.
func promptKeys(tenant request.Salt, prompt []int32, pageSize int) []request.CacheKey {
	return prefixcache.ChainKeys(tenant, prompt, pageSize)
}
