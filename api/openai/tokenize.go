package openai

import (
	"encoding/json"
	"fmt"
	"maps"
)

// TokenizeRequest is a POST /tokenize body, as vLLM and SGLang take it:
// a completions prompt or a chat conversation, tokenized as the request
// it stands for would be.
type TokenizeRequest struct {
	// Model is the model the client named, "" when it named none.
	Model string
	// AddSpecialTokens (default true) adds BOS/EOS to a prompt as the
	// model asks.
	AddSpecialTokens bool
	// Exactly one of Chat ({"messages"}) and Completion ({"prompt"}) is set.
	Chat       *ChatRequest
	Completion *CompletionRequest
}

// ParseTokenizeRequest decodes a /tokenize body within the server's
// limits; model is optional.
func ParseTokenizeRequest(body []byte, lim Limits) (*TokenizeRequest, *Error) {
	f, e := decodeObject(body, lim)
	if e != nil {
		return nil, e
	}
	r := &TokenizeRequest{AddSpecialTokens: true}
	if r.Model, e = f.optionalModel(); e != nil {
		return nil, e
	}
	if v, ok, e := f.bool("add_special_tokens"); e != nil {
		return nil, e
	} else if ok {
		r.AddSpecialTokens = v
	}
	// The request parsers want a model; this one was checked already.
	g := maps.Clone(f)
	g["model"] = json.RawMessage(`"tokenize"`)
	if _, chat := f["messages"]; chat {
		r.Chat, e = parseChat(g, lim)
	} else {
		r.Completion, e = parseCompletion(g, lim)
	}
	if e != nil {
		return nil, e
	}
	return r, nil
}

// DetokenizeRequest is a POST /detokenize body.
type DetokenizeRequest struct {
	Model  string // "" when not given
	Tokens []int32
}

// ParseDetokenizeRequest decodes a /detokenize body: at most the context
// length of token ids (lim), each in [0, 2^31); the vocabulary is the
// server's to check.
func ParseDetokenizeRequest(body []byte, lim Limits) (*DetokenizeRequest, *Error) {
	f, e := decodeObject(body, lim)
	if e != nil {
		return nil, e
	}
	r := &DetokenizeRequest{}
	if r.Model, e = f.optionalModel(); e != nil {
		return nil, e
	}
	const msg = "tokens must be an array of token ids"
	raw, ok := f.get("tokens")
	if !ok {
		return nil, BadRequest(msg, "tokens")
	}
	max := lim.promptTokens() + 1
	ids, bad, tooMany, ok := decodeIDs(raw, max)
	switch {
	case tooMany:
		return nil, PromptTooLong(fmt.Sprintf("tokens may hold at most %d ids, the model's maximum context length", max), "tokens")
	case bad >= 0:
		// A number out of range names its element; anything else the field.
		param := "tokens"
		eachElement(raw, func(i int, el json.RawMessage) bool {
			if i == bad && isNumber(el) {
				param = fmt.Sprintf("tokens[%d]", i)
			}
			return i < bad
		})
		return nil, BadRequest("token ids must be integers of the vocabulary", param)
	case !ok:
		return nil, BadRequest(msg, "tokens")
	}
	r.Tokens = ids
	return r, nil
}

// optionalModel is the model field of a request that may leave it out.
func (f fields) optionalModel() (string, *Error) {
	m, _, e := f.string("model")
	return m, e
}
