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

	// With useMemo, a walk of the whole vocabulary numbers the distinct
	// stack sets it meets and remembers each (set, byte) advance. Inside
	// free text every character leads back to the same set (built anew,
	// so equal only in structure); one lookup per trie node then replaces
	// expanding it again.
	useMemo bool
	ids     []int32            // canonical number of sets[d]
	canon   map[uint64][]int32 // setHash -> numbers of sets with that hash
	canonSt []stackSet         // the set of each number
	trans   map[transKey]int32
}

type transKey struct {
	id int32
	b  byte
}

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

// number returns the canonical number of s, keeping a copy of s if it is
// new.
func (w *walker) number(s stackSet) int32 {
	h := setHash(s)
	for _, id := range w.canon[h] {
		if sameSet(w.canonSt[id], s) {
			return id
		}
	}
	id := int32(len(w.canonSt))
	w.canonSt = append(w.canonSt, append(stackSet(nil), s...))
	w.canon[h] = append(w.canon[h], id)
	return id
}

// step advances sets[d-1] by c into sets[d], through the memo when on.
func (w *walker) step(d int, c byte) stackSet {
	from := w.sets[d-1]
	out := w.sets[d][:0]
	if !w.useMemo {
		return w.g.advance(from, c, out, &w.arena)
	}
	k := transKey{w.ids[d-1], c}
	if id, ok := w.trans[k]; ok {
		w.ids[d] = id
		return append(out, w.canonSt[id]...)
	}
	out = w.g.advance(from, c, out, &w.arena)
	id := w.number(out)
	w.trans[k] = id
	w.ids[d] = id
	return out
}

func (w *walker) resetMemo() {
	clear(w.canon)
	clear(w.trans)
	clear(w.canonSt)
	w.canonSt = w.canonSt[:0]
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
		w.ids = make([]int32, 1, 32)
	}
	w.arena.reset()
	w.sets[0] = append(w.sets[0][:0], init...)
	w.past[0] = false
	if w.useMemo {
		if w.canon == nil {
			w.canon = map[uint64][]int32{}
			w.trans = map[transKey]int32{}
		}
		w.resetMemo()
		w.ids[0] = w.number(init)
	}
	nodes := t.nodes
	for i := 0; i < len(nodes); {
		n := &nodes[i]
		d := int(n.depth)
		for len(w.sets) <= d {
			w.sets = append(w.sets, nil)
			w.past = append(w.past, false)
			w.ids = append(w.ids, 0)
		}
		past := w.past[d-1] || hasEmpty(w.sets[d-1])
		next := w.step(d, n.b)
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
		i++
	}
	// Drop references to frames so they can be collected.
	for d := range w.sets {
		clear(w.sets[d][:cap(w.sets[d])])
	}
	if w.useMemo {
		w.resetMemo()
	}
	w.arena.reset()
}
