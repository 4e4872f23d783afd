package grammar

import (
	"errors"
	"fmt"
)

// Matcher follows one sequence through a Compiled grammar. It is not safe
// for concurrent use; each sequence has its own.
//
// Each decoding step the engine calls FillMask, samples from the tokens it
// allows, and calls Accept with the chosen token. Accept of an
// end-of-generation token, allowed only once the grammar can end, ends the
// match.
type Matcher struct {
	c          *Compiled
	w          walker
	stacks     stackSet
	history    []stackSet // the stacks before each accepted token
	terminated bool
	heap       arena
	err        error
}

// ErrRejected is wrapped by the errors Accept returns for tokens the
// grammar does not allow.
var ErrRejected = errors.New("grammar: token not allowed")

// NewMatcher starts a sequence at the beginning of the grammar.
func (c *Compiled) NewMatcher() *Matcher {
	return &Matcher{c: c, w: walker{g: c.g}, stacks: c.init, heap: arena{heap: true}}
}

// IsTerminated reports whether an end-of-generation token was accepted.
func (m *Matcher) IsTerminated() bool { return m.terminated }

// CanEnd reports whether the text so far is a complete match.
func (m *Matcher) CanEnd() bool { return !m.terminated && hasEmpty(m.stacks) }

// Err reports why the matcher gave up, if it did: the grammar turned out
// too ambiguous to follow (ErrAmbiguous) or met too many states to keep
// masks for (ErrTooComplex). From then on FillMask allows
// only end-of-generation tokens, so the output stops short instead of
// breaking the grammar, and the engine should report the error.
func (m *Matcher) Err() error { return m.err }

// Accept advances past token id, or returns an error wrapping ErrRejected
// and leaves the state unchanged.
func (m *Matcher) Accept(id int32) (err error) {
	v := m.c.v
	if m.err != nil && !m.terminated {
		// The mask allows only the end now; taking it ends the sequence,
		// and Err still says why.
		if id >= 0 && int(id) < v.size && v.isEOG[id] {
			m.history = append(m.history, m.stacks)
			m.terminated = true
			return nil
		}
		return m.err
	}
	defer func() {
		// recover must be called here, by the deferred function itself.
		if p := recover(); p != nil {
			if _, ok := p.(ambiguous); !ok {
				panic(p)
			}
			err, m.err = ErrAmbiguous, ErrAmbiguous
		}
	}()
	if m.terminated {
		return fmt.Errorf("%w: %d after the end", ErrRejected, id)
	}
	if id < 0 || int(id) >= v.size {
		return fmt.Errorf("%w: %d is out of the vocabulary", ErrRejected, id)
	}
	if v.isEOG[id] {
		if !hasEmpty(m.stacks) {
			return fmt.Errorf("%w: end of generation (%d) before the grammar is complete", ErrRejected, id)
		}
		m.history = append(m.history, m.stacks)
		m.terminated = true
		return nil
	}
	b := v.bytes[id]
	if b == nil {
		return fmt.Errorf("%w: %d is a special token", ErrRejected, id)
	}
	cur := m.stacks
	for _, c := range b {
		cur = m.c.g.advance(cur, c, nil, &m.heap)
		if len(cur) == 0 {
			return fmt.Errorf("%w: %d (%q)", ErrRejected, id, b)
		}
	}
	m.history = append(m.history, m.stacks)
	m.stacks = cur
	return nil
}

// Rollback undoes the last n accepted tokens, as speculative decoding
// needs when drafted tokens are refused.
func (m *Matcher) Rollback(n int) error {
	if n < 0 || n > len(m.history) {
		return fmt.Errorf("grammar: cannot roll back %d of %d tokens", n, len(m.history))
	}
	if n == 0 {
		return nil
	}
	m.stacks = m.history[len(m.history)-n]
	clear(m.history[len(m.history)-n:])
	m.history = m.history[:len(m.history)-n]
	m.terminated = false
	return nil
}

// Accepted is the number of tokens accepted so far.
func (m *Matcher) Accepted() int { return len(m.history) }

// FillMask sets in mask (MaskWords long, one bit per token, bit id%64 of
// word id/64) exactly the tokens Accept would take next, and clears the
// rest. Once terminated, nothing is allowed.
func (m *Matcher) FillMask(mask []uint64) {
	clear(mask)
	if m.terminated {
		return
	}
	if m.err == nil {
		func() {
			defer catchAmbiguous(&m.err)
			m.fillMask(mask)
		}()
	}
	if m.err != nil {
		clear(mask)
		for _, id := range m.c.v.eogs {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
}

func (m *Matcher) fillMask(mask []uint64) {
	canEnd := false
	for _, f := range m.stacks {
		if f == nil {
			canEnd = true
			continue
		}
		cm := m.c.ctx(f, &m.w)
		cm.fill(mask)
		// A context that holds the whole stack has nothing below it: its
		// uncertain tokens would go on past the end of the grammar.
		if f.depth <= ctxFrames {
			continue
		}
		if t := cm.uncertainTrie(m.c.v); t != nil {
			m.w.walk(t, stackSet{f}, mask, nil)
		}
	}
	if canEnd {
		for _, id := range m.c.v.eogs {
			mask[id>>6] |= 1 << (id & 63)
		}
	}
}
