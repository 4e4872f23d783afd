// Package prefixcache finds the KV pages a prompt can reuse: an index of
// shared pool pages keyed by a hash chain per tenant.
//
// The rule it keeps (DESIGN.md, "Shared pages"): a request reads only KV it
// wrote itself, or KV in an immutable shared page whose contents were
// complete when it was shared and whose key is the hash of the same
// tenant's salt, the model and KV layout, and the exact tokens up to the
// end of that page. The key of page i is xxh3-128 of (key of page i-1, the
// page's tokens); the chain's root is xxh3-128 of (tenant salt, model
// fingerprint, layout). Two tenants' chains never meet, so one tenant's
// lookup can never find, or time, another's pages. The index also keeps
// each page's tokens and parent and compares them on lookup, so even a
// hash collision cannot hand out a page whose prefix differs.
package prefixcache

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/request"
)

// Salt separates tenants: pages found under one salt are never found
// under another. The zero Salt is a tenant like any other (no API key, no
// cache_salt).
type Salt = request.Salt

// Scope says what a tenant is.
type Scope string

// Scopes.
const (
	// ScopeKey (default): each API key (the bearer token the request
	// carries, hashed) is its own tenant, further split by cache_salt.
	ScopeKey Scope = "key"
	// ScopeGlobal shares pages across API keys; only cache_salt still
	// separates requests. For single-tenant deployments: a cache hit
	// answers faster, which another tenant can measure.
	ScopeGlobal Scope = "global"
)

// ParseScope checks a --prefix-cache-scope value.
func ParseScope(s string) (Scope, error) {
	switch Scope(s) {
	case ScopeKey, ScopeGlobal:
		return Scope(s), nil
	}
	return "", fmt.Errorf("prefix cache scope %q: want key or global", s)
}

// TenantSalt is the salt of a request that carried the bearer token apiKey
// ("" for none) and the cache_salt field cacheSalt ("" for none). It is the
// tenant's identity for anything cached across requests (KV pages here;
// compiled grammars may use it too), never the key itself.
func TenantSalt(scope Scope, apiKey, cacheSalt string) Salt {
	if scope == ScopeGlobal {
		apiKey = ""
	}
	// Length-prefixed, so that no (key, salt) pair reads as another.
	b := make([]byte, 0, 32+len(apiKey)+len(cacheSalt))
	b = append(b, "baton tenant\x00"...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(apiKey)))
	b = append(b, apiKey...)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(cacheSalt)))
	b = append(b, cacheSalt...)
	return Salt(xxh3.Hash128(b).Bytes())
}

// entry is one shared page in the index.
type entry struct {
	page   int32
	parent kvpool.CacheKey
	tokens []int32
	sum    uint64 // the page's checksum when it was published (with SetChecksum)
	salt   Salt
}

// Page is what the index knows of one cached page, handed to a lower tier
// (Lower) that keeps it after the pool lets it go.
type Page struct {
	Ref    kvpool.SharedRef
	Parent kvpool.CacheKey
	Tokens []int32
	Salt   Salt
	Sum    uint64 // the checksum recorded at publish
}

// Lower is a lower tier of the cache (host memory, files): told of every
// page published (for write-through), with the packed contents the
// checksum was taken over (nil without SetChecksum), so that a copy need
// not read the page again; and of every page eviction took from the pool,
// with what the index knew of it (found false for a page the index did
// not name: a duplicate, or one dropped).
type Lower interface {
	Published(p Page, packed []byte)
	Evicted(ref kvpool.SharedRef, p Page, found bool)
}

// Stats are the cache's figures.
type Stats struct {
	Pages         int    // pages in the index (pinned or not)
	QueriedTokens uint64 // prompt tokens looked up
	HitTokens     uint64 // of them, found cached
}

// Cache is the index of one pool's shared pages. Safe for concurrent use.
type Cache struct {
	pool        *kvpool.Pool
	pageSize    int
	fingerprint string

	mu    sync.Mutex
	index map[kvpool.CacheKey]entry
	// checksum, when set, records each page's checksum as it is published,
	// so that a reader can later prove the page did not change.
	checksum func(page int32) (packed []byte, sum uint64, err error)
	lower    Lower

	queried, hit atomic.Uint64
	guards       Guards
}

// Guards are the cache's isolation checks, each the function the cache
// calls at that point. A nil field is the real check, so the zero value
// keeps every check; only the faults build's command
// (cmd/baton/guards_faults.go, BATON_GUARDS_OFF) sets a field, to what a
// cache without the check would do.
type Guards struct {
	// Tenant is the salt a tenant's chain starts from: its own, so that no tenant reads another's pages (tenant_salt).
	Tenant func(Salt) Salt
}

func (g Guards) withChecks() Guards {
	if g.Tenant == nil {
		g.Tenant = func(s Salt) Salt { return s }
	}
	return g
}

// New makes the cache of pool's shared pages. fingerprint names the model
// (weights and configuration) so that pages of another model, or of the
// same one under another layout, never match; the pool's layout is added
// to it here. The pool's eviction hook is set to drop evicted pages. g
// are its guards (the zero value: every check).
func New(pool *kvpool.Pool, fingerprint string, g Guards) *Cache {
	cfg := pool.Config()
	c := &Cache{
		pool:     pool,
		pageSize: cfg.PageSize,
		fingerprint: fmt.Sprintf("%s|page %d layers %d kv heads %d head dim %d dtype %s",
			fingerprint, cfg.PageSize, cfg.Layers, cfg.KVHeads, cfg.HeadDim, cfg.KVDType),
		index:  map[kvpool.CacheKey]entry{},
		guards: g.withChecks(),
	}
	pool.SetEvictHook(c.evicted)
	return c
}

// SetChecksum makes Publish record each page's checksum (f reads the
// page's packed contents and sums them); Checksum returns it.
func (c *Cache) SetChecksum(f func(page int32) (packed []byte, sum uint64, err error)) {
	c.mu.Lock()
	c.checksum = f
	c.mu.Unlock()
}

// SetLower names the tier below the pool's pages.
func (c *Cache) SetLower(l Lower) {
	c.mu.Lock()
	c.lower = l
	c.mu.Unlock()
}

// Checksum is the checksum page had when it was published under key, if
// it is still cached there and one was recorded.
func (c *Cache) Checksum(key kvpool.CacheKey, page int32) (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.index[key]
	if !ok || e.page != page || c.checksum == nil {
		return 0, false
	}
	return e.sum, true
}

// PageSize is the number of tokens a cached page holds.
func (c *Cache) PageSize() int { return c.pageSize }

// root is the start of salt's chain.
func (c *Cache) root(salt Salt) kvpool.CacheKey {
	salt = c.guards.Tenant(salt)
	b := make([]byte, 0, 16+len(c.fingerprint)+16)
	b = append(b, salt[:]...)
	b = append(b, c.fingerprint...)
	return key(xxh3.Hash128(b))
}

func key(u xxh3.Uint128) kvpool.CacheKey { return kvpool.CacheKey{Hi: u.Hi, Lo: u.Lo} }

// next is the key of a page holding tokens after the page keyed parent.
func next(buf []byte, parent kvpool.CacheKey, tokens []int32) (kvpool.CacheKey, []byte) {
	buf = buf[:0]
	buf = binary.LittleEndian.AppendUint64(buf, parent.Hi)
	buf = binary.LittleEndian.AppendUint64(buf, parent.Lo)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, uint32(t))
	}
	return key(xxh3.Hash128(buf)), buf
}

// ChainKeys are the keys of the full pages of tokens under salt, with a
// chain of no model: for a router that guesses which worker holds a prefix
// (it compares them only with each other, never with a worker's keys).
func ChainKeys(salt Salt, tokens []int32, pageSize int) []kvpool.CacheKey {
	if pageSize <= 0 {
		return nil
	}
	c := &Cache{pageSize: pageSize, fingerprint: "router", guards: Guards{}.withChecks()}
	return c.Keys(salt, tokens)
}

// Keys are the chain keys of the full pages of tokens under salt.
func (c *Cache) Keys(salt Salt, tokens []int32) []kvpool.CacheKey {
	n := len(tokens) / c.pageSize
	keys := make([]kvpool.CacheKey, n)
	k, buf := c.root(salt), []byte(nil)
	for i := range n {
		k, buf = next(buf, k, tokens[i*c.pageSize:(i+1)*c.pageSize])
		keys[i] = k
	}
	return keys
}

// Lookup finds the longest run of cached full pages that prompt starts
// with under salt, leaving at least one token to compute (a step must
// produce the logits of the last prompt token). The pages are not pinned:
// the caller pins them with the pool's AllocPinned, which refuses any that
// was evicted meanwhile, and then counts what it used with Count.
func (c *Cache) Lookup(salt Salt, prompt []int32) []kvpool.SharedRef {
	limit := max(0, len(prompt)-1) / c.pageSize
	var refs []kvpool.SharedRef
	c.mu.Lock()
	k, buf := c.root(salt), []byte(nil)
	for i := range limit {
		toks := prompt[i*c.pageSize : (i+1)*c.pageSize]
		parent := k
		k, buf = next(buf, parent, toks)
		e, ok := c.index[k]
		if !ok || e.parent != parent || !equal(e.tokens, toks) {
			break
		}
		refs = append(refs, kvpool.SharedRef{Page: e.page, Key: k})
	}
	c.mu.Unlock()
	return refs
}

// Count records one admitted prompt: queried tokens looked up, hit of
// them read from the cache.
func (c *Cache) Count(queried, hit int) {
	c.queried.Add(uint64(queried))
	c.hit.Add(uint64(hit))
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Publish offers the full pages of tokens (whose KV owner wrote into
// pages, in order) to the cache under salt. A page already shared (the
// request found it in the cache, or published it before) is skipped, as is
// one whose key another page holds already (the same prefix computed twice
// at once: the copy stays private and is freed with its request). The pool
// refuses pages that are not complete or still have a writer; the first
// refusal ends the run. It returns how many pages it published.
func (c *Cache) Publish(salt Salt, owner kvpool.Owner, pages []int32, tokens []int32) (int, error) {
	keys := c.Keys(salt, tokens)
	n := min(len(keys), len(pages))
	published := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	parent := c.root(salt)
	for i := range n {
		k, id := keys[i], pages[i]
		if i > 0 {
			parent = keys[i-1]
		}
		if _, ok := c.index[k]; ok {
			continue
		}
		if c.pool.Info(id).State == kvpool.PageShared {
			continue
		}
		if err := c.pool.Publish(owner, id, k); err != nil {
			return published, err
		}
		e := entry{page: id, parent: parent, tokens: append([]int32(nil), tokens[i*c.pageSize:(i+1)*c.pageSize]...), salt: salt}
		var packed []byte
		if c.checksum != nil {
			// Read after Publish: the page can no longer change.
			var err error
			if packed, e.sum, err = c.checksum(id); err != nil {
				return published, err
			}
		}
		c.index[k] = e
		published++
		if c.lower != nil {
			c.lower.Published(e.info(k), packed)
		}
	}
	return published, nil
}

func (e entry) info(k kvpool.CacheKey) Page {
	return Page{Ref: kvpool.SharedRef{Page: e.page, Key: k}, Parent: e.parent, Tokens: e.tokens, Salt: e.salt, Sum: e.sum}
}

// Adopt ends a lower tier's load of p into page p.Ref.Page, allocated to
// owner and loading (kvpool.Pool.BeginLoad): the pool makes it shared with
// owner's pin, and the index names it under its key as if owner had
// published it. The caller has checked that what landed has p.Sum. It
// reports whether the page is now shared (false: owner let go of it
// meanwhile, and it was freed).
func (c *Cache) Adopt(owner kvpool.Owner, p Page) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok, err := c.pool.EndLoad(owner, p.Ref.Page, true)
	if !ok || err != nil {
		return ok, err
	}
	if _, dup := c.index[p.Ref.Key]; !dup {
		// A key indexed meanwhile (the same prefix loaded or computed at
		// once) keeps its page; this one is read by owner and then evicted.
		c.index[p.Ref.Key] = entry{page: p.Ref.Page, parent: p.Parent, tokens: p.Tokens, sum: p.Sum, salt: p.Salt}
	}
	return true, nil
}

// Root is the key a chain of salt starts from (the parent of its first
// page).
func (c *Cache) Root(salt Salt) kvpool.CacheKey { return c.root(salt) }

// Drop takes a page out of the index (its contents were found changed):
// no lookup finds it again, and the pool evicts it once nobody pins it.
func (c *Cache) Drop(ref kvpool.SharedRef) {
	c.evicted([]kvpool.SharedRef{ref})
}

// evicted is the pool's eviction hook: the pages are free now, their keys
// name nothing.
func (c *Cache) evicted(refs []kvpool.SharedRef) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range refs {
		e, ok := c.index[r.Key]
		ok = ok && e.page == r.Page
		if ok {
			delete(c.index, r.Key)
		}
		if c.lower != nil {
			c.lower.Evicted(r, e.info(r.Key), ok)
		}
	}
}

// Stats returns the cache's figures.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	n := len(c.index)
	c.mu.Unlock()
	return Stats{Pages: n, QueriedTokens: c.queried.Load(), HitTokens: c.hit.Load()}
}

// HitRate is hit tokens over queried tokens since the start (0 before any
// query).
func (s Stats) HitRate() float64 {
	if s.QueriedTokens == 0 {
		return 0
	}
	return float64(s.HitTokens) / float64(s.QueriedTokens)
}
