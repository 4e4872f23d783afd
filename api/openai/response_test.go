package openai

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
)

// keyPaths lists every object key in a JSON document as a path
// ("choices[].message.role"), so two documents can be compared by shape.
func keyPaths(t *testing.T, doc []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("invalid JSON %s: %v", doc, err)
	}
	set := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				set[p] = true
				walk(p, x)
			}
		case []any:
			for _, x := range v {
				walk(prefix+"[]", x)
			}
		}
	}
	walk("", v)
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal %T: %v", v, err)
	}
	return b
}

// The reference documents are OpenAI's own examples from its API reference
// (chat and completions objects, streaming chunks, models, errors), trimmed
// of fields that newer models add and OpenAI's schema does not require
// (annotations, service_tier, usage details); refusal it requires. Top-level map keys of
// completions top_logprobs are token texts, so they are wildcarded below.
func TestResponseShapes(t *testing.T) {
	fp := (*string)(nil)
	chatLP := &ChatLogprobs{Content: []ChatTokenLogprob{{
		Token: "Hello", Logprob: -0.31725305, Bytes: TokenBytes("Hello"),
		TopLogprobs: []TopLogprob{{Token: "Hello", Logprob: -0.31725305, Bytes: TokenBytes("Hello")}},
	}}}
	var compLP CompletionLogprobs
	compLP.Add("Hello", -0.5, map[string]Logprob{"Hello": -0.5}, 0)

	for _, c := range []struct {
		name   string
		ours   any
		openai string
	}{
		{"chat completion", ChatCompletionResponse{
			ID: "chatcmpl-123", Created: 1677652288, Model: "gpt-4o-mini", SystemFingerprint: fp,
			Choices: []ChatChoice{{Message: ChatMessage{Role: "assistant", Content: new("Hello there")}, FinishReason: new(FinishStop)}},
			Usage:   NewUsage(9, 12),
		}, `{"id":"chatcmpl-123","object":"chat.completion","created":1677652288,"model":"gpt-4o-mini",
			"system_fingerprint":"fp_44709d6fcb",
			"choices":[{"index":0,"message":{"role":"assistant","content":"\n\nHello there","refusal":null},"logprobs":null,"finish_reason":"stop"}],
			"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`},
		{"chat completion with logprobs", ChatCompletionResponse{
			Choices: []ChatChoice{{Message: ChatMessage{Role: "assistant", Content: new("Hello")}, Logprobs: chatLP, FinishReason: new(FinishLength)}},
			Usage:   NewUsage(1, 1),
		}, `{"id":"chatcmpl-123","object":"chat.completion","created":1702685778,"model":"gpt-4o-mini","system_fingerprint":null,
			"choices":[{"index":0,"message":{"role":"assistant","content":"Hello","refusal":null},
				"logprobs":{"content":[{"token":"Hello","logprob":-0.31725305,"bytes":[72,101,108,108,111],
					"top_logprobs":[{"token":"Hello","logprob":-0.31725305,"bytes":[72,101,108,108,111]}]}],"refusal":null},
				"finish_reason":"stop"}],
			"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}`},
		{"chat chunk", ChatCompletionChunk{
			ID: "chatcmpl-123", Created: 1694268190, Model: "gpt-4o-mini",
			Choices: []ChatChunkChoice{{Delta: ChatDelta{Role: "assistant", Content: new("")}}},
		}, `{"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini",
			"system_fingerprint":"fp_44709d6fcb",
			"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],
			"usage":null}`},
		{"chat usage chunk", ChatCompletionChunk{ID: "chatcmpl-123", Usage: NewUsage(9, 12)},
			`{"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini",
			"system_fingerprint":"fp_44709d6fcb","choices":[],
			"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}`},
		{"completion", CompletionResponse{
			ID: "cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7", Created: 1589478378, Model: "gpt-3.5-turbo-instruct",
			Choices: []CompletionChoice{{Text: "This is", FinishReason: new(FinishLength)}},
			Usage:   NewUsage(5, 7),
		}, `{"id":"cmpl-uqkvlQyYK7bGYrRHQ0eXlWi7","object":"text_completion","created":1589478378,
			"model":"gpt-3.5-turbo-instruct","system_fingerprint":"fp_44709d6fcb",
			"choices":[{"text":"\n\nThis is indeed a test","index":0,"logprobs":null,"finish_reason":"length"}],
			"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`},
		{"completion with logprobs", CompletionResponse{
			Choices: []CompletionChoice{{Text: "Hello", Logprobs: &compLP, FinishReason: new(FinishLength)}},
			Usage:   NewUsage(5, 1),
		}, `{"id":"cmpl-1","object":"text_completion","created":1589478378,"model":"gpt-3.5-turbo-instruct","system_fingerprint":null,
			"choices":[{"text":"Hello","index":0,
				"logprobs":{"tokens":["Hello"],"token_logprobs":[-0.5],"top_logprobs":[{"Hello":-0.5}],"text_offset":[0]},
				"finish_reason":"length"}],
			"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`},
		{"completion chunk", CompletionChunk{Choices: []CompletionChoice{{Text: " a"}}},
			`{"id":"cmpl-1","object":"text_completion","created":1589478378,"model":"gpt-3.5-turbo-instruct","system_fingerprint":null,
			"choices":[{"text":" a","index":0,"logprobs":null,"finish_reason":null}],"usage":null}`},
		{"model list", ModelList{Data: []Model{{ID: "stories260K", Created: 1, OwnedBy: "baton"}}},
			`{"object":"list","data":[{"id":"model-id-0","object":"model","created":1686935002,"owned_by":"organization-owner"}]}`},
		{"error", NotFound("The model 'x' does not exist", "model_not_found"),
			`{"error":{"message":"The model 'x' does not exist","type":"invalid_request_error","param":null,"code":"model_not_found"}}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			ours := mustMarshal(t, c.ours)
			got, want := keyPaths(t, ours), keyPaths(t, []byte(c.openai))
			got = slices.DeleteFunc(got, func(p string) bool { return strings.Contains(p, "top_logprobs[].Hello") })
			want = slices.DeleteFunc(want, func(p string) bool { return strings.Contains(p, "top_logprobs[].Hello") })
			if !reflect.DeepEqual(got, want) {
				t.Errorf("key sets differ\nours:   %v\nopenai: %v\njson: %s", got, want, ours)
			}
		})
	}
}

// TestNullsAndDefaults pins the values clients branch on, not just the keys.
func TestNullsAndDefaults(t *testing.T) {
	for _, c := range []struct {
		name string
		v    any
		want string
	}{
		{"chunk with content", ChatCompletionChunk{ID: "c", Created: 1, Model: "m", Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new("hi")}}}},
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,"finish_reason":null}],"usage":null}`},
		{"final chunk", ChatCompletionChunk{ID: "c", Created: 1, Model: "m", Choices: []ChatChunkChoice{{FinishReason: new(FinishStop)}}},
			`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}`},
		{"usage chunk", CompletionChunk{ID: "c", Created: 1, Model: "m", Usage: NewUsage(2, 3)},
			`{"id":"c","object":"text_completion","created":1,"model":"m","system_fingerprint":null,"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}`},
		{"empty model list", ModelList{}, `{"object":"list","data":[]}`},
		{"empty completion logprobs", CompletionLogprobs{}, `{"tokens":[],"token_logprobs":[],"top_logprobs":[],"text_offset":[]}`},
		{"no top logprobs", ChatTokenLogprob{Token: "a", Logprob: -1, Bytes: TokenBytes("a")}, `{"token":"a","logprob":-1,"bytes":[97],"top_logprobs":[]}`},
		{"empty chat logprobs", ChatLogprobs{}, `{"content":[],"refusal":null}`},
		{"object kept when set", Model{ID: "x", Object: "custom"}, `{"id":"x","object":"custom","created":0,"owned_by":""}`},
		{"pointer marshals the same", &ModelList{}, `{"object":"list","data":[]}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := string(mustMarshal(t, c.v)); got != c.want {
				t.Errorf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

func TestLogprobNonFinite(t *testing.T) {
	v := []Logprob{Logprob(math.Inf(-1)), Logprob(math.NaN()), Logprob(math.Inf(1)), -1e6, -0.25, 0}
	if got, want := string(mustMarshal(t, v)), `[-9999,-9999,0,-9999,-0.25,0]`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
	var lp CompletionLogprobs
	lp.Add("x", math.Inf(-1), nil, 0)
	if got, want := string(mustMarshal(t, lp)), `{"tokens":["x"],"token_logprobs":[-9999],"top_logprobs":[{}],"text_offset":[0]}`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestTokenBytesPartialUTF8(t *testing.T) {
	// A byte-fallback token holding half of "é" cannot be a JSON string, which
	// is why "bytes" exists; it must survive exactly.
	if got := TokenBytes("\xc3"); !reflect.DeepEqual(got, []int{0xc3}) {
		t.Errorf("got %v", got)
	}
	if got := TokenBytes(""); got == nil || len(got) != 0 {
		t.Errorf("empty token: got %#v, want empty non-nil", got)
	}
}

// Routers decode worker chunks and re-encode them; that must be lossless.
func TestChunkRoundTrip(t *testing.T) {
	in := ChatCompletionChunk{ID: "chatcmpl-1", Object: ObjectChatChunk, Created: 5, Model: "m",
		Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new("x")}, FinishReason: new(FinishLength),
			Logprobs: &ChatLogprobs{Content: []ChatTokenLogprob{{Token: "x", Logprob: -2, Bytes: []int{120}, TopLogprobs: []TopLogprob{}}}}}},
		Usage: NewUsage(1, 2)}
	var out ChatCompletionChunk
	if err := json.Unmarshal(mustMarshal(t, in), &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip changed the chunk\nin  %+v\nout %+v", in, out)
	}
}

func TestNewID(t *testing.T) {
	a, b := NewID("chatcmpl-"), NewID("chatcmpl-")
	if a == b || !strings.HasPrefix(a, "chatcmpl-") || len(a) != len("chatcmpl-")+24 {
		t.Errorf("NewID gave %q and %q", a, b)
	}
}

// A message that is only tool calls has content null, as OpenAI sends it,
// and refusal is always null; reasoning_content and tool_calls are left out when absent.
func TestChatMessageWire(t *testing.T) {
	for _, c := range []struct {
		m    ChatMessage
		want string
	}{
		{ChatMessage{Role: "assistant", ToolCalls: []ToolCall{{ID: "call_1", Type: "function", Function: ToolCallFunction{Name: "f", Arguments: "{}"}}}},
			`{"role":"assistant","content":null,"refusal":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}`},
		{ChatMessage{Role: "assistant", Content: new("hi"), ReasoningContent: new("hmm")},
			`{"role":"assistant","content":"hi","refusal":null,"reasoning_content":"hmm"}`},
	} {
		b, err := json.Marshal(c.m)
		if err != nil || string(b) != c.want {
			t.Errorf("got %s (%v), want %s", b, err, c.want)
		}
	}
}
