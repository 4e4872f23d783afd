package grammar

import (
	"bytes"
	"slices"
	"sync"

	"github.com/batonlm/baton/internal/tokenizer"
)

// vocab is a tokenizer's vocabulary as the matcher sees it: each token's
// bytes, and a trie over them laid out in depth-first order.
type vocab struct {
	size  int
	bytes [][]byte // nil for tokens never allowed by a grammar
	eogs  []int32  // allowed exactly when the grammar can end
	isEOG []bool
	trie  *trie
}

// trie is a byte trie in depth-first (sorted) order, so that a subtree is
// a contiguous run of nodes and of tokens and a rejected prefix is skipped
// in one jump.
type trie struct {
	nodes []trieNode
	toks  []int32 // token ids sorted by their bytes
}

type trieNode struct {
	b       byte
	depth   int32 // bytes from the root; 1 for the root's children
	next    int32 // the node after this subtree
	tokLo   int32 // toks[tokLo:tokHi] are exactly this prefix
	tokHi   int32
	subtree int32 // toks[tokLo:subtree] all start with this prefix
}

var vocabs sync.Map // *tokenizer.Tokenizer -> *vocab

// vocabOf builds the vocabulary of tok once per tokenizer.
func vocabOf(tok *tokenizer.Tokenizer) *vocab {
	if v, ok := vocabs.Load(tok); ok {
		return v.(*vocab)
	}
	n := tok.VocabSize()
	v := &vocab{size: n, bytes: make([][]byte, n), isEOG: make([]bool, n)}
	v.eogs = tok.EOGs()
	for _, id := range v.eogs {
		v.isEOG[id] = true
	}
	var ids []int32
	for id := int32(0); int(id) < n; id++ {
		if v.isEOG[id] || tok.IsControl(id) {
			continue
		}
		s := tok.TokenText(id)
		if s == "" {
			continue
		}
		v.bytes[id] = []byte(s)
		ids = append(ids, id)
	}
	v.trie = newTrie(v.bytes, ids, false)
	got, _ := vocabs.LoadOrStore(tok, v)
	return got.(*vocab)
}

// newTrie builds the trie of the given tokens. sorted says ids are already
// in byte order.
func newTrie(tokBytes [][]byte, ids []int32, sorted bool) *trie {
	if !sorted {
		ids = slices.Clone(ids)
		slices.SortStableFunc(ids, func(a, b int32) int { return bytes.Compare(tokBytes[a], tokBytes[b]) })
	}
	t := &trie{toks: ids}
	var path []int32 // node index per depth-1
	var prev []byte
	for i, id := range ids {
		cur := tokBytes[id]
		lcp := 0
		for lcp < len(prev) && lcp < len(cur) && prev[lcp] == cur[lcp] {
			lcp++
		}
		for len(path) > lcp {
			t.close(path[len(path)-1], int32(i))
			path = path[:len(path)-1]
		}
		for d := lcp; d < len(cur); d++ {
			t.nodes = append(t.nodes, trieNode{b: cur[d], depth: int32(d + 1), tokLo: int32(i), tokHi: int32(i)})
			path = append(path, int32(len(t.nodes)-1))
		}
		// Tokens with identical bytes share the node.
		last := path[len(path)-1]
		if t.nodes[last].tokHi == int32(i) {
			t.nodes[last].tokHi = int32(i + 1)
		}
		prev = cur
	}
	for len(path) > 0 {
		t.close(path[len(path)-1], int32(len(ids)))
		path = path[:len(path)-1]
	}
	return t
}

func (t *trie) close(n, tokEnd int32) {
	t.nodes[n].next = int32(len(t.nodes))
	t.nodes[n].subtree = tokEnd
}
