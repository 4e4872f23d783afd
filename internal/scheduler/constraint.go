package scheduler

import (
	"errors"

	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

// Constraint restricts what a request may generate to a language: Kind is
// "json_object", "json_schema", "regex" or "ebnf" and Spec the schema,
// expression or grammar. The zero value constrains nothing.
type Constraint = request.Constraint

// Matcher follows one request's output through its constraint: FillMask
// sets in mask (at least MaskWords words, bit id%64 of word id/64) the
// tokens that may come next, Accept takes the token that was chosen.
type Matcher interface {
	MaskWords() int
	FillMask(mask []uint64)
	Accept(id int32) error
}

// Constrainer makes a request's Matcher; its error says why the constraint
// cannot be followed (a schema that does not compile, or output that does
// not follow it). tenant keeps compiled grammars apart per tenant, as the
// prefix cache keeps pages. output is what the request generated under c
// before it moved here (Params.Output): the matcher starts past it.
type Constrainer func(c Constraint, tenant prefixcache.Salt, output []int32) (Matcher, error)

// errNoConstraints: this engine was made without a Constrainer.
var errNoConstraints = errors.New("structured output (response_format, regex, ebnf) is not available on this server")
