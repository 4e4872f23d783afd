package main

import (
	"github.com/batonlm/baton/internal/grammar"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// constraints compiles structured-output constraints against a
// vocabulary, once each: the server checks a request's with it before
// anything runs, and the engine makes each request's matcher from it.
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
