package main

import (
	"github.com/batonlm/baton/internal/grammar"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// constraints compiles structured-output constraints against a
// vocabulary, once each: the server checks a request's with it before
// anything runs, and the engine makes each request's matcher from it.
//
// The cache is shared by all tenants on purpose: an entry is a function of
// the constraint's text and the vocabulary alone (automaton and token
// masks), never of a request's prompt or output, so another tenant can
// learn at most, from a fast first request, that the same schema text was
// compiled before. Per-request state (the matcher's stacks) is per request.
type constraints struct {
	tok   *tokenizer.Tokenizer
	cache *grammar.Cache
}

func newConstraints(tok *tokenizer.Tokenizer) *constraints {
	return &constraints{tok: tok, cache: grammar.NewCache(256)}
}

// check compiles c, for the server's 400.
func (cs *constraints) check(c scheduler.Constraint) error {
	_, err := cs.cache.Get(c.Kind, c.Spec, cs.tok)
	return err
}

// matcher is a scheduler.Constrainer.
func (cs *constraints) matcher(c scheduler.Constraint) (scheduler.Matcher, error) {
	comp, err := cs.cache.Get(c.Kind, c.Spec, cs.tok)
	if err != nil {
		return nil, err
	}
	return grammarMatcher{comp.NewMatcher(), comp.MaskWords()}, nil
}

type grammarMatcher struct {
	*grammar.Matcher
	words int
}

func (m grammarMatcher) MaskWords() int { return m.words }
