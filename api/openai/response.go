package openai

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"math"
	"strconv"
)

// Object names, as OpenAI puts them in each body's "object" field. Marshalling
// fills them in when left empty, so a caller cannot forget them.
const (
	ObjectCompletion     = "text_completion" // completions, streamed or not
	ObjectChatCompletion = "chat.completion"
	ObjectChatChunk      = "chat.completion.chunk"
	ObjectList           = "list"
	ObjectModel          = "model"
)

// Finish reasons. Choice fields take a *string (null until the stream ends);
// with Go 1.26 write new(openai.FinishStop).
const (
	FinishStop   = "stop"   // end-of-sequence, a stop string or a stop token id
	FinishLength = "length" // max_tokens or the context length was reached
)

// NewID returns prefix followed by 24 random hex digits, in the style of
// OpenAI's ids ("cmpl-…", "chatcmpl-…"). IDs are random rather than counters
// so that several routers never hand out the same one.
func NewID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return prefix + hex.EncodeToString(b[:])
}

// Usage is the token accounting of one request.
type Usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
	// PromptTokensDetails says how many prompt tokens were read from the
	// prefix cache rather than computed (OpenAI's field).
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
	// SpecUsage, inlined, carries a speculating request's figures under
	// SGLang's meta_info names; absent for a request that did not speculate.
	*SpecUsage
}

// SpecUsage is speculative decoding's figures for one request (all its
// choices, and every pair a router ran it on): verifying steps, draft
// tokens proposed and accepted, tokens per step and share accepted.
type SpecUsage struct {
	SpecVerifyCt       int     `json:"spec_verify_ct"`
	SpecDraftTokenNum  int     `json:"spec_draft_token_num"`
	SpecAcceptTokenNum int     `json:"spec_accept_token_num"`
	SpecAcceptLength   float64 `json:"spec_accept_length"`
	SpecAcceptRate     float64 `json:"spec_accept_rate"`
}

// PromptTokensDetails breaks the prompt tokens down.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// NewUsage fills in TotalTokens so it cannot disagree with its parts.
func NewUsage(promptTokens, completionTokens int) *Usage {
	return &Usage{PromptTokens: promptTokens, CompletionTokens: completionTokens, TotalTokens: promptTokens + completionTokens}
}

// WithCached adds the count of prompt tokens read from the prefix cache.
func (u *Usage) WithCached(cachedTokens int) *Usage {
	u.PromptTokensDetails = &PromptTokensDetails{CachedTokens: cachedTokens}
	return u
}

// Logprob is a log-probability as sent on the wire. JSON has no -Inf, and a
// token masked out by top-k, top-p or min-p has logprob -Inf, so it is sent as
// -9999 (vLLM's convention) instead of failing the whole response.
type Logprob float64

// minLogprob is what non-finite logprobs become on the wire.
const minLogprob = -9999.0

// MarshalJSON writes l, with -Inf and NaN clamped to -9999.
func (l Logprob) MarshalJSON() ([]byte, error) {
	x := float64(l)
	if math.IsNaN(x) || x < minLogprob {
		x = minLogprob
	}
	if math.IsInf(x, 1) {
		x = 0 // log-probabilities are at most 0; +Inf is an upstream bug
	}
	return strconv.AppendFloat(nil, x, 'g', -1, 64), nil
}

// CompletionLogprobs is the legacy completions logprobs object: parallel
// arrays, one entry per generated token.
type CompletionLogprobs struct {
	Tokens []string `json:"tokens"`
	// TokenLogprobs is null for an echoed prompt's first token, which has
	// nothing before it to be predicted from.
	TokenLogprobs []*Logprob `json:"token_logprobs"`
	// TopLogprobs holds, per token, the requested alternatives keyed by token
	// text (the format cannot tell apart two tokens with the same text).
	TopLogprobs []map[string]Logprob `json:"top_logprobs"`
	// TextOffset is each token's byte offset in the completion text.
	TextOffset []int `json:"text_offset"`
}

// Add appends one generated token, keeping the four arrays in step.
func (l *CompletionLogprobs) Add(token string, logprob float64, top map[string]Logprob, textOffset int) {
	if top == nil {
		top = map[string]Logprob{}
	}
	lp := Logprob(logprob)
	l.Tokens = append(l.Tokens, token)
	l.TokenLogprobs = append(l.TokenLogprobs, &lp)
	l.TopLogprobs = append(l.TopLogprobs, top)
	l.TextOffset = append(l.TextOffset, textOffset)
}

// AddUnscored appends a token without a logprob (an echoed prompt's first):
// its logprob and alternatives are null, as OpenAI and vLLM send them.
func (l *CompletionLogprobs) AddUnscored(token string, textOffset int) {
	l.Tokens = append(l.Tokens, token)
	l.TokenLogprobs = append(l.TokenLogprobs, nil)
	l.TopLogprobs = append(l.TopLogprobs, nil)
	l.TextOffset = append(l.TextOffset, textOffset)
}

// MarshalJSON sends empty arrays rather than null, as OpenAI does, because
// client code indexes these without checking.
func (l CompletionLogprobs) MarshalJSON() ([]byte, error) {
	type plain CompletionLogprobs
	l.Tokens = nonNil(l.Tokens)
	l.TokenLogprobs = nonNil(l.TokenLogprobs)
	l.TopLogprobs = nonNil(l.TopLogprobs)
	l.TextOffset = nonNil(l.TextOffset)
	return json.Marshal(plain(l))
}

// CompletionChoice is one choice of a completions response or chunk.
type CompletionChoice struct {
	Index    int                 `json:"index"`
	Text     string              `json:"text"`
	Logprobs *CompletionLogprobs `json:"logprobs"` // null when not requested
	// FinishReason is null in every stream chunk but the one that ends the
	// choice, so it is a pointer without omitempty.
	FinishReason *string `json:"finish_reason"`
}

// CompletionResponse is the body of a non-streaming /v1/completions answer.
type CompletionResponse struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"` // Unix seconds
	Model             string             `json:"model"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Choices           []CompletionChoice `json:"choices"`
	Usage             *Usage             `json:"usage"`
}

// MarshalJSON fills in Object and never sends choices as null.
func (r CompletionResponse) MarshalJSON() ([]byte, error) {
	type plain CompletionResponse
	r.Object = orDefault(r.Object, ObjectCompletion)
	r.Choices = nonNil(r.Choices)
	return json.Marshal(plain(r))
}

// CompletionChunk is one server-sent event of a streaming /v1/completions
// answer. OpenAI reuses "text_completion" as its object name. Usage is null
// except in the final usage chunk (stream_options.include_usage), whose
// Choices is empty.
type CompletionChunk struct {
	ID                string             `json:"id"`
	Object            string             `json:"object"`
	Created           int64              `json:"created"`
	Model             string             `json:"model"`
	SystemFingerprint *string            `json:"system_fingerprint"`
	Choices           []CompletionChoice `json:"choices"`
	Usage             *Usage             `json:"usage"`
}

// MarshalJSON fills in Object and sends an empty choices array, not null, in
// the usage chunk.
func (c CompletionChunk) MarshalJSON() ([]byte, error) {
	type plain CompletionChunk
	c.Object = orDefault(c.Object, ObjectCompletion)
	c.Choices = nonNil(c.Choices)
	return json.Marshal(plain(c))
}

// TopLogprob is one alternative token in chat logprobs.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob Logprob `json:"logprob"`
	// Bytes is the token's UTF-8 bytes as integers, because Token cannot carry
	// a partial character (JSON strings are Unicode). See TokenBytes.
	Bytes []int `json:"bytes"`
}

// ChatTokenLogprob is the logprob entry for one generated chat token.
type ChatTokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     Logprob      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// MarshalJSON sends top_logprobs as [] rather than null when none were asked
// for, as OpenAI does.
func (t ChatTokenLogprob) MarshalJSON() ([]byte, error) {
	type plain ChatTokenLogprob
	t.TopLogprobs = nonNil(t.TopLogprobs)
	return json.Marshal(plain(t))
}

// TokenBytes converts token text to the integer byte list of the "bytes"
// field; []byte would marshal as base64, which is not what clients expect.
func TokenBytes(s string) []int {
	out := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		out[i] = int(s[i])
	}
	return out
}

// ChatLogprobs is the chat logprobs object. Refusal is always null (this
// server never refuses in the model's voice), but OpenAI's schema
// requires the field and typed clients fail to decode without it.
type ChatLogprobs struct {
	Content []ChatTokenLogprob  `json:"content"`
	Refusal *[]ChatTokenLogprob `json:"refusal"`
}

// MarshalJSON sends content as [] rather than null.
func (l ChatLogprobs) MarshalJSON() ([]byte, error) {
	type plain ChatLogprobs
	l.Content = nonNil(l.Content)
	return json.Marshal(plain(l))
}

// ChatMessage is the assistant message of a non-streaming chat answer.
// Content is null when the message is only tool calls. Refusal is always
// null, and always sent: OpenAI's schema requires it.
type ChatMessage struct {
	Role             string     `json:"role"`
	Content          *string    `json:"content"`
	Refusal          *string    `json:"refusal"`
	ReasoningContent *string    `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
}

// ChatChoice is one choice of a non-streaming chat answer.
type ChatChoice struct {
	Index        int           `json:"index"`
	Message      ChatMessage   `json:"message"`
	Logprobs     *ChatLogprobs `json:"logprobs"` // null when not requested
	FinishReason *string       `json:"finish_reason"`
}

// ChatCompletionResponse is the body of a non-streaming
// /v1/chat/completions answer.
type ChatCompletionResponse struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	SystemFingerprint *string      `json:"system_fingerprint"`
	Choices           []ChatChoice `json:"choices"`
	Usage             *Usage       `json:"usage"`
}

// MarshalJSON fills in Object and never sends choices as null.
func (r ChatCompletionResponse) MarshalJSON() ([]byte, error) {
	type plain ChatCompletionResponse
	r.Object = orDefault(r.Object, ObjectChatCompletion)
	r.Choices = nonNil(r.Choices)
	return json.Marshal(plain(r))
}

// ChatDelta is the incremental message of a stream chunk. OpenAI sends the
// role once, in the first chunk (with content ""), then content only, and an
// empty delta {} in the chunk that carries finish_reason; omitempty on both
// fields and a pointer for Content let all three be expressed.
type ChatDelta struct {
	Role             string          `json:"role,omitempty"`
	Content          *string         `json:"content,omitempty"`
	ReasoningContent *string         `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCallDelta `json:"tool_calls,omitempty"`
}

// ChatChunkChoice is one choice of a chat stream chunk.
type ChatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        ChatDelta     `json:"delta"`
	Logprobs     *ChatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"` // null until the last chunk
}

// ChatCompletionChunk is one server-sent event of a streaming chat answer.
// Usage is null except in the final usage chunk, whose Choices is empty.
type ChatCompletionChunk struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	Created           int64             `json:"created"`
	Model             string            `json:"model"`
	SystemFingerprint *string           `json:"system_fingerprint"`
	Choices           []ChatChunkChoice `json:"choices"`
	Usage             *Usage            `json:"usage"`
}

// MarshalJSON fills in Object and sends an empty choices array, not null, in
// the usage chunk.
func (c ChatCompletionChunk) MarshalJSON() ([]byte, error) {
	type plain ChatCompletionChunk
	c.Object = orDefault(c.Object, ObjectChatChunk)
	c.Choices = nonNil(c.Choices)
	return json.Marshal(plain(c))
}

// Model is one entry of GET /v1/models, and the body of GET /v1/models/{id}.
type Model struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// MaxModelLen is the longest sequence served (vLLM's field); 0 when
	// unknown, which is left out.
	MaxModelLen int `json:"max_model_len,omitempty"`
}

// MarshalJSON fills in Object.
func (m Model) MarshalJSON() ([]byte, error) {
	type plain Model
	m.Object = orDefault(m.Object, ObjectModel)
	return json.Marshal(plain(m))
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// MarshalJSON fills in Object and sends an empty data array, not null.
func (l ModelList) MarshalJSON() ([]byte, error) {
	type plain ModelList
	l.Object = orDefault(l.Object, ObjectList)
	l.Data = nonNil(l.Data)
	return json.Marshal(plain(l))
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
