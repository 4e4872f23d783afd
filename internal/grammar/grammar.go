package grammar

import (
	"errors"
	"fmt"
	"strings"
)

const (
	elemEnd  = iota // ends an alternative: pop to the caller
	elemTerm        // one byte from classes[arg]
	elemRef         // the rule rules[arg]
)

type elem struct {
	kind uint8
	arg  int32
}

type rule struct {
	name string
	alts []int32 // start of each alternative in Grammar.elems
}

// Grammar is a context-free grammar over bytes, ready to be compiled
// against a vocabulary. It is immutable and safe for concurrent use.
type Grammar struct {
	elems   []elem
	rules   []rule
	classes []byteSet
	root    int32
}

// byteSet is a set of byte values.
type byteSet [4]uint64

func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }
func (s *byteSet) add(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s[c>>6] |= 1 << (c & 63)
	}
}

// maxElems bounds a grammar's size, since counted repetition can multiply
// a small pattern into a huge one.
const maxElems = 1 << 20

var errTooLarge = errors.New("grammar: too large")

type namedExpr struct {
	name string
	body expr
}

type builder struct {
	g        *Grammar
	ids      map[string]int32
	classIDs map[byteSet]int32
	helpers  map[string]int32
}

// build lowers named rules into a Grammar whose start symbol is root.
func build(defs []namedExpr, root string) (g *Grammar, err error) {
	b := &builder{
		g:        &Grammar{},
		ids:      map[string]int32{},
		classIDs: map[byteSet]int32{},
		helpers:  map[string]int32{},
	}
	for _, d := range defs {
		if _, dup := b.ids[d.name]; dup {
			return nil, fmt.Errorf("grammar: rule %q defined twice", d.name)
		}
		b.ids[d.name] = b.newRule(d.name)
	}
	r, ok := b.ids[root]
	if !ok {
		return nil, fmt.Errorf("grammar: no rule %q", root)
	}
	b.g.root = r
	defer func() {
		if p := recover(); p != nil {
			e, ok := p.(buildError)
			if !ok {
				panic(p)
			}
			g, err = nil, e.err
		}
	}()
	for _, d := range defs {
		b.setAlts(b.ids[d.name], d.body)
	}
	if err := b.g.checkLeftRecursion(); err != nil {
		return nil, err
	}
	return b.g, nil
}

// buildError carries an error out of the recursive lowering.
type buildError struct{ err error }

func (b *builder) fail(format string, args ...any) {
	panic(buildError{fmt.Errorf("grammar: "+format, args...)})
}

func (b *builder) newRule(name string) int32 {
	b.g.rules = append(b.g.rules, rule{name: name})
	return int32(len(b.g.rules) - 1)
}

// setAlts lowers body into the alternatives of rule id. A top-level
// alternation becomes the rule's own alternatives rather than a helper, so
// that loops written as alternations stay inside one rule and the mask
// cache sees them as one context.
func (b *builder) setAlts(id int32, body expr) {
	var bodies []expr
	if a, ok := body.(alt); ok {
		bodies = a
	} else {
		bodies = []expr{body}
	}
	seqs := make([][]elem, len(bodies))
	for i, x := range bodies {
		seqs[i] = b.lower(x, nil)
	}
	b.emit(id, seqs)
}

func (b *builder) emit(id int32, seqs [][]elem) {
	for _, s := range seqs {
		if len(b.g.elems)+len(s)+1 > maxElems {
			panic(buildError{errTooLarge})
		}
		b.g.rules[id].alts = append(b.g.rules[id].alts, int32(len(b.g.elems)))
		b.g.elems = append(b.g.elems, s...)
		b.g.elems = append(b.g.elems, elem{kind: elemEnd})
	}
}

func (b *builder) classID(s byteSet) int32 {
	if id, ok := b.classIDs[s]; ok {
		return id
	}
	b.g.classes = append(b.g.classes, s)
	id := int32(len(b.g.classes) - 1)
	b.classIDs[s] = id
	return id
}

func (b *builder) term(s byteSet) elem { return elem{kind: elemTerm, arg: b.classID(s)} }

// lower appends the elements matching x to out.
func (b *builder) lower(x expr, out []elem) []elem {
	if len(out) > maxElems {
		panic(buildError{errTooLarge})
	}
	switch x := x.(type) {
	case lit:
		for i := 0; i < len(x.s); i++ {
			var s byteSet
			s.add(x.s[i], x.s[i])
			out = append(out, b.term(s))
		}
		return out
	case class:
		return b.lowerClass(x, out)
	case seq:
		for _, y := range x {
			out = b.lower(y, out)
		}
		return out
	case alt:
		if len(x) == 1 {
			return b.lower(x[0], out)
		}
		id := b.newRule(fmt.Sprintf("alt%d", len(b.g.rules)))
		b.setAlts(id, x)
		return append(out, elem{kind: elemRef, arg: id})
	case ref:
		id, ok := b.ids[x.name]
		if !ok {
			b.fail("undefined rule %q", x.name)
		}
		return append(out, elem{kind: elemRef, arg: id})
	case rep:
		return b.lowerRep(x, out)
	}
	b.fail("unknown expression %T", x)
	return nil
}

func (b *builder) lowerRep(x rep, out []elem) []elem {
	if x.max >= 0 && x.min > x.max {
		b.fail("repetition {%d,%d} is empty", x.min, x.max)
	}
	if x.min > maxElems || x.max > maxElems {
		panic(buildError{errTooLarge})
	}
	unit := b.lower(x.x, nil)
	if len(unit) == 0 {
		return out
	}
	for range x.min {
		out = append(out, unit...)
		if len(out) > maxElems {
			panic(buildError{errTooLarge})
		}
	}
	if x.max < 0 {
		// S ::= unit S | ε, with the recursion in tail position so the
		// stack does not grow with the count.
		id := b.newRule(fmt.Sprintf("star%d", len(b.g.rules)))
		s := append(append([]elem(nil), unit...), elem{kind: elemRef, arg: id})
		b.emit(id, [][]elem{s, nil})
		return append(out, elem{kind: elemRef, arg: id})
	}
	// O_k ::= unit O_{k-1} | ε, nested so that at most max-min more units
	// fit and the grammar stays unambiguous.
	var prev int32 = -1
	for k := 1; k <= x.max-x.min; k++ {
		id := b.newRule(fmt.Sprintf("opt%d", len(b.g.rules)))
		s := append([]elem(nil), unit...)
		if prev >= 0 {
			s = append(s, elem{kind: elemRef, arg: prev})
		}
		b.emit(id, [][]elem{s, nil})
		prev = id
	}
	if prev >= 0 {
		out = append(out, elem{kind: elemRef, arg: prev})
	}
	return out
}

func (b *builder) lowerClass(c class, out []elem) []elem {
	if c.bytes {
		var s byteSet
		for i := 0; i+1 < len(c.ranges); i += 2 {
			lo, hi := c.ranges[i], c.ranges[i+1]
			if lo < 0 {
				lo = 0
			}
			if hi > 255 {
				hi = 255
			}
			if lo <= hi {
				s.add(byte(lo), byte(hi))
			}
		}
		return append(out, b.term(s))
	}
	r := normalizeRanges(c.ranges)
	var seqs [][]byteRange
	for i := 0; i+1 < len(r); i += 2 {
		seqs = utf8Sequences(r[i], r[i+1], seqs)
	}
	var single byteSet
	var multi [][]elem
	nsingle := 0
	for _, s := range seqs {
		if len(s) == 1 {
			single.add(s[0].lo, s[0].hi)
			nsingle++
			continue
		}
		e := make([]elem, len(s))
		for i, br := range s {
			var bs byteSet
			bs.add(br.lo, br.hi)
			e[i] = b.term(bs)
		}
		multi = append(multi, e)
	}
	switch {
	case len(multi) == 0:
		return append(out, b.term(single))
	case len(multi) == 1 && nsingle == 0:
		return append(out, multi[0]...)
	}
	key := fmt.Sprint(r)
	id, ok := b.helpers[key]
	if !ok {
		id = b.newRule(fmt.Sprintf("class%d", len(b.g.rules)))
		b.helpers[key] = id
		if nsingle > 0 {
			multi = append([][]elem{{b.term(single)}}, multi...)
		}
		b.emit(id, multi)
	}
	return append(out, elem{kind: elemRef, arg: id})
}

// checkLeftRecursion rejects a rule that can reach itself without
// consuming a byte: eager expansion would never finish.
func (g *Grammar) checkLeftRecursion() error {
	nullable := make([]bool, len(g.rules))
	for changed := true; changed; {
		changed = false
		for i, r := range g.rules {
			if nullable[i] {
				continue
			}
			for _, a := range r.alts {
				if g.nullableFrom(a, nullable) {
					nullable[i] = true
					changed = true
					break
				}
			}
		}
	}
	const (
		white = iota
		grey
		black
	)
	color := make([]uint8, len(g.rules))
	var visit func(r int32) error
	visit = func(r int32) error {
		color[r] = grey
		for _, a := range g.rules[r].alts {
			for p := a; g.elems[p].kind == elemRef; p++ {
				s := g.elems[p].arg
				switch color[s] {
				case grey:
					return fmt.Errorf("grammar: rule %q is left-recursive", g.rules[s].name)
				case white:
					if err := visit(s); err != nil {
						return err
					}
				}
				if !nullable[s] {
					break
				}
			}
		}
		color[r] = black
		return nil
	}
	for r := range g.rules {
		if color[r] == white {
			if err := visit(int32(r)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (g *Grammar) nullableFrom(p int32, nullable []bool) bool {
	for ; ; p++ {
		e := g.elems[p]
		switch e.kind {
		case elemEnd:
			return true
		case elemTerm:
			return false
		case elemRef:
			if !nullable[e.arg] {
				return false
			}
		}
	}
}

// String renders the grammar in a GBNF-like form, for debugging.
func (g *Grammar) String() string {
	var sb strings.Builder
	for i, r := range g.rules {
		fmt.Fprintf(&sb, "%s ::=", r.name)
		if int32(i) == g.root {
			sb.WriteString(" /*root*/")
		}
		for j, a := range r.alts {
			if j > 0 {
				sb.WriteString(" |")
			}
			for p := a; g.elems[p].kind != elemEnd; p++ {
				e := g.elems[p]
				if e.kind == elemRef {
					fmt.Fprintf(&sb, " %s", g.rules[e.arg].name)
				} else {
					sb.WriteString(" " + g.classes[e.arg].String())
				}
			}
			if g.elems[a].kind == elemEnd {
				sb.WriteString(" ()")
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

func (s *byteSet) String() string {
	var sb strings.Builder
	sb.WriteByte('[')
	for c := 0; c < 256; c++ {
		if !s.has(byte(c)) {
			continue
		}
		d := c
		for d+1 < 256 && s.has(byte(d+1)) {
			d++
		}
		if d == c {
			fmt.Fprintf(&sb, "%s", quoteByte(byte(c)))
		} else {
			fmt.Fprintf(&sb, "%s-%s", quoteByte(byte(c)), quoteByte(byte(d)))
		}
		c = d
	}
	sb.WriteByte(']')
	return sb.String()
}

func quoteByte(c byte) string {
	if c > 0x20 && c < 0x7f && c != ']' && c != '-' && c != '\\' {
		return string(rune(c))
	}
	return fmt.Sprintf("\\x%02X", c)
}
