package grammar

import (
	"math/bits"
	"sync"

	"github.com/batonlm/baton/internal/tokenizer"
)

// ctxFrames is how many top frames of a stack key the mask cache. More
// frames make fewer tokens uncertain (a loop written through a helper rule
// stays inside the cached context) but give more distinct contexts to
// compute.
const ctxFrames = 3

type ctxKey [ctxFrames]int32

func keyOf(f *frame) ctxKey {
	var k ctxKey
	for i := range k {
		if f == nil {
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
	dense     []uint64 // accepted tokens as a bitset, when there are many
	sparse    []int32  // accepted tokens as a list, when there are few
	uncertain *trie
}

// Compiled is a grammar bound to a vocabulary. It is safe for concurrent
// use and shared by all the Matchers of requests with the same grammar.
type Compiled struct {
	g    *Grammar
	v    *vocab
	init stackSet

	mu   sync.RWMutex
	ctxs map[ctxKey]*ctxMask
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
func (c *Compiled) ctx(f *frame, w *walker) *ctxMask {
	k := keyOf(f)
	c.mu.RLock()
	m := c.ctxs[k]
	c.mu.RUnlock()
	if m != nil {
		return m
	}
	var local *frame
	for i := ctxFrames - 1; i >= 0; i-- {
		if k[i] >= 0 {
			local = newFrame(k[i], local, &arena{heap: true})
		}
	}
	mask := make([]uint64, c.MaskWords())
	var unc []int32
	w.walk(c.v.trie, stackSet{local}, mask, &unc)
	m = &ctxMask{}
	n := 0
	for _, x := range mask {
		n += bits.OnesCount64(x)
	}
	if n*64 > c.v.size {
		m.dense = mask
	} else {
		m.sparse = make([]int32, 0, n)
		for i, x := range mask {
			for x != 0 {
				b := bits.TrailingZeros64(x)
				m.sparse = append(m.sparse, int32(i*64+b))
				x &= x - 1
			}
		}
	}
	if len(unc) > 0 {
		m.uncertain = newTrie(c.v.bytes, unc, true)
	}
	c.mu.Lock()
	if old := c.ctxs[k]; old != nil {
		m = old
	} else {
		c.ctxs[k] = m
	}
	c.mu.Unlock()
	return m
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
