package grammar

import (
	"container/list"
	"fmt"
	"sync"

	"github.com/batonlm/baton/internal/tokenizer"
)

// The kinds of constraint a request can carry.
const (
	KindJSONObject = "json_object" // any JSON object; spec is ignored
	KindJSONSchema = "json_schema" // spec is the schema itself, not its OpenAI wrapper
	KindRegex      = "regex"
	KindEBNF       = "ebnf" // GBNF; "gbnf" and "grammar" are accepted too
)

// Parse builds the grammar of one kind of constraint.
func Parse(kind, spec string) (*Grammar, error) {
	switch kind {
	case KindJSONObject:
		return JSONObject(), nil
	case KindJSONSchema:
		return FromJSONSchema(spec)
	case KindRegex:
		return FromRegex(spec)
	case KindEBNF, "gbnf", "grammar":
		return FromGBNF(spec)
	case KindToolCalls:
		return FromToolCalls(spec)
	}
	return nil, fmt.Errorf("grammar: unknown constraint kind %q", kind)
}

// Cache holds compiled grammars by (kind, spec, vocabulary), so a schema
// that many requests share is parsed once and its context masks, filled
// in as requests meet them, are shared too. Failures are cached as well,
// so a bad schema repeated does not cost a parse each time.
type Cache struct {
	mu    sync.Mutex
	max   int
	items map[cacheKey]*list.Element
	lru   list.List // of *cacheItem, most recent first
}

type cacheKey struct {
	scope, kind, spec string
	tok               *tokenizer.Tokenizer
}

type cacheItem struct {
	key  cacheKey
	once sync.Once
	c    *Compiled
	err  error
}

// NewCache makes a cache of at most max compiled grammars.
func NewCache(max int) *Cache {
	return &Cache{max: max, items: map[cacheKey]*list.Element{}}
}

// Get returns the compiled grammar, compiling it on first use. Callers
// asking for the same grammar at once wait for one compilation.
func (c *Cache) Get(kind, spec string, tok *tokenizer.Tokenizer) (*Compiled, error) {
	return c.GetScoped("", kind, spec, tok)
}

// GetScoped is Get with entries kept apart by scope: a grammar compiled in
// one scope is never found warm from another, so a fast answer tells a
// tenant only about its own earlier requests.
func (c *Cache) GetScoped(scope, kind, spec string, tok *tokenizer.Tokenizer) (*Compiled, error) {
	if kind == KindJSONObject {
		spec = ""
	}
	k := cacheKey{scope, kind, spec, tok}
	c.mu.Lock()
	e, ok := c.items[k]
	if ok {
		c.lru.MoveToFront(e)
	} else {
		e = c.lru.PushFront(&cacheItem{key: k})
		c.items[k] = e
		for c.lru.Len() > c.max {
			last := c.lru.Back()
			c.lru.Remove(last)
			delete(c.items, last.Value.(*cacheItem).key)
		}
	}
	it := e.Value.(*cacheItem)
	c.mu.Unlock()
	it.once.Do(func() {
		g, err := Parse(kind, spec)
		if err != nil {
			it.err = err
			return
		}
		c, err := Compile(g, tok)
		if err == nil {
			err = c.Warm()
		}
		if err != nil {
			it.err = err
			return
		}
		it.c = c
	})
	return it.c, it.err
}

// Len is the number of grammars held.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lru.Len()
}

var defaultCache = NewCache(256)

// ForRequest returns the compiled grammar of a request's constraint from
// a process-wide cache. kind is one of KindJSONObject, KindJSONSchema,
// KindRegex or KindEBNF.
//
// The engine gives each constrained sequence its own Matcher
// (Compiled.NewMatcher) and, every decoding step:
//
//  1. m.FillMask(mask), with mask of Compiled.MaskWords() words;
//  2. sets the logits of tokens whose bit is clear to -Inf, then samples
//     (logit processors and penalties before, so that they cannot
//     re-allow a token);
//  3. m.Accept(token); an error means the sampler ignored the mask and the
//     sequence should be aborted;
//  4. stops when m.IsTerminated() (an end-of-generation token was taken,
//     which the mask allows only once the grammar is complete). When
//     max_tokens runs out first, the output is a truncated prefix.
//
// The mask can be computed on the CPU while the GPU runs the forward pass
// of the same step. For speculative decoding, Accept each draft token in
// turn (stopping at the first refused) and Rollback the ones the target
// model rejects.
func ForRequest(kind, spec string, tok *tokenizer.Tokenizer) (*Compiled, error) {
	return defaultCache.Get(kind, spec, tok)
}
