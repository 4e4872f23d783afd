package grammar

import "errors"

// frame is one entry of a parse stack. The top frame's pos is always a
// terminal (a byte class) waiting for its byte; the frames below hold the
// positions to resume at when the rule above them ends. Frames are
// immutable and shared between stacks, so a set of alternative stacks costs
// little more than one.
//
// A nil *frame in a stack set is the empty stack: the start rule (or, in a
// cached local walk, the frames the walk was given) has been matched
// completely.
type frame struct {
	pos    int32
	depth  int32
	parent *frame
	hash   uint64
}

func newFrame(pos int32, parent *frame, a *arena) *frame {
	h := uint64(pos)*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	d := int32(1)
	if parent != nil {
		h ^= parent.hash*0xBF58476D1CE4E5B9 + (h << 6) + (h >> 2)
		d = parent.depth + 1
	}
	f := a.alloc()
	*f = frame{pos: pos, depth: d, parent: parent, hash: h}
	return f
}

// arena hands out frames that die with a walk: a mask walk creates a frame
// or more per trie node and keeps none, so it recycles them instead of
// leaving them to the garbage collector. A heap arena allocates normally,
// for frames that outlive the call (Accept).
//
// It also meters the work of one byte's advance. An ambiguous grammar can
// have exponentially many parse stacks (a rule that is the concatenation
// of two nullable copies of the next, many levels deep), which a stack-set
// recogniser would enumerate for ever; past a budget the advance gives up
// with ErrAmbiguous rather than hang a decoding thread.
type arena struct {
	heap  bool
	steps int
	// popped lists the frames this advance has already returned to. A
	// return to the same frame always expands the same way, and nullable
	// rules can reach one frame by many routes (three ways to skip each of
	// ten copies of ("0"*){0,2} make 3^10), so each is expanded once.
	popped []*frame
	chunks [][]frame
	chunk  int
	used   int
}

const (
	arenaChunk = 4096
	// maxSteps bounds the rule expansions of one byte's advance, and
	// maxStacks the parse stacks alive at once. Real grammars use a few
	// dozen of each.
	maxSteps  = 1 << 16
	maxStacks = 1 << 10
)

// ErrAmbiguous is reported, by Compile, Compiled.Warm, ForRequest and
// Matcher.Err, for a grammar that has too many parse stacks to follow.
var ErrAmbiguous = errors.New("grammar: too ambiguous to follow (too many parse stacks)")

// ambiguous is the panic value that carries ErrAmbiguous out of a deep
// expansion to the API boundary.
type ambiguous struct{}

func (a *arena) alloc() *frame {
	if a.heap {
		return new(frame)
	}
	if a.chunk == len(a.chunks) {
		a.chunks = append(a.chunks, make([]frame, arenaChunk))
	}
	f := &a.chunks[a.chunk][a.used]
	if a.used++; a.used == arenaChunk {
		a.chunk, a.used = a.chunk+1, 0
	}
	return f
}

// reset recycles every frame handed out; none may be in use.
func (a *arena) reset() {
	for i := 0; i <= a.chunk && i < len(a.chunks); i++ {
		clear(a.chunks[i])
	}
	a.chunk, a.used = 0, 0
}

func sameStack(a, b *frame) bool {
	for a != b {
		if a == nil || b == nil || a.pos != b.pos || a.hash != b.hash || a.depth != b.depth {
			return false
		}
		a, b = a.parent, b.parent
	}
	return true
}

// stackSet collects distinct stacks.
type stackSet []*frame

func (s stackSet) add(f *frame) stackSet {
	for _, g := range s {
		if sameStack(f, g) {
			return s
		}
	}
	if len(s) >= maxStacks {
		panic(ambiguous{})
	}
	return append(s, f)
}

// expand adds to s every stack reached from resuming at pos above parent
// without consuming a byte: rule references are entered and finished
// alternatives return to their caller.
func (g *Grammar) expand(pos int32, parent *frame, s stackSet, a *arena) stackSet {
	if a.steps++; a.steps > maxSteps {
		panic(ambiguous{})
	}
	e := g.elems[pos]
	switch e.kind {
	case elemTerm:
		return s.add(newFrame(pos, parent, a))
	case elemEnd:
		if parent == nil {
			return s.add(nil)
		}
		for _, p := range a.popped {
			if p == parent {
				return s
			}
		}
		a.popped = append(a.popped, parent)
		return g.expand(parent.pos, parent.parent, s, a)
	}
	cont := parent
	if g.elems[pos+1].kind != elemEnd {
		cont = newFrame(pos+1, parent, a)
	}
	// A reference in tail position returns straight to the caller, so
	// right recursion runs in constant stack depth.
	for _, alt := range g.rules[e.arg].alts {
		s = g.expand(alt, cont, s, a)
	}
	return s
}

// advance appends to out the stacks that follow from consuming c in any of
// the stacks in from.
func (g *Grammar) advance(from stackSet, c byte, out stackSet, a *arena) stackSet {
	a.steps = 0
	clear(a.popped)
	a.popped = a.popped[:0]
	for _, f := range from {
		if f == nil {
			continue
		}
		if g.classes[g.elems[f.pos].arg].has(c) {
			out = g.expand(f.pos+1, f.parent, out, a)
		}
	}
	return out
}

// initial is the stack set before any byte.
func (g *Grammar) initial() (s stackSet, err error) {
	defer catchAmbiguous(&err)
	a := &arena{heap: true}
	for _, alt := range g.rules[g.root].alts {
		s = g.expand(alt, nil, s, a)
	}
	return s, nil
}

// catchAmbiguous turns the ambiguous and tooComplex panics into their
// errors.
func catchAmbiguous(err *error) {
	if p := recover(); p != nil {
		switch p.(type) {
		case ambiguous:
			*err = ErrAmbiguous
		case tooComplex:
			*err = ErrTooComplex
		default:
			panic(p)
		}
	}
}

func hasEmpty(s stackSet) bool {
	for _, f := range s {
		if f == nil {
			return true
		}
	}
	return false
}
