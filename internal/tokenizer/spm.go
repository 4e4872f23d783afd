package tokenizer

// symbol is one piece of the text being merged: a byte span of the input
// linked to its neighbours. A merged-away symbol has n == 0.
type symbol struct {
	prev, next int32
	start, n   int32
}

// splitSymbols cuts s into one symbol per UTF-8 character. The length comes
// from the lead byte alone, as in llama.cpp, so malformed input still makes
// progress and keeps every byte.
func splitSymbols(s string, syms []symbol) []symbol {
	syms = syms[:0]
	for off := 0; off < len(s); {
		n := min(utf8Len(s[off]), len(s)-off)
		idx := int32(len(syms))
		syms = append(syms, symbol{prev: idx - 1, next: idx + 1, start: int32(off), n: int32(n)})
		off += n
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	return syms
}

func utf8Len(b byte) int {
	switch {
	case b < 0x80:
		return 1
	case b>>5 == 0x6:
		return 2
	case b>>4 == 0xe:
		return 3
	case b>>3 == 0x1e:
		return 4
	}
	return 1
}

// bigram is a candidate merge of two adjacent symbols. For SPM, key is the
// merged token's score (higher first); for BPE it is the merge rank (lower
// first), stored negated so one heap order serves both. size records the
// merged length so that stale entries, whose symbols changed since, can be
// recognised and skipped.
type bigram struct {
	key         float64
	left, right int32
	size        int32
}

// bigramHeap is a max-heap on key, ties going to the leftmost pair, the same
// order llama.cpp's priority queues use.
type bigramHeap []bigram

func (h bigramHeap) less(i, j int) bool {
	if h[i].key != h[j].key {
		return h[i].key > h[j].key
	}
	return h[i].left < h[j].left
}

func (h *bigramHeap) push(b bigram) {
	*h = append(*h, b)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *bigramHeap) pop() bigram {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	i := 0
	for {
		l, r := 2*i+1, 2*i+2
		m := i
		if l < len(s) && s.less(l, m) {
			m = l
		}
		if r < len(s) && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// mergeAll offers every adjacent pair to tryAdd (which pushes the ones that
// may merge onto h), then merges best first: a popped bigram merges only if
// both its symbols are still as they were when it was pushed, and the new
// symbol's neighbours are offered in turn.
func mergeAll(syms []symbol, h *bigramHeap, tryAdd func(left, right int32)) {
	for i := 1; i < len(syms); i++ {
		tryAdd(int32(i-1), int32(i))
	}
	for len(*h) > 0 {
		b := h.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		tryAdd(l.prev, b.left)
		tryAdd(b.left, l.next)
	}
}

// encodeSPM merges the symbols of s (already space-escaped) by token score,
// or by merge rank for tokenizer.json vocabularies, and appends the
// resulting ids to out.
func (t *Tokenizer) encodeSPM(s string, out []int32) []int32 {
	syms := splitSymbols(s, nil)
	if len(syms) == 0 {
		return out
	}
	h := make(bigramHeap, 0, len(syms))
	tryAdd := func(left, right int32) {
		if left < 0 || right < 0 {
			return
		}
		l, r := syms[left], syms[right]
		text := s[l.start : r.start+r.n]
		if t.merges != nil {
			rank, ok := t.merges[mergeKey{s[l.start : l.start+l.n], s[r.start : r.start+r.n]}]
			if ok {
				h.push(bigram{key: -float64(rank), left: left, right: right, size: int32(len(text))})
			}
			return
		}
		id, ok := t.toID[text]
		if !ok {
			return
		}
		h.push(bigram{key: float64(t.scores[id]), left: left, right: right, size: int32(len(text))})
	}
	mergeAll(syms, &h, tryAdd)
	lastUnk := false
	for i := int32(0); i != -1; i = syms[i].next {
		sym := syms[i]
		text := s[sym.start : sym.start+sym.n]
		if id, ok := t.toID[text]; ok {
			out = append(out, id)
			lastUnk = false
			continue
		}
		if t.hf != nil && !t.hf.byteFallback {
			// tokenizers: one unknown token per character, fused.
			if t.unk >= 0 && !(lastUnk && t.hf.fuseUnk) {
				out = append(out, t.unk)
			}
			lastUnk = true
			continue
		}
		// Every merge produces a vocabulary token, so only single
		// characters can be missing: spell them out byte by byte.
		for j := 0; j < len(text); j++ {
			out = t.appendByte(out, text[j])
		}
	}
	return out
}

// appendByte emits the byte-fallback token for c, or the unknown token when
// the vocabulary has no way to spell that byte.
func (t *Tokenizer) appendByte(out []int32, c byte) []int32 {
	if id := t.byteTok[c]; id >= 0 {
		return append(out, id)
	}
	if t.unk >= 0 {
		return append(out, t.unk)
	}
	return out
}
