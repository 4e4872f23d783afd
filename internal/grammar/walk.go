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
	}
	w.arena.reset()
	w.sets[0] = append(w.sets[0][:0], init...)
	w.past[0] = false
	nodes := t.nodes
	for i := 0; i < len(nodes); {
		n := &nodes[i]
		d := int(n.depth)
		for len(w.sets) <= d {
			w.sets = append(w.sets, nil)
			w.past = append(w.past, false)
		}
		from := w.sets[d-1]
		past := w.past[d-1] || hasEmpty(from)
		next := w.g.advance(from, n.b, w.sets[d][:0], &w.arena)
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
	w.arena.reset()
}
