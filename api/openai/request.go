package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Limits as in OpenAI's API reference, so that what OpenAI rejects is
// rejected here too and client code tested against one works on the other.
const (
	MaxCompletionLogprobs = 5   // legacy completions "logprobs"
	MaxChatTopLogprobs    = 20  // chat "top_logprobs"
	MaxLogitBias          = 300 // logit_bias entries
	MaxLogitBiasValue     = 100 // |bias|; -100 bans a token in practice
)

// Bounds of this server's own. OpenAI allows 4 stop strings; vLLM and SGLang
// any number. Each pending stop costs hold-back work on every token, so the
// count and length are bounded rather than unlimited.
const (
	MaxStop      = 64  // stop strings per request
	MaxStopBytes = 512 // bytes per stop string
	MaxN         = 128 // choices per request (OpenAI's limit for chat)
	// MaxPrompts bounds a completions batch (a list of prompts): each
	// prompt's choices are generations of their own, held at once.
	MaxPrompts = 128
	// MaxBatchChoices bounds a batch's choices, prompts times n.
	MaxBatchChoices = 1024
)

// DefaultCompletionMaxTokens is the legacy completions endpoint's documented
// max_tokens default, for a model without one of its own; chat has none (up
// to the context).
const DefaultCompletionMaxTokens = 16

const (
	// maxTokensLimit keeps token counts inside int32 so that prompt length
	// plus max_tokens cannot overflow anywhere downstream.
	maxTokensLimit     = math.MaxInt32
	defaultTemperature = 1.0 // OpenAI's default
	defaultTopP        = 1.0
	maxTemperature     = 2.0
)

// Chat roles accepted in messages.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
	RoleDeveloper = "developer"
	RoleTool      = "tool"
)

// Sampling is the normalised generation control of a request: defaults
// filled in, aliases resolved and every value range-checked, so that the
// engine never has to look at the request's JSON.
type Sampling struct {
	// MaxTokens is the completion-token limit; 0 means the client gave none
	// and the server's own limit (context length) applies.
	MaxTokens   int
	Temperature float64 // 0..2, default 1; 0 means greedy
	TopP        float64 // (0,1], default 1
	TopK        int     // 0 = off, else >= 1 (the wire's -1 is mapped to 0)
	MinP        float64 // 0..1, 0 = off
	Seed        *int64  // nil = not seeded
	Stop        []string
	// StopTokenIDs end generation when sampled (vLLM/SGLang extension);
	// range-checked against int32 only: the vocabulary size is the server's.
	StopTokenIDs []int32
	// Logprobs asks for the sampled token's logprob; TopLogprobs for that many
	// alternatives as well (completions: 0..5, chat: 0..20).
	Logprobs    bool
	TopLogprobs int
	IgnoreEOS   bool // keep generating past end-of-sequence (extension)
	// LogitBias is added to the logits of its tokens before sampling; ids
	// are checked against int32 only, the vocabulary is the server's.
	LogitBias map[int32]float64
	// PresencePenalty and FrequencyPenalty follow OpenAI (-2..2, over the
	// generated tokens); RepetitionPenalty follows vLLM/SGLang (over prompt
	// and generated tokens, (0,2], 1 = off).
	PresencePenalty, FrequencyPenalty, RepetitionPenalty float64
	// MinTokens is how many tokens must be generated before EOS, a stop
	// token or a stop string may end the completion (vLLM extension).
	MinTokens int
	// N is the number of independent choices, 1..MaxN.
	N int
	// CacheSalt (vLLM's cache_salt) splits the request's tenant in the
	// prefix cache: only requests with the same salt (and API key) share
	// cached KV pages.
	CacheSalt string
	// Constraint, when Kind is set, restricts the output to a language:
	// response_format's json_object or json_schema, or SGLang's regex and
	// ebnf fields.
	Constraint Constraint
	// Given says which of the fields above the request set itself, so a
	// server can fill the others from the model's own defaults
	// (generation_config.json) rather than OpenAI's.
	Given Given
}

// Constraint names a structured-output language: Kind is "json_object",
// "json_schema" (Spec the schema's JSON), "regex" or "ebnf" (Spec the
// expression or grammar). The server compiles it against its vocabulary;
// a spec that does not compile is a 400 there.
type Constraint struct {
	Kind, Spec string
}

// maxCacheSaltBytes bounds cache_salt, which is hashed into every lookup.
const maxCacheSaltBytes = 1024

// maxConstraintBytes bounds a schema, regex or grammar: compiling one is
// work the server does before it answers.
const maxConstraintBytes = 64 << 10

// Given marks the sampling fields a request set explicitly.
type Given struct {
	Temperature, TopP, TopK, MinP bool
}

// samplingEps is the smallest temperature that samples, as vLLM's
// _SAMPLING_EPS: dividing logits by less overflows them, so a smaller one
// is greedy (the engine's model.SamplingEps).
const samplingEps = 1e-5

// Greedy reports whether sampling reduces to argmax, so an engine can skip
// the random draw and return reproducible output.
func (s Sampling) Greedy() bool { return s.Temperature < samplingEps || s.TopK == 1 }

// Prompt is one completions prompt: exactly one of Text and TokenIDs is
// set, as the wire's prompt may be text or pre-tokenised ids, and ids skip
// the tokenizer.
type Prompt struct {
	Text     string
	TokenIDs []int32
}

// CompletionRequest is a validated POST /v1/completions body.
type CompletionRequest struct {
	Model string
	// Prompt and PromptTokenIDs are the first prompt (see Prompt);
	// Prompts holds them all, in order: a list of prompts is one request
	// answered with n choices per prompt, prompt p's choice i at index
	// p*n+i, as OpenAI, vLLM and llama.cpp serve it.
	Prompt         string
	PromptTokenIDs []int32
	Prompts        []Prompt
	Stream         bool
	// IncludeUsage asks for a final stream chunk carrying usage (only ever
	// true when Stream is).
	IncludeUsage bool
	// Echo puts the prompt in front of each choice's text (and, with
	// logprobs, the prompt's tokens in front of its logprobs).
	Echo     bool
	Sampling Sampling
}

// Message is one chat message with its content flattened to text.
type Message struct {
	Role    string
	Content string
	Name    string // optional participant name; some chat templates use it
	// ToolCalls are an assistant turn's calls; ToolCallID the call a tool
	// turn answers. Both go to the chat template.
	ToolCalls  []ToolCall
	ToolCallID string
}

// ChatRequest is a validated POST /v1/chat/completions body.
type ChatRequest struct {
	Model        string
	Messages     []Message
	Stream       bool
	IncludeUsage bool
	Sampling     Sampling
	// TemplateKwargs become variables of the chat template
	// (chat_template_kwargs, e.g. enable_thinking), decoded as JSON values.
	TemplateKwargs map[string]any
	// Tools the model may call, how it must choose among them, and whether
	// it may make more than one call (SingleToolCall: parallel_tool_calls
	// false). ToolChoice is zero when there are no tools, auto when tools
	// come without a choice.
	Tools          []Tool
	ToolChoice     ToolChoice
	SingleToolCall bool
	// Echo puts the last message's content in front of the answer when
	// that message is the assistant's (vLLM's echo for chat).
	Echo bool
}

// ParseCompletionRequest decodes and validates a /v1/completions body. Every
// failure is a 400 whose Param names the field at fault; unknown fields are
// ignored because clients commonly send extensions meant for other servers.
//
// Unsupported features whose silent omission would change the result
// (best_of other than n, suffix) are rejected rather than ignored. A
// max_tokens left out stays 0: the server fills in the model's default, or
// DefaultCompletionMaxTokens.
func ParseCompletionRequest(body []byte) (*CompletionRequest, *Error) {
	return ParseCompletionRequestLimited(body, Limits{})
}

// ParseCompletionRequestLimited is ParseCompletionRequest for a server
// that knows its limits: a prompt of more token ids than lim admits is
// refused (400, code context_length_exceeded) as soon as the decoding
// passes the bound.
func ParseCompletionRequestLimited(body []byte, lim Limits) (*CompletionRequest, *Error) {
	f, e := decodeObject(body, lim)
	if e != nil {
		return nil, e
	}
	return parseCompletion(f, lim)
}

func parseCompletion(f fields, lim Limits) (*CompletionRequest, *Error) {
	r := &CompletionRequest{}
	var e *Error
	if r.Model, e = f.model(); e != nil {
		return nil, e
	}
	if r.Prompts, e = f.prompts(lim.promptTokens()); e != nil {
		return nil, e
	}
	r.Prompt, r.PromptTokenIDs = r.Prompts[0].Text, r.Prompts[0].TokenIDs
	if r.Stream, r.IncludeUsage, e = f.stream(); e != nil {
		return nil, e
	}
	if r.Sampling, e = f.sampling(); e != nil {
		return nil, e
	}
	if n := len(r.Prompts) * r.Sampling.N; n > MaxBatchChoices {
		return nil, BadRequest(fmt.Sprintf("a batch may ask for at most %d choices (prompts times n); this one asks for %d", MaxBatchChoices, n), "n")
	}
	// best_of picks the n most likely of best_of candidates; with best_of
	// equal to n that is all of them, anything else would need ranking.
	if b, ok, e := f.int("best_of", 1, MaxN); e != nil {
		return nil, e
	} else if ok && int(b) != r.Sampling.N {
		return nil, BadRequest("best_of other than n is not supported", "best_of")
	}
	if r.Echo, _, e = f.bool("echo"); e != nil {
		return nil, e
	}
	if suffix, _, e := f.string("suffix"); e != nil {
		return nil, e
	} else if suffix != "" {
		return nil, BadRequest("suffix is not supported", "suffix")
	}
	// Legacy logprobs: an integer count, where 0 still means "the sampled
	// token's logprob", so presence rather than value turns it on.
	if n, ok, e := f.int("logprobs", 0, MaxCompletionLogprobs); e != nil {
		return nil, e
	} else if ok {
		r.Sampling.Logprobs, r.Sampling.TopLogprobs = true, int(n)
	}
	return r, nil
}

// ParseChatRequest decodes and validates a /v1/chat/completions body, with
// the same error conventions as ParseCompletionRequest. Content given as an
// array of parts is flattened by concatenating its text parts, with no
// separator; any other part type (images, audio, files) is a 400. The
// legacy functions field is rejected; tools are served.
func ParseChatRequest(body []byte) (*ChatRequest, *Error) {
	return ParseChatRequestLimited(body, Limits{})
}

// ParseChatRequestLimited is ParseChatRequest for a server that knows its
// limits: every message costs at least one token of the context, so a
// conversation of more messages than the context admits tokens is
// refused before its messages are decoded.
func ParseChatRequestLimited(body []byte, lim Limits) (*ChatRequest, *Error) {
	f, e := decodeObject(body, lim)
	if e != nil {
		return nil, e
	}
	return parseChat(f, lim)
}

func parseChat(f fields, lim Limits) (*ChatRequest, *Error) {
	r := &ChatRequest{}
	var e *Error
	if r.Model, e = f.model(); e != nil {
		return nil, e
	}
	if r.Messages, e = f.messages(lim.promptTokens()); e != nil {
		return nil, e
	}
	if r.Stream, r.IncludeUsage, e = f.stream(); e != nil {
		return nil, e
	}
	if r.Sampling, e = f.sampling(); e != nil {
		return nil, e
	}
	if e = f.templateValues(r.Messages); e != nil {
		return nil, e
	}
	if r.TemplateKwargs, e = f.object("chat_template_kwargs"); e != nil {
		return nil, e
	}
	// max_completion_tokens replaced max_tokens in OpenAI's chat API; newer
	// clients send only it, older ones only max_tokens, so the new name wins.
	if n, ok, e := f.int("max_completion_tokens", 1, maxTokensLimit); e != nil {
		return nil, e
	} else if ok {
		r.Sampling.MaxTokens = int(n)
	}
	if e = r.Sampling.CheckMinTokens(); e != nil {
		return nil, e
	}
	lp, _, e := f.bool("logprobs")
	if e != nil {
		return nil, e
	}
	top, _, e := f.int("top_logprobs", 0, MaxChatTopLogprobs)
	if e != nil {
		return nil, e
	}
	if top > 0 && !lp {
		return nil, BadRequest("top_logprobs requires logprobs to be true", "top_logprobs")
	}
	r.Sampling.Logprobs, r.Sampling.TopLogprobs = lp, int(top)
	if e = f.tools(r); e != nil {
		return nil, e
	}
	if r.Echo, _, e = f.bool("echo"); e != nil {
		return nil, e
	}
	return r, nil
}

// fields is a request body's top-level object. Looking keys up exactly,
// rather than through encoding/json's case-insensitive struct matching,
// keeps "Max_Tokens" from being taken for max_tokens.
type fields map[string]json.RawMessage

// get returns a field's raw value; JSON null counts as absent because many
// clients serialise unset options as null.
func (f fields) get(name string) (json.RawMessage, bool) {
	return present(f[name])
}

func present(raw json.RawMessage) (json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, false
	}
	return raw, true
}

func isNumber(raw json.RawMessage) bool {
	return len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'))
}

// parseInt accepts integral JSON numbers, including forms like 16.0 or 1e3
// that Python and JavaScript clients produce for whole numbers.
func parseInt(raw json.RawMessage) (int64, bool) {
	raw = bytes.TrimSpace(raw)
	if !isNumber(raw) {
		return 0, false
	}
	if n, err := strconv.ParseInt(string(raw), 10, 64); err == nil {
		return n, true
	}
	x, err := strconv.ParseFloat(string(raw), 64)
	// 2^63 itself is representable as a float64 but not as an int64.
	if err != nil || x != math.Trunc(x) || x < math.MinInt64 || x >= math.MaxInt64 {
		return 0, false
	}
	return int64(x), true
}

// outOfInt64 tells an integer too large for int64 (which deserves a range
// message) from a value that is not an integer at all.
func outOfInt64(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if !isNumber(raw) {
		return false
	}
	x, _ := strconv.ParseFloat(string(raw), 64) // ±Inf on overflow
	return math.IsInf(x, 0) || (x == math.Trunc(x) && (x < math.MinInt64 || x >= math.MaxInt64))
}

func parseFloat(raw json.RawMessage) (float64, bool) {
	raw = bytes.TrimSpace(raw)
	if !isNumber(raw) {
		return 0, false
	}
	x, err := strconv.ParseFloat(string(raw), 64)
	return x, err == nil
}

func parseString(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	return s, json.Unmarshal(raw, &s) == nil
}

func (f fields) bool(name string) (v, ok bool, e *Error) {
	raw, ok := f.get(name)
	if !ok {
		return false, false, nil
	}
	switch string(raw) {
	case "true":
		return true, true, nil
	case "false":
		return false, true, nil
	}
	return false, false, BadRequest(name+" must be a boolean", name)
}

func (f fields) string(name string) (string, bool, *Error) {
	raw, ok := f.get(name)
	if !ok {
		return "", false, nil
	}
	s, ok := parseString(raw)
	if !ok {
		return "", false, BadRequest(name+" must be a string", name)
	}
	return s, true, nil
}

// int reads an integer field and checks it lies in [lo, hi].
func (f fields) int(name string, lo, hi int64) (int64, bool, *Error) {
	raw, ok := f.get(name)
	if !ok {
		return 0, false, nil
	}
	n, ok := parseInt(raw)
	switch {
	case !ok && outOfInt64(raw):
		// %.32s: the literal can be arbitrarily long and is echoed back.
		return 0, false, BadRequest(fmt.Sprintf("%s must be between %d and %d, got %.32s", name, lo, hi, raw), name)
	case !ok:
		return 0, false, BadRequest(name+" must be an integer", name)
	case n < lo:
		return 0, false, BadRequest(fmt.Sprintf("%s must be at least %d, got %d", name, lo, n), name)
	case n > hi:
		return 0, false, BadRequest(fmt.Sprintf("%s must be at most %d, got %d", name, hi, n), name)
	}
	return n, true, nil
}

// float reads a number field; range checks differ per field (open or closed
// ends), so they are left to the caller.
func (f fields) float(name string) (float64, bool, *Error) {
	raw, ok := f.get(name)
	if !ok {
		return 0, false, nil
	}
	x, ok := parseFloat(raw)
	if !ok {
		return 0, false, BadRequest(name+" must be a number", name)
	}
	return x, true, nil
}

// model reads the model field. Left out (or empty) it is "": the server
// then answers with the model it serves, as vLLM, SGLang and llama.cpp do.
func (f fields) model() (string, *Error) {
	m, _, e := f.string("model")
	return m, e
}

func (f fields) stream() (stream, includeUsage bool, e *Error) {
	if stream, _, e = f.bool("stream"); e != nil {
		return false, false, e
	}
	raw, ok := f.get("stream_options")
	if !ok {
		return stream, false, nil
	}
	opts, ok := objectFields(raw)
	if !ok {
		return false, false, BadRequest("stream_options must be an object", "stream_options")
	}
	// OpenAI and vLLM reject this combination; doing the same avoids a client
	// believing it asked for usage in a response that was never a stream.
	if !stream {
		return false, false, BadRequest("stream_options is only allowed when stream is true", "stream_options")
	}
	iu, ok := opts.get("include_usage")
	switch {
	case !ok:
	case string(iu) == "true":
		includeUsage = true
	case string(iu) == "false":
	default:
		return false, false, BadRequest("stream_options.include_usage must be a boolean", "stream_options.include_usage")
	}
	return stream, includeUsage, nil
}

// sampling reads the fields the two endpoints share. Logprobs are not here:
// they have a different type on each endpoint.
func (f fields) sampling() (Sampling, *Error) {
	s := Sampling{Temperature: defaultTemperature, TopP: defaultTopP, RepetitionPenalty: 1, N: 1}
	if n, ok, e := f.int("n", 1, MaxN); e != nil {
		return s, e
	} else if ok {
		s.N = int(n)
	}
	if n, ok, e := f.int("max_tokens", 1, maxTokensLimit); e != nil {
		return s, e
	} else if ok {
		s.MaxTokens = int(n)
	}
	if v, ok, e := f.string("cache_salt"); e != nil {
		return s, e
	} else if ok {
		if v == "" || len(v) > maxCacheSaltBytes {
			return s, BadRequest(fmt.Sprintf("cache_salt must be a non-empty string of at most %d bytes", maxCacheSaltBytes), "cache_salt")
		}
		s.CacheSalt = v
	}
	if x, ok, e := f.float("temperature"); e != nil {
		return s, e
	} else if ok {
		if x < 0 || x > maxTemperature {
			return s, BadRequest(fmt.Sprintf("temperature must be between 0 and 2, got %g", x), "temperature")
		}
		s.Temperature, s.Given.Temperature = x, true
	}
	if x, ok, e := f.float("top_p"); e != nil {
		return s, e
	} else if ok {
		if !(x > 0 && x <= 1) {
			return s, BadRequest(fmt.Sprintf("top_p must be greater than 0 and at most 1, got %g", x), "top_p")
		}
		s.TopP, s.Given.TopP = x, true
	}
	// -1 and 0 both mean "off" because vLLM uses -1 and SGLang/llama.cpp 0.
	if n, ok, e := f.int("top_k", -1, maxTokensLimit); e != nil {
		return s, e
	} else if ok {
		s.Given.TopK = true
		if n > 0 {
			s.TopK = int(n)
		}
	}
	if x, ok, e := f.float("min_p"); e != nil {
		return s, e
	} else if ok {
		if x < 0 || x > 1 {
			return s, BadRequest(fmt.Sprintf("min_p must be between 0 and 1, got %g", x), "min_p")
		}
		s.MinP, s.Given.MinP = x, true
	}
	if n, ok, e := f.int("seed", math.MinInt64, math.MaxInt64); e != nil {
		return s, e
	} else if ok {
		s.Seed = &n
	}
	var e *Error
	if s.Stop, e = f.stop(); e != nil {
		return s, e
	}
	if s.StopTokenIDs, e = f.tokenIDs("stop_token_ids", MaxStopTokenIDs); e != nil {
		return s, e
	}
	if s.IgnoreEOS, _, e = f.bool("ignore_eos"); e != nil {
		return s, e
	}
	if e = f.penalties(&s); e != nil {
		return s, e
	}
	if s.LogitBias, e = f.logitBias(); e != nil {
		return s, e
	}
	if n, ok, e := f.int("min_tokens", 0, maxTokensLimit); e != nil {
		return s, e
	} else if ok {
		s.MinTokens = int(n)
	}
	if s.Constraint, e = f.constraint(); e != nil {
		return s, e
	}
	return s, s.CheckMinTokens()
}

// constraint reads the structured-output fields: OpenAI's response_format
// (text, json_object, json_schema) and SGLang's regex and ebnf; at most
// one of them may constrain a request.
func (f fields) constraint() (Constraint, *Error) {
	var c Constraint
	set := func(kind, spec, param string) *Error {
		if c.Kind != "" {
			return BadRequest("only one of response_format, regex and ebnf may constrain the output", param)
		}
		if len(spec) > maxConstraintBytes {
			return BadRequest(fmt.Sprintf("%s is over %d bytes", param, maxConstraintBytes), param)
		}
		c = Constraint{Kind: kind, Spec: spec}
		return nil
	}
	if raw, ok := f.get("response_format"); ok {
		rf, ok := objectFields(raw)
		if !ok {
			return c, BadRequest("response_format must be an object", "response_format")
		}
		switch t, _ := parseString(rf["type"]); t {
		case "text":
		case "json_object":
			if e := set("json_object", "", "response_format"); e != nil {
				return c, e
			}
		case "json_schema":
			var js fields
			if raw, ok := rf.get("json_schema"); ok {
				js, ok = objectFields(raw)
				if !ok {
					js = nil
				}
			}
			if js == nil {
				return c, BadRequest("response_format.json_schema must be an object with a schema", "response_format.json_schema")
			}
			schema, ok := js.get("schema")
			if !ok || schema[0] != '{' {
				return c, BadRequest("response_format.json_schema.schema must be a JSON Schema object", "response_format.json_schema.schema")
			}
			if e := set("json_schema", string(schema), "response_format.json_schema.schema"); e != nil {
				return c, e
			}
		default:
			return c, BadRequest(fmt.Sprintf("response_format type %q is not supported (text, json_object, json_schema)", Cut(t)), "response_format.type")
		}
	}
	for _, kind := range []string{"regex", "ebnf"} {
		if spec, ok, e := f.string(kind); e != nil {
			return c, e
		} else if ok {
			if spec == "" {
				return c, BadRequest(kind+" must not be empty", kind)
			}
			if e := set(kind, spec, kind); e != nil {
				return c, e
			}
		}
	}
	return c, nil
}

// CheckMinTokens refuses a floor above the ceiling, as vLLM does, rather
// than silently letting one of them win.
func (s Sampling) CheckMinTokens() *Error {
	if s.MaxTokens > 0 && s.MinTokens > s.MaxTokens {
		return BadRequest(fmt.Sprintf("min_tokens must be at most max_tokens, got %d > %d", s.MinTokens, s.MaxTokens), "min_tokens")
	}
	return nil
}

func (f fields) penalties(s *Sampling) *Error {
	for _, p := range []struct {
		name   string
		lo, hi float64
		openLo bool
		dst    *float64
	}{
		{"presence_penalty", -2, 2, false, &s.PresencePenalty},
		{"frequency_penalty", -2, 2, false, &s.FrequencyPenalty},
		{"repetition_penalty", 0, 2, true, &s.RepetitionPenalty}, // vLLM/SGLang extension
	} {
		x, ok, e := f.float(p.name)
		if e != nil {
			return e
		}
		if !ok {
			continue
		}
		if x > p.hi || x < p.lo || (p.openLo && x == p.lo) {
			lo := "between"
			if p.openLo {
				lo = "greater than"
			}
			and := " and at most"
			if !p.openLo {
				and = " and"
			}
			return BadRequest(fmt.Sprintf("%s must be %s %g%s %g, got %g", p.name, lo, p.lo, and, p.hi, x), p.name)
		}
		*p.dst = x
	}
	return nil
}

// logitBias reads OpenAI's {"token id": bias} object.
func (f fields) logitBias() (map[int32]float64, *Error) {
	raw, ok := f.get("logit_bias")
	if !ok {
		return nil, nil
	}
	m := map[string]json.RawMessage{}
	if !eachMember(raw, func(k string, v json.RawMessage) bool {
		m[k] = v
		return len(m) <= MaxLogitBias
	}) {
		return nil, BadRequest("logit_bias must be an object mapping token ids to numbers", "logit_bias")
	}
	if len(m) > MaxLogitBias {
		return nil, BadRequest(fmt.Sprintf("logit_bias may hold at most %d tokens", MaxLogitBias), "logit_bias")
	}
	if len(m) == 0 {
		return nil, nil
	}
	out := make(map[int32]float64, len(m))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 {
			return nil, BadRequest(fmt.Sprintf("logit_bias keys must be token ids (non-negative integers), got %.32q", k), "logit_bias")
		}
		x, ok := parseFloat(v)
		if !ok || x < -MaxLogitBiasValue || x > MaxLogitBiasValue {
			return nil, BadRequest(fmt.Sprintf("logit_bias values must be numbers between -100 and 100 (token %d)", id), "logit_bias")
		}
		out[int32(id)] = x
	}
	return out, nil
}

// object reads a field holding a JSON object, decoded to Go values.
func (f fields) object(name string) (map[string]any, *Error) {
	raw, ok := f.get(name)
	if !ok {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var m map[string]any
	if raw[0] != '{' || d.Decode(&m) != nil {
		return nil, BadRequest(name+" must be an object", name)
	}
	return integers(m).(map[string]any), nil
}

// templateValues refuses a request that would hand its chat template
// more than MaxTemplateValues JSON values, before any is decoded.
func (f fields) templateValues(msgs []Message) *Error {
	n := 0
	for _, k := range []string{"chat_template_kwargs", "tools"} {
		if raw, ok := f.get(k); ok {
			n += countValues(raw, MaxTemplateValues)
		}
	}
	for _, m := range msgs {
		for _, c := range m.ToolCalls {
			n += countValues(c.Function.Arguments, MaxTemplateValues)
		}
		if n > MaxTemplateValues {
			break
		}
	}
	if n > MaxTemplateValues {
		return BadRequest(fmt.Sprintf("chat_template_kwargs, tools and the arguments of tool calls may hold at most %d JSON values together", MaxTemplateValues), "")
	}
	return nil
}

// integers turns JSON numbers into int64 where they are whole and float64
// otherwise, so a template given 3 prints 3, as Python would, not 3.0.
func integers(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = integers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = integers(e)
		}
	}
	return v
}

func (f fields) stop() ([]string, *Error) {
	raw, ok := f.get("stop")
	if !ok {
		return nil, nil
	}
	msg := fmt.Sprintf("stop must be a string or an array of at most %d non-empty strings of at most %d bytes", MaxStop, MaxStopBytes)
	if s, ok := parseString(raw); ok {
		if s == "" || len(s) > MaxStopBytes {
			return nil, BadRequest(msg, "stop")
		}
		return []string{s}, nil
	}
	var list []json.RawMessage
	if !eachElement(raw, func(_ int, el json.RawMessage) bool {
		list = append(list, el)
		return len(list) <= MaxStop
	}) || len(list) > MaxStop {
		return nil, BadRequest(msg, "stop")
	}
	var out []string
	for i, el := range list {
		s, ok := parseString(el)
		// An empty stop string would match at every position and end the
		// completion before it starts; that is a client bug worth reporting.
		if !ok || s == "" || len(s) > MaxStopBytes {
			return nil, BadRequest(msg, fmt.Sprintf("stop[%d]", i))
		}
		out = append(out, s)
	}
	return out, nil
}

func (f fields) tokenIDs(name string, max int) ([]int32, *Error) {
	raw, ok := f.get(name)
	if !ok {
		return nil, nil
	}
	ids, bad, tooMany, ok := decodeIDs(raw, max)
	switch {
	case tooMany:
		return nil, BadRequest(fmt.Sprintf("%s may hold at most %d token ids", name, max), name)
	case bad >= 0:
		return nil, BadRequest(name+" must be an array of non-negative integer token ids", fmt.Sprintf("%s[%d]", name, bad))
	case !ok:
		return nil, BadRequest(name+" must be an array of non-negative integer token ids", name)
	}
	return ids, nil
}

// prompts accepts the prompt forms OpenAI's completions API does: a
// string, token ids, or a list of either (a batch, in order). An empty
// prompt is rejected because a vocabulary without a BOS token would leave
// nothing to prefill; one of more than max ids is too long. Each prompt
// is bounded by max and the batch by MaxPrompts, so a batch costs at most
// MaxPrompts contexts of ids (less than the body's own bytes).
func (f fields) prompts(max int) ([]Prompt, *Error) {
	raw, ok := f.get("prompt")
	if !ok {
		return nil, BadRequest("you must provide a prompt parameter", "prompt")
	}
	const kinds = "prompt must be a string, an array of token ids, or an array of strings or of arrays of token ids"
	if s, ok := parseString(raw); ok {
		if s == "" {
			return nil, BadRequest("prompt must not be empty", "prompt")
		}
		return []Prompt{{Text: s}}, nil
	}
	if raw[0] != '[' {
		return nil, BadRequest(kinds, "prompt")
	}
	tooLong := func(param string) *Error {
		return PromptTooLong(fmt.Sprintf("this model's maximum context length is %d tokens; a prompt has more than %d token ids", max+1, max), param)
	}
	var first json.RawMessage
	if !eachElement(raw, func(_ int, el json.RawMessage) bool {
		first = el
		return false
	}) {
		return nil, BadRequest(kinds, "prompt")
	}
	if first == nil {
		return nil, BadRequest("prompt must not be empty", "prompt")
	}
	// Counted before they are decoded, so that ids past the bound cost
	// nothing: the body's bound admits MaxPrompts contexts of them.
	over := func(ids json.RawMessage) bool {
		_, err := skipValue(ids, 0, new(int), max)
		return errors.Is(err, errTooMany)
	}
	if first[0] != '"' && first[0] != '[' {
		if over(raw) {
			return nil, tooLong("prompt")
		}
		ids, bad, tooMany, ok := decodeIDs(raw, max)
		switch {
		case tooMany:
			return nil, tooLong("prompt")
		case bad >= 0:
			return nil, BadRequest("prompt token ids must be non-negative integers", fmt.Sprintf("prompt[%d]", bad))
		case !ok:
			return nil, BadRequest(kinds, "prompt")
		}
		return []Prompt{{TokenIDs: ids}}, nil
	}
	var out []Prompt
	var e *Error
	if !eachElement(raw, func(i int, el json.RawMessage) bool {
		at := fmt.Sprintf("prompt[%d]", i)
		if i == MaxPrompts {
			e = BadRequest(fmt.Sprintf("prompt may list at most %d prompts", MaxPrompts), "prompt")
			return false
		}
		if s, ok := parseString(el); ok {
			if s == "" {
				e = BadRequest("prompt must not be empty", at)
				return false
			}
			out = append(out, Prompt{Text: s})
			return true
		}
		if over(el) {
			e = tooLong("prompt")
			return false
		}
		ids, bad, tooMany, ok := decodeIDs(el, max)
		switch {
		case tooMany:
			e = tooLong("prompt")
		case bad >= 0:
			e = BadRequest("prompt token ids must be non-negative integers", fmt.Sprintf("%s[%d]", at, bad))
		case !ok:
			e = BadRequest(kinds, at)
		case len(ids) == 0:
			e = BadRequest("prompt must not be empty", at)
		default:
			out = append(out, Prompt{TokenIDs: ids})
		}
		return e == nil
	}) {
		return nil, BadRequest(kinds, "prompt")
	}
	if e != nil {
		return nil, e
	}
	return out, nil
}

// messages reads the conversation. Every message takes at least one token
// of the context in any chat template, so more than max of them cannot
// fit and are refused before they are decoded.
func (f fields) messages(max int) ([]Message, *Error) {
	raw, ok := f.get("messages")
	if !ok {
		return nil, BadRequest("you must provide a messages parameter", "messages")
	}
	var out []Message
	var e *Error
	if !eachElement(raw, func(i int, el json.RawMessage) bool {
		if i == max {
			e = PromptTooLong(fmt.Sprintf("this model's maximum context length is %d tokens; the request has more than %d messages", max+1, max), "messages")
			return false
		}
		var m Message
		if m, e = parseMessage(el, fmt.Sprintf("messages[%d]", i), max); e != nil {
			return false
		}
		out = append(out, m)
		return true
	}) {
		return nil, BadRequest("messages must be an array of message objects", "messages")
	}
	if e != nil {
		return nil, e
	}
	if len(out) == 0 {
		return nil, BadRequest("messages must contain at least one message", "messages")
	}
	return out, nil
}

// parseMessage reads one message; max bounds its content parts and tool
// calls, each of which takes at least a token.
func parseMessage(raw json.RawMessage, at string, max int) (Message, *Error) {
	f, ok := objectFields(raw)
	if !ok {
		return Message{}, BadRequest(at+" must be an object", at)
	}
	var m Message
	role, ok := f.get("role")
	if !ok {
		return m, BadRequest(at+".role is required", at+".role")
	}
	m.Role, _ = parseString(role)
	switch m.Role {
	case RoleSystem, RoleUser, RoleAssistant, RoleDeveloper, RoleTool:
	default:
		return m, BadRequest(at+".role must be one of system, user, assistant, developer, tool", at+".role")
	}
	if raw, ok := f.get("name"); ok {
		if m.Name, ok = parseString(raw); !ok {
			return m, BadRequest(at+".name must be a string", at+".name")
		}
	}
	if raw, ok := f.get("tool_calls"); ok {
		if m.Role != RoleAssistant {
			return m, BadRequest(at+".tool_calls is only allowed in assistant messages", at+".tool_calls")
		}
		var e *Error
		if m.ToolCalls, e = parseToolCalls(raw, at+".tool_calls", max); e != nil {
			return m, e
		}
	}
	if raw, ok := f.get("tool_call_id"); ok {
		if m.ToolCallID, ok = parseString(raw); !ok {
			return m, BadRequest(at+".tool_call_id must be a string", at+".tool_call_id")
		}
	}
	content, ok := f.get("content")
	if !ok {
		// OpenAI lets an assistant turn carry tool calls and no content;
		// every other role has to say something.
		if m.Role == RoleAssistant {
			return m, nil
		}
		return m, BadRequest(at+".content is required", at+".content")
	}
	if s, ok := parseString(content); ok {
		m.Content = s
		return m, nil
	}
	var b strings.Builder
	var e *Error
	if !eachElement(content, func(j int, p json.RawMessage) bool {
		pat := fmt.Sprintf("%s.content[%d]", at, j)
		if j == max {
			e = BadRequest(fmt.Sprintf("%s.content has more than %d parts", at, max), at+".content")
			return false
		}
		pf, ok := objectFields(p)
		if !ok {
			e = BadRequest(pat+" must be an object", pat)
			return false
		}
		typ, _ := parseString(pf["type"])
		if typ != "text" {
			e = BadRequest(fmt.Sprintf("%s.type %q is not supported; only text parts are", pat, Cut(typ)), pat+".type")
			return false
		}
		text, ok := parseString(pf["text"])
		if !ok {
			e = BadRequest(pat+".text must be a string", pat+".text")
			return false
		}
		b.WriteString(text)
		return true
	}) {
		return m, BadRequest(at+".content must be a string or an array of content parts", at+".content")
	}
	if e != nil {
		return m, e
	}
	m.Content = b.String()
	return m, nil
}
