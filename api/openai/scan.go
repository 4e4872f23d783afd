package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Limits are what a server knows of its capacity when it reads a request,
// so that a body can be refused as soon as it is shown too big rather
// than after decoding all of it: 30 MB of token ids decoded one value at
// a time took 2.8 GB and several seconds to get their 400.
type Limits struct {
	// MaxPromptTokens is the longest prompt admitted; 0 when unknown
	// (then DefaultMaxPromptTokens bounds the decoding).
	MaxPromptTokens int
}

// DefaultMaxPromptTokens bounds a prompt of token ids, and a request's
// messages, when the server does not know its context (a router without
// a healthy worker, whose requests fail anyway): a million-token context,
// decoded in milliseconds.
const DefaultMaxPromptTokens = 1 << 20

// maxFields bounds a request object's members: OpenAI's requests have
// fewer than fifty, and each member of a larger body costs a map entry.
const maxFields = 1024

// MaxStopTokenIDs bounds stop_token_ids: each generated token is compared
// with all of them.
const MaxStopTokenIDs = 1024

// maxDepth is encoding/json's nesting limit, kept so that a body is valid
// here exactly when it is valid there.
const maxDepth = 10000

func (l Limits) promptTokens() int {
	if l.MaxPromptTokens > 0 {
		return l.MaxPromptTokens
	}
	return DefaultMaxPromptTokens
}

// CodeContextLength is the error code of a prompt longer than the
// context, as OpenAI names it.
const CodeContextLength = "context_length_exceeded"

// PromptTooLong is the 400 of a prompt longer than the context allows.
func PromptTooLong(msg, param string) *Error {
	e := BadRequest(msg, param)
	e.Code = strPtr(CodeContextLength)
	return e
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// errSyntax is any departure from JSON's grammar found while skipping;
// the body's real error message is then asked of encoding/json.
var errSyntax = errors.New("json syntax")

// errTooMany says a value held more numbers than it was allowed.
var errTooMany = errors.New("too many numbers")

// skipValue returns the end of the JSON value starting at b[i] (after any
// space), without decoding or copying it. It finds the end of every valid
// value but does not check every rule: the caller checks the span with
// json.Valid. When numbers is not nil, it counts the numbers inside the
// value and stops with errTooMany as soon as there are more than max.
func skipValue(b []byte, i int, numbers *int, max int) (int, error) {
	i = skipSpace(b, i)
	depth := 0
	for i < len(b) {
		switch c := b[i]; {
		case c == '{' || c == '[':
			depth++
			if depth >= maxDepth {
				return i, errSyntax
			}
			i++
		case c == '}' || c == ']':
			depth--
			i++
			if depth < 0 {
				return i, errSyntax
			}
		case c == '"':
			j, err := skipString(b, i)
			if err != nil {
				return j, err
			}
			i = j
		case c == ',' || c == ':' || isSpace(c):
			if depth == 0 {
				return i, errSyntax
			}
			i++
			continue
		default:
			if numbers != nil && (c == '-' || (c >= '0' && c <= '9')) {
				if *numbers++; *numbers > max {
					return i, errTooMany
				}
			}
			j := i
			for j < len(b) && !isSpace(b[j]) && b[j] != ',' && b[j] != ']' && b[j] != '}' && b[j] != ':' && b[j] != '"' && b[j] != '[' && b[j] != '{' {
				j++
			}
			if j == i {
				return i, errSyntax
			}
			i = j
		}
		if depth == 0 {
			return i, nil
		}
	}
	return i, errSyntax
}

// skipString returns the end of the string whose opening quote is b[i].
func skipString[T ~string | ~[]byte](b T, i int) (int, error) {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return len(b), errSyntax
}

// syntaxError is the 400 of a body that is not a JSON object, worded by
// encoding/json, which checks the whole body before it decodes into the
// empty struct (so nothing is allocated for it).
func syntaxError(body []byte) *Error {
	var v struct{}
	err := json.Unmarshal(body, &v)
	var te *json.UnmarshalTypeError
	if err == nil || errors.As(err, &te) {
		return BadRequest("request body must be a JSON object", "")
	}
	return BadRequest("request body is not valid JSON: "+err.Error(), "")
}

// decodeObject splits a request body's top-level object into its members.
// Each value is a slice of body, checked to be valid JSON but not decoded
// or copied. The prompt is skipped counting its numbers, and refused as
// soon as it holds more than the limit allows: a body of millions of ids
// costs no more than its own bytes.
func decodeObject(body []byte, lim Limits) (fields, *Error) {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil, BadRequest("request body is empty; expected a JSON object", "")
	}
	if body[0] != '{' {
		return nil, syntaxError(body)
	}
	f := fields{}
	i := skipSpace(body, 1)
	if i < len(body) && body[i] == '}' {
		if skipSpace(body, i+1) != len(body) {
			return nil, syntaxError(body)
		}
		return f, nil
	}
	for n := 0; ; n++ {
		if n == maxFields {
			return nil, BadRequest(fmt.Sprintf("request body has more than %d fields", maxFields), "")
		}
		if i >= len(body) || body[i] != '"' {
			return nil, syntaxError(body)
		}
		end, err := skipString(body, i)
		if err != nil {
			return nil, syntaxError(body)
		}
		key, ok := objectKey(body[i:end])
		if !ok {
			return nil, syntaxError(body)
		}
		i = skipSpace(body, end)
		if i >= len(body) || body[i] != ':' {
			return nil, syntaxError(body)
		}
		start := skipSpace(body, i+1)
		var numbers *int
		limit := 0
		if key == "prompt" {
			// A batch holds up to MaxPrompts prompts; each is held to
			// the context by the prompt's own decoding.
			numbers, limit = new(int), lim.promptTokens()*MaxPrompts
		}
		end, err = skipValue(body, start, numbers, limit)
		switch {
		case errors.Is(err, errTooMany):
			return nil, PromptTooLong(fmt.Sprintf("this model's maximum context length is %d tokens; the prompt holds more than %d token ids, more than %d prompts of that length",
				lim.promptTokens()+1, limit, MaxPrompts), "prompt")
		case err != nil || !json.Valid(body[start:end]):
			return nil, syntaxError(body)
		}
		f[key] = json.RawMessage(body[start:end:end])
		i = skipSpace(body, end)
		if i >= len(body) {
			return nil, syntaxError(body)
		}
		if body[i] == '}' {
			if skipSpace(body, i+1) != len(body) {
				return nil, syntaxError(body)
			}
			return f, nil
		}
		if body[i] != ',' {
			return nil, syntaxError(body)
		}
		i = skipSpace(body, i+1)
	}
}

// objectKey decodes a member's name; plain ASCII names, nearly all of
// them, need no decoder.
func objectKey(quoted []byte) (string, bool) {
	plain := true
	for _, c := range quoted[1 : len(quoted)-1] {
		if c < 0x20 || c >= 0x80 || c == '\\' || c == '"' {
			plain = false
			break
		}
	}
	if plain {
		return string(quoted[1 : len(quoted)-1]), true
	}
	var k string
	return k, json.Unmarshal(quoted, &k) == nil
}

// eachElement calls fn with each element of the JSON array raw, as a
// slice of raw, until fn returns false; it reports whether raw is a valid
// array. Nothing is decoded or copied, so a caller that stops at its
// bound pays for no more than the elements it looked at.
func eachElement(raw json.RawMessage, fn func(i int, el json.RawMessage) bool) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' || !json.Valid(raw) {
		return false
	}
	i := skipSpace(raw, 1)
	if raw[i] == ']' {
		return true
	}
	for n := 0; ; n++ {
		end, err := skipValue(raw, i, nil, 0)
		if err != nil {
			return false
		}
		if !fn(n, raw[i:end:end]) {
			return true
		}
		i = skipSpace(raw, end)
		if raw[i] == ']' {
			return true
		}
		i = skipSpace(raw, i+1) // past the comma: raw is valid
	}
}

// eachMember is eachElement for a JSON object: fn sees each member's name
// and value in order (a repeated name twice).
func eachMember(raw json.RawMessage, fn func(key string, val json.RawMessage) bool) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '{' || !json.Valid(raw) {
		return false
	}
	i := skipSpace(raw, 1)
	if raw[i] == '}' {
		return true
	}
	for {
		end, err := skipString(raw, i)
		if err != nil {
			return false
		}
		k, ok := objectKey(raw[i:end])
		if !ok {
			return false
		}
		start := skipSpace(raw, skipSpace(raw, end)+1) // past the colon
		end, err = skipValue(raw, start, nil, 0)
		if err != nil {
			return false
		}
		if !fn(k, raw[start:end:end]) {
			return true
		}
		i = skipSpace(raw, end)
		if raw[i] == '}' {
			return true
		}
		i = skipSpace(raw, i+1)
	}
}

// objectFields decodes a JSON object into fields (slices of raw, last
// name wins, as encoding/json does); ok is false when raw is not an
// object or has more than maxFields members.
func objectFields(raw json.RawMessage) (f fields, ok bool) {
	f, n := fields{}, 0
	valid := eachMember(raw, func(k string, v json.RawMessage) bool {
		f[k] = v
		n++
		return n <= maxFields
	})
	if !valid || n > maxFields {
		return nil, false
	}
	return f, true
}

// decodeIDs decodes a JSON array of token ids into at most max ids. bad is
// the index of the first element that is not an id (-1: none); tooMany
// says the array has more than max elements. ok is false when raw is
// not an array. Nothing is allocated but the ids.
func decodeIDs(raw json.RawMessage, max int) (ids []int32, bad int, tooMany, ok bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) < 2 || raw[0] != '[' {
		return nil, -1, false, false
	}
	ids, bad = []int32{}, -1
	i := skipSpace(raw, 1)
	if i < len(raw) && raw[i] == ']' {
		return ids, -1, false, skipSpace(raw, i+1) == len(raw)
	}
	for n := 0; ; n++ {
		if n == max {
			return nil, -1, true, true
		}
		start := skipSpace(raw, i)
		end, err := skipValue(raw, start, nil, 0)
		if err != nil {
			return nil, -1, false, false
		}
		id, isID := tokenID(raw[start:end])
		if !isID && bad < 0 {
			bad = n
		}
		if bad < 0 {
			ids = append(ids, id)
		}
		i = skipSpace(raw, end)
		if i >= len(raw) {
			return nil, -1, false, false
		}
		if raw[i] == ']' {
			if skipSpace(raw, i+1) != len(raw) {
				return nil, -1, false, false
			}
			if bad >= 0 {
				return nil, bad, false, true
			}
			return ids, -1, false, true
		}
		if raw[i] != ',' {
			return nil, -1, false, false
		}
		i++
	}
}

// tokenID reads one id: a JSON integer in [0, 2^31), plain digits being
// the fast path and integral forms such as 5.0 or 1e3 the slow one.
func tokenID(raw []byte) (int32, bool) {
	if len(raw) > 0 && len(raw) <= 10 && (raw[0] != '0' || len(raw) == 1) {
		var n int64
		digits := true
		for _, c := range raw {
			if c < '0' || c > '9' {
				digits = false
				break
			}
			n = n*10 + int64(c-'0')
		}
		if digits {
			return int32(n), n <= math.MaxInt32
		}
	}
	if !json.Valid(raw) {
		return 0, false
	}
	n, ok := parseInt(raw)
	if !ok || n < 0 || n > math.MaxInt32 {
		return 0, false
	}
	return int32(n), true
}

// MaxTemplateValues bounds the JSON values a chat request hands its
// template beyond the messages' text (chat_template_kwargs, tools, the
// arguments of past tool calls): each is decoded into a template value of
// about a hundred bytes, so a body of millions of tiny values would cost
// gigabytes before the template ran.
const MaxTemplateValues = 1 << 16

// countValues counts the JSON values in raw (every scalar, string, member
// name and container), stopping once there are more than max. It reads
// raw as JSON without checking it; text that is not JSON counts as what
// its bytes look like, which is never less than one value.
func countValues[T ~string | ~[]byte](raw T, limit int) int {
	n := 0
	for i := 0; i < len(raw) && n <= limit; {
		switch c := raw[i]; {
		case isSpace(c) || c == ',' || c == ':' || c == '}' || c == ']':
			i++
		case c == '"':
			i, _ = skipString(raw, i)
			n++
		case c == '{' || c == '[':
			i++
			n++
		default:
			for i < len(raw) && !isSpace(raw[i]) && raw[i] != ',' && raw[i] != ']' && raw[i] != '}' && raw[i] != ':' && raw[i] != '"' {
				i++
			}
			n++
		}
	}
	return max(n, 1)
}
