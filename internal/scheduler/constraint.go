package scheduler

import (
	"errors"
	"fmt"

	"github.com/batonlm/baton/internal/prefixcache"
)

// Constraint restricts what a request may generate to a language: Kind is
// "json_object", "json_schema", "regex" or "ebnf" and Spec the schema,
// expression or grammar. The zero value constrains nothing.
type Constraint struct {
	Kind, Spec string
}

// Matcher follows one request's output through its constraint: FillMask
// sets in mask (at least MaskWords words, bit id%64 of word id/64) the
// tokens that may come next, Accept takes the token that was chosen.
type Matcher interface {
	MaskWords() int
	FillMask(mask []uint64)
	Accept(id int32) error
}

// Constrainer makes a request's Matcher; its error says why the constraint
// cannot be followed (a schema that does not compile). tenant keeps
// compiled grammars apart per tenant, as the prefix cache keeps pages.
type Constrainer func(c Constraint, tenant prefixcache.Salt) (Matcher, error)

// errNoConstraints: this engine was made without a Constrainer.
var errNoConstraints = errors.New("structured output (response_format, regex, ebnf) is not available on this server")

// allowed fills e.allow with the tokens r's constraint lets come next, or
// returns nil when r has none. The matcher is made on first use, on the
// engine loop, so that it follows every token of r from its first.
func (e *Engine) allowed(r *Request) ([]uint64, error) {
	if r.Params.Constraint.Kind == "" {
		return nil, nil
	}
	if r.matcher == nil {
		if e.cfg.Constrain == nil {
			return nil, errNoConstraints
		}
		m, err := e.cfg.Constrain(r.Params.Constraint, r.Params.Tenant)
		if err != nil {
			return nil, fmt.Errorf("constraint: %w", err)
		}
		r.matcher = m
	}
	words := max(r.matcher.MaskWords(), (e.model.Config.Vocab+63)/64)
	if cap(e.allow) < words {
		e.allow = make([]uint64, words)
	}
	e.allow = e.allow[:words]
	r.matcher.FillMask(e.allow)
	return e.allow, nil
}

// follow tells r's matcher which token was chosen (or, on decode, which
// token prefill chose); a token the constraint refuses fails the request.
func (e *Engine) follow(r *Request, id int32) error {
	if r.Params.Constraint.Kind == "" {
		return nil
	}
	if r.matcher == nil {
		if _, err := e.allowed(r); err != nil {
			return err
		}
	}
	if err := r.matcher.Accept(id); err != nil {
		return fmt.Errorf("constraint refused token %d: %w", id, err)
	}
	return nil
}
