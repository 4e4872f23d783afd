package grammar

import (
	"errors"
	"math/bits"
	"sync"

	"github.com/batonlm/baton/internal/tokenizer"
)

// ctxFrames is how many top frames of a stack key the mask cache. More
// frames make fewer tokens uncertain (a loop written through a helper rule
// stays inside the cached context) but give more distinct contexts; each
// deeper one costs little, being derived from the one above it.
const ctxFrames = 5

type ctxKey [ctxFrames]int32

// ErrTooComplex: the grammar met more distinct contexts than one grammar
// may keep masks for (contextBudget). Each context holds up to a bit per
// token, so a pattern whose every position is a new state (a bounded
// repetition in the thousands) would otherwise grow without end.
var ErrTooComplex = errors.New("grammar: too many distinct states to follow (simplify the schema, pattern or grammar)")

// tooComplex is the panic value that carries ErrTooComplex out of a deep
// context derivation to the API boundary.
type tooComplex struct{}

// contextBudget is the most bytes of context masks one compiled grammar
// keeps; a context past it fails the request instead.
var contextBudget = 64 << 20

// keyOf is the context of the top n frames of f.
func keyOf(f *frame, n int) ctxKey {
	var k ctxKey
	for i := range k {
		if f == nil || i >= n {
			k[i] = -1
			continue
		}
		k[i] = f.pos
		f = f.parent
	}
	return k
}

// ctxMask is what the vocabulary does from one context: the tokens
// accepted whatever lies below it, and the trie of those that depend on it.
type ctxMask struct {
	// base is the shallower context this one was derived from: its
	// accepted tokens are accepted here too and are not stored again, which
	// keeps deep contexts small.
	base   *ctxMask
	dense  []uint64 // accepted tokens as a bitset, when there are many
	sparse []int32  // accepted tokens as a list, when there are few
	unc    []int32  // uncertain tokens in trie order
	// many says unc was dropped for being most of the vocabulary: a
	// deeper context then walks the whole trie, and at run time this
	// context is only used for stacks it covers entirely.
	many bool
	// uncertain is the trie of unc, built on first use: a shallow context
	// whose uncertain tokens are most of the vocabulary is only a step to
	// deeper ones, which walk the whole trie instead.
	once      sync.Once
	uncertain *trie
}

func (m *ctxMask) uncertainTrie(v *vocab) *trie {
	m.once.Do(func() {
		if len(m.unc) > 0 {
			m.uncertain = newTrie(v.bytes, m.unc, true)
		}
	})
	return m.uncertain
}

// Compiled is a grammar bound to a vocabulary. It is safe for concurrent
// use and shared by all the Matchers of requests with the same grammar.
type Compiled struct {
	g    *Grammar
	v    *vocab
	init stackSet

	mu   sync.RWMutex
	ctxs map[ctxKey]*ctxMask
	// ctxBytes is what ctxs hold, counted as each is added.
	ctxBytes int
}

// Compile binds g to the vocabulary of tok.
func Compile(g *Grammar, tok *tokenizer.Tokenizer) (*Compiled, error) {
	init, err := g.initial()
	if err != nil {
		return nil, err
	}
	return &Compiled{g: g, v: vocabOf(tok), init: init, ctxs: map[ctxKey]*ctxMask{}}, nil
}

// VocabSize is the number of tokens a mask covers.
func (c *Compiled) VocabSize() int { return c.v.size }

// MaskWords is the length of the mask FillMask expects.
func (c *Compiled) MaskWords() int { return (c.v.size + 63) / 64 }

// Grammar is the grammar c was compiled from.
func (c *Compiled) Grammar() *Grammar { return c.g }

// ctx returns the cached mask of the context at the top of f, computing it
// on first use. Contexts are computed lazily because which ones occur
// depends on the text, and most grammars only ever meet a few.
func (c *Compiled) ctx(f *frame, w *walker) *ctxMask { return c.ctxN(f, ctxFrames, w) }

// ctxN is the context of the top n frames of f. It is derived from the
// context of n-1 frames: what that accepts or refuses holds whatever lies
// below, so only its uncertain tokens are walked again. Contexts that share
// their top frames (the strings of every property of a schema) thus share
// the one walk of the whole vocabulary.
func (c *Compiled) ctxN(f *frame, n int, w *walker) *ctxMask {
	if int(f.depth) < n {
		n = int(f.depth)
	}
	k := keyOf(f, n)
	c.mu.RLock()
	m := c.ctxs[k]
	c.mu.RUnlock()
	if m != nil {
		return m
	}
	c.mu.RLock()
	full := c.ctxBytes >= contextBudget
	c.mu.RUnlock()
	if full {
		panic(tooComplex{})
	}
	var base *ctxMask
	if n > 1 {
		base = c.ctxN(f, n-1, w)
	}
	var local *frame
	for i := n - 1; i >= 0; i-- {
		local = newFrame(k[i], local, &arena{heap: true})
	}
	mask := make([]uint64, c.MaskWords())
	var unc []int32
	m = &ctxMask{}
	switch {
	case base == nil || base.many:
		w.useMemo = true
		w.walk(c.v.trie, stackSet{local}, mask, &unc)
		w.useMemo = false
	default:
		m.base = base
		if t := base.uncertainTrie(c.v); t != nil {
			w.walk(t, stackSet{local}, mask, &unc)
		}
	}
	m.unc = unc
	if n < ctxFrames && len(unc) > c.v.size/4 {
		m.unc, m.many = nil, true
	}
	count := 0
	for _, x := range mask {
		count += bits.OnesCount64(x)
	}
	if count*64 > c.v.size {
		m.dense = mask
	} else {
		m.sparse = make([]int32, 0, count)
		for i, x := range mask {
			for x != 0 {
				b := bits.TrailingZeros64(x)
				m.sparse = append(m.sparse, int32(i*64+b))
				x &= x - 1
			}
		}
	}
	c.mu.Lock()
	if old := c.ctxs[k]; old != nil {
		m = old
	} else {
		c.ctxs[k] = m
		c.ctxBytes += 8*len(m.dense) + 4*len(m.sparse) + 4*len(m.unc) + 64
	}
	c.mu.Unlock()
	return m
}

// fill ors the context's accepted tokens into mask.
func (m *ctxMask) fill(mask []uint64) {
	if m.base != nil {
		m.base.fill(mask)
	}
	for i, x := range m.dense {
		mask[i] |= x
	}
	for _, id := range m.sparse {
		mask[id>>6] |= 1 << (id & 63)
	}
}

// Warm computes the contexts of the initial state, so a first request
// does not pay for them inside its first decoding step.
func (c *Compiled) Warm() (err error) {
	defer catchAmbiguous(&err)
	w := &walker{g: c.g}
	for _, f := range c.init {
		if f != nil {
			c.ctx(f, w)
		}
	}
	return nil
}

// cacheBytes estimates the memory held by the context cache.
func (c *Compiled) cacheBytes() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for _, m := range c.ctxs {
		n += 8*len(m.dense) + 4*len(m.sparse) + 4*len(m.unc)
		if m.uncertain != nil {
			n += 20*len(m.uncertain.nodes) + 4*len(m.uncertain.toks)
		}
	}
	return n
}
