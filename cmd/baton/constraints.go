package main

import (
	"fmt"

	"github.com/batonlm/baton/internal/grammar"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// constraints compiles structured-output constraints against a
// vocabulary, once each: the server checks a request's with it before
// anything runs, and the engine makes each request's matcher from it.
//
// Entries are kept per tenant (the prefix cache's salt): an entry holds
// nothing of a request's prompt or output, but a warm one answers ~17 ms
// sooner than a first compile, which would tell one tenant that another
// sent the same schema recently. Per-request state (the matcher's stacks)
// is per request.
type constraints struct {
	tok   *tokenizer.Tokenizer
	cache *grammar.Cache
}

func newConstraints(tok *tokenizer.Tokenizer) *constraints {
	return &constraints{tok: tok, cache: grammar.NewCache(256)}
}

// check compiles c, for the server's 400.
func (cs *constraints) check(c scheduler.Constraint, tenant prefixcache.Salt) error {
	_, err := cs.cache.GetScoped(string(tenant[:]), c.Kind, c.Spec, cs.tok)
	return err
}

// matcher is a scheduler.Constrainer.
func (cs *constraints) matcher(c scheduler.Constraint, tenant prefixcache.Salt, output []int32) (scheduler.Matcher, error) {
	comp, err := cs.cache.GetScoped(string(tenant[:]), c.Kind, c.Spec, cs.tok)
	if err != nil {
		return nil, err
	}
	m := comp.NewMatcher()
	// A continuation of a request another pair failed mid-stream: its
	// output so far was chosen under this constraint, so the state the
	// next token is chosen in is past it.
	for _, id := range output {
		if err := m.Accept(id); err != nil {
			return nil, fmt.Errorf("the output generated so far does not follow the constraint at token %d: %w", id, err)
		}
	}
	return grammarMatcher{m, comp.MaskWords()}, nil
}

type grammarMatcher struct {
	*grammar.Matcher
	words int
}

func (m grammarMatcher) MaskWords() int { return m.words }
