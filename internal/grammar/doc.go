// Package grammar constrains decoding to a formal language: a JSON Schema,
// any JSON object, a regular expression or a GBNF grammar.
//
// Every front end lowers to one representation, a context-free grammar
// over bytes (Grammar). Rules are lists of alternatives, each a sequence of
// byte classes and references to other rules. Unicode character classes are
// expanded into UTF-8 byte sequences, so tokens that split a character
// (byte-fallback tokens, byte-level BPE) are handled like any other.
//
// A Matcher recognises a sequence with a pushdown automaton: its state is a
// set of stacks of grammar positions, persistent and shared between
// alternatives. The mask of allowed next tokens is computed by walking a
// byte trie of the vocabulary from the current stacks. Most of that walk
// depends only on the top few frames of a stack, so for each distinct top
// (Compiled.ctx) the tokens that are accepted regardless of what lies
// below are cached as a bitset, and only the remaining "uncertain" tokens,
// those that would pop past the cached frames, are walked each step against
// the real stack. Contexts are filled in lazily as sequences meet them, each
// derived from the context one frame shallower, and shared by every
// Matcher of the Compiled grammar; ForRequest keeps compiled grammars in a
// cache so that requests with the same schema share them.
//
// Left recursion is rejected when a grammar is built: the automaton expands
// rules eagerly and would not terminate on it. A grammar so ambiguous that
// its parse stacks multiply past a bound is given up on with ErrAmbiguous
// rather than followed at exponential cost.
//
// A vocabulary's trie is built once per *tokenizer.Tokenizer and kept for
// the life of the process, as tokenizers are.
//
// See ForRequest for how a decoding engine drives a Matcher.
package grammar
