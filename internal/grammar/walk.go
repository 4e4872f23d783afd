package grammar

// walker runs stack sets down a vocabulary trie. It keeps one stack set per
// trie depth so a walk allocates only the frames it creates.
type walker struct {
	g     *Grammar
	arena arena
	sets  []stackSet
	// past[d] says some stack emptied before depth d: the prefix reached
	// the bottom of the frames the walk started from and went on, so what
	// follows depends on frames the walk was not given.
	past []bool

	// memo remembers advances within one walk of the whole vocabulary.
	// Inside free text every character leads back to the same stack set
	// (built anew, so only equal in structure), and looking the set up is
	// far cheaper than expanding it again for each of the trie's nodes.
	useMemo bool
	hashes  []uint64 // setHash of sets[d]
	memo    map[memoKey]memoEntry
	memoBuf []*frame // backing store of the memo's sets
}

type memoKey struct {
	h uint64
	b byte
}

type memoEntry struct{ from, to stackSet }

// setHash is an order-independent hash of a stack set's structure.
func setHash(s stackSet) uint64 {
	var h uint64
	for _, f := range s {
		x := uint64(0x7A3F1C2B9D4E5F61)
		if f != nil {
			x = f.hash
		}
		x ^= x >> 31
		x *= 0xD6E8FEB86659FD93
		h += x ^ (x >> 29)
	}
	return h
}

func sameSet(a, b stackSet) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range a {
		found := false
		for _, y := range b {
			if sameStack(x, y) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// advance is Grammar.advance through the memo when it is on.
func (w *walker) advance(from stackSet, h uint64, c byte, out stackSet) stackSet {
	if !w.useMemo {
		return w.g.advance(from, c, out, &w.arena)
	}
	k := memoKey{h, c}
	if e, ok := w.memo[k]; ok && sameSet(e.from, from) {
		return append(out, e.to...)
	}
	out = w.g.advance(from, c, out, &w.arena)
	start := len(w.memoBuf)
	w.memoBuf = append(w.memoBuf, from...)
	w.memoBuf = append(w.memoBuf, out...)
	w.memo[k] = memoEntry{
		from: w.memoBuf[start : start+len(from) : start+len(from)],
		to:   w.memoBuf[start+len(from) : len(w.memoBuf) : len(w.memoBuf)],
	}
	return out
}

// walk sets in mask the bit of every token of t that some stack in init
// can consume entirely. When uncertain is not nil, tokens that can only be
// consumed by going past the bottom of init's stacks are appended to it in
// trie order; otherwise they count as rejected, which is right when init
// holds whole stacks, since nothing follows the end of the grammar.
func (w *walker) walk(t *trie, init stackSet, mask []uint64, uncertain *[]int32) {
	if len(w.sets) == 0 {
		w.sets = make([]stackSet, 1, 32)
		w.past = make([]bool, 1, 32)
		w.hashes = make([]uint64, 1, 32)
	}
	w.arena.reset()
	if w.useMemo {
		if w.memo == nil {
			w.memo = map[memoKey]memoEntry{}
		}
		clear(w.memo)
		clear(w.memoBuf)
		w.memoBuf = w.memoBuf[:0]
	}
	w.sets[0] = append(w.sets[0][:0], init...)
	w.past[0] = false
	if w.useMemo {
		w.hashes[0] = setHash(init)
	}
	nodes := t.nodes
	for i := 0; i < len(nodes); {
		n := &nodes[i]
		d := int(n.depth)
		for len(w.sets) <= d {
			w.sets = append(w.sets, nil)
			w.past = append(w.past, false)
			w.hashes = append(w.hashes, 0)
		}
		from := w.sets[d-1]
		past := w.past[d-1] || hasEmpty(from)
		next := w.advance(from, w.hashes[d-1], n.b, w.sets[d][:0])
		w.sets[d] = next
		if len(next) == 0 {
			if past && uncertain != nil {
				*uncertain = append(*uncertain, t.toks[n.tokLo:n.subtree]...)
			}
			i = int(n.next)
			continue
		}
		for _, id := range t.toks[n.tokLo:n.tokHi] {
			mask[id>>6] |= 1 << (id & 63)
		}
		w.past[d] = past
		if w.useMemo {
			w.hashes[d] = setHash(next)
		}
		i++
	}
	// Drop references to frames so they can be collected.
	for d := range w.sets {
		clear(w.sets[d][:cap(w.sets[d])])
	}
	if w.useMemo {
		clear(w.memo)
		clear(w.memoBuf)
		w.memoBuf = w.memoBuf[:0]
	}
	w.arena.reset()
}
