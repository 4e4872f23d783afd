package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/grammar"
)

// Without --tool-call-parser, a named or required tool_choice is served
// as vLLM serves it for any model: the grammar forces the call's JSON
// (the named function's arguments, or a list of {"name", "parameters"}
// calls) and tool_calls are built from that output, streamed and whole.
// Before, both were a 400 asking for a parser; only auto needs one.
func TestForcedToolChoiceWithoutParser(t *testing.T) {
	const tools = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
		{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}]`
	for _, c := range []struct {
		name, text, choice string
		names, args        []string
	}{
		{"named", `{"city": "Paris"}`, `{"type":"function","function":{"name":"get_weather"}}`, []string{"get_weather"}, []string{`{"city": "Paris"}`}},
		{"required", `[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_time", "parameters": {"tz": "UTC"}}]`, `"required"`,
			[]string{"get_weather", "get_time"}, []string{`{"city": "Paris"}`, `{"tz": "UTC"}`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts, g := scriptServer(t, c.text, "", "")
			body := `{"model":"m","messages":[{"role":"user","content":"weather?"}],` + tools + `,"tool_choice":` + c.choice + `}`
			st, a, raw := chatPost(t, ts, body)
			if st != http.StatusOK {
				t.Fatalf("status %d: %s", st, raw)
			}
			_, p := g.last()
			if p.Constraint.Kind != grammar.KindJSONSchema {
				t.Errorf("constraint %q, want a JSON schema", p.Constraint.Kind)
			}
			if _, err := grammar.Parse(p.Constraint.Kind, p.Constraint.Spec); err != nil {
				t.Fatalf("the forced schema does not compile: %v\n%s", err, p.Constraint.Spec)
			}
			m := a.Choices[0].Message
			if a.Choices[0].FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != len(c.names) {
				t.Fatalf("answer %s", raw)
			}
			for i, tc := range m.ToolCalls {
				if tc.Function.Name != c.names[i] || tc.Function.Arguments != c.args[i] || tc.Type != "function" || !strings.HasPrefix(tc.ID, "call_") {
					t.Errorf("call %d: %+v, want %s(%s)", i, tc, c.names[i], c.args[i])
				}
			}
			s := chatStream(t, ts, strings.Replace(body, `"model":"m",`, `"model":"m","stream":true,`, 1))
			if !slices.Equal(s.names, c.names) || !slices.Equal(s.args, c.args) || s.content != "" || s.finish != "tool_calls" {
				t.Errorf("streamed %+v, want %v %v", s, c.names, c.args)
			}
		})
	}
	// A tool whose parameters refer to their own $defs: under required,
	// each tool's schema keeps its root, so its $refs still resolve.
	t.Run("required with $ref", func(t *testing.T) {
		const refTools = `"tools":[{"type":"function","function":{"name":"book","parameters":{"type":"object","$defs":{"city":{"type":"string","enum":["Paris","Rome"]}},` +
			`"properties":{"to":{"$ref":"#/$defs/city"}},"required":["to"]}}},` +
			`{"type":"function","function":{"name":"wait","parameters":{"type":"object","definitions":{"s":{"type":"integer"}},"properties":{"secs":{"$ref":"#/definitions/s"}}}}}]`
		ts, g := scriptServer(t, `[{"name": "book", "parameters": {"to": "Rome"}}]`, "", "")
		st, a, raw := chatPost(t, ts, `{"model":"m","messages":[{"role":"user","content":"go"}],`+refTools+`,"tool_choice":"required"}`)
		if st != http.StatusOK {
			t.Fatalf("status %d: %s", st, raw)
		}
		_, p := g.last()
		if _, err := grammar.Parse(p.Constraint.Kind, p.Constraint.Spec); err != nil {
			t.Fatalf("the forced schema does not compile: %v\n%s", err, p.Constraint.Spec)
		}
		if m := a.Choices[0].Message; len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "book" || m.ToolCalls[0].Function.Arguments != `{"to": "Rome"}` {
			t.Fatalf("answer %s", raw)
		}
		if !strings.Contains(p.Constraint.Spec, `"#/$defs/tool0/$defs/city"`) || !strings.Contains(p.Constraint.Spec, `"#/$defs/tool1/definitions/s"`) {
			t.Errorf("the tools' $refs were not rebased under the list's $defs:\n%s", p.Constraint.Spec)
		}
	})
	// auto still has to find calls in free text, which needs a parser.
	ts, _ := scriptServer(t, "hi", "", "")
	st, _, raw := chatPost(t, ts, `{"model":"m","messages":[{"role":"user","content":"q"}],`+tools+`}`)
	if st != http.StatusBadRequest || !strings.Contains(raw, "tool-call-parser") {
		t.Errorf("tool_choice auto without a parser: %d %s", st, raw)
	}
}

// required lists what OpenAI's OpenAPI schema (openai/openai-openapi,
// CreateChatCompletionResponse, CreateChatCompletionStreamResponse,
// CreateCompletionResponse and the objects they hold) marks required,
// by path in the answer: fields typed clients fail to decode without.
var required = map[string][]string{
	"chat.completion": {"id", "object", "created", "model", "choices",
		"choices[].finish_reason", "choices[].index", "choices[].message", "choices[].logprobs",
		"choices[].message.role", "choices[].message.content", "choices[].message.refusal",
		"choices[].logprobs.content", "choices[].logprobs.refusal",
		"choices[].logprobs.content[].token", "choices[].logprobs.content[].logprob", "choices[].logprobs.content[].bytes", "choices[].logprobs.content[].top_logprobs",
		"choices[].logprobs.content[].top_logprobs[].token", "choices[].logprobs.content[].top_logprobs[].logprob", "choices[].logprobs.content[].top_logprobs[].bytes",
		"choices[].message.tool_calls[].id", "choices[].message.tool_calls[].type", "choices[].message.tool_calls[].function",
		"choices[].message.tool_calls[].function.name", "choices[].message.tool_calls[].function.arguments",
		"usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens"},
	"chat.completion.chunk": {"id", "object", "created", "model", "choices",
		"choices[].delta", "choices[].finish_reason", "choices[].index",
		"choices[].logprobs.content", "choices[].logprobs.refusal",
		"choices[].logprobs.content[].token", "choices[].logprobs.content[].logprob", "choices[].logprobs.content[].bytes", "choices[].logprobs.content[].top_logprobs",
		"choices[].delta.tool_calls[].index",
		"usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens"},
	"text_completion": {"id", "object", "created", "model", "choices",
		"choices[].finish_reason", "choices[].index", "choices[].logprobs", "choices[].text",
		"usage.prompt_tokens", "usage.completion_tokens", "usage.total_tokens"},
}

// missingRequired returns the required paths of doc's object type that
// an object present in doc lacks (a path under a null or absent optional
// parent is not asked for).
func missingRequired(t *testing.T, doc []byte) []string {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(doc, &v); err != nil {
		t.Fatalf("%v in %s", err, doc)
	}
	obj, _ := v["object"].(string)
	paths, ok := required[obj]
	if !ok {
		t.Fatalf("unknown object %q in %s", obj, doc)
	}
	var missing []string
	for _, p := range paths {
		if !hasPath(v, strings.Split(p, ".")) {
			missing = append(missing, p)
		}
	}
	return missing
}

// hasPath says whether every object reached by the path's parents has its
// last key; parents that are null or absent hold nothing to check.
func hasPath(v any, path []string) bool {
	key, list := strings.CutSuffix(path[0], "[]")
	m, ok := v.(map[string]any)
	if !ok {
		return true
	}
	x, present := m[key]
	if len(path) == 1 {
		return present
	}
	if !present || x == nil {
		return true
	}
	if !list {
		return hasPath(x, path[1:])
	}
	items, _ := x.([]any)
	for _, it := range items {
		if !hasPath(it, path[1:]) {
			return false
		}
	}
	return true
}

// Answers carry every field OpenAI's schema requires of them: chat's
// message.refusal and logprobs.refusal (null) were missing, and the
// OpenAI SDKs' typed clients and schema validators reject their absence.
func TestAnswersCarryRequiredFields(t *testing.T) {
	ts, _ := scriptServer(t, "Hello there", "hermes", "")
	tcTS, _ := scriptServer(t, `{"city": "Paris"}`, "", "")
	const tools = `,"tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}],"tool_choice":{"type":"function","function":{"name":"w"}}`
	for _, c := range []struct {
		name, path, body string
		srv              string
	}{
		{"chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "text"},
		{"chat logprobs", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":2}`, "text"},
		{"chat tool call", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]` + tools + `}`, "tools"},
		{"chat stream", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true,"logprobs":true,"stream_options":{"include_usage":true}}`, "text"},
		{"chat stream tool call", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stream":true` + tools + `}`, "tools"},
		{"completion", "/v1/completions", `{"prompt":"hi","logprobs":1}`, "text"},
		{"completion stream", "/v1/completions", `{"prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, "text"},
	} {
		url := ts.URL
		if c.srv == "tools" {
			url = tcTS.URL
		}
		body := strings.Replace(c.body, "{", `{"model":"m",`, 1)
		st, _, b := do(t, http.MethodPost, url+c.path, "", body)
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", c.name, st, b)
		}
		docs := [][]byte{b}
		if strings.Contains(c.body, `"stream":true`) {
			docs = nil
			sc := bufio.NewScanner(strings.NewReader(string(b)))
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok && line != "[DONE]" {
					docs = append(docs, []byte(line))
				}
			}
		}
		for _, d := range docs {
			if m := missingRequired(t, d); len(m) > 0 {
				t.Errorf("%s: %s lacks %v", c.name, d, m)
			}
		}
	}
}

// A request without model is served by the model the server serves, as
// vLLM, SGLang and llama.cpp serve it; before, it was a 400. A model that
// is named must still be the served one.
func TestModelDefaultsToTheServedOne(t *testing.T) {
	ts, _ := newTestServer(t, Options{})
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"hi","max_tokens":2}`},
		{"/v1/completions", `{"model":"","prompt":"hi","max_tokens":2}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`},
	} {
		st, _, b := do(t, http.MethodPost, ts.URL+c.path, "", c.body)
		var a struct {
			Model string `json:"model"`
		}
		_ = json.Unmarshal(b, &a)
		if st != http.StatusOK || a.Model != "m" {
			t.Errorf("%s %s: %d %s, want 200 from model m", c.path, c.body, st, b)
		}
	}
	if st, _, b := do(t, http.MethodPost, ts.URL+"/v1/completions", "", `{"model":"other","prompt":"hi"}`); st != http.StatusNotFound {
		t.Errorf("another model: %d %s", st, b)
	}
}

// A list of prompts (strings or token lists) is one request with n
// choices per prompt, prompt p's choice i at index p*n+i, usage summing
// the prompts, streamed or whole, as OpenAI, vLLM and llama.cpp serve
// it; before, it was a 400. Each choice answers what its prompt alone
// would.
func TestPromptBatch(t *testing.T) {
	ts := newEngineServer(t, nil)
	single := func(prompt string) (string, int) {
		c := post(t, ts, "/v1/completions", `{"model":"m","max_tokens":6,"temperature":0,"prompt":`+prompt+`}`)
		return c.Choices[0].Text, c.Usage.PromptTokens
	}
	for _, prompts := range [][]string{
		{`"Once upon a time"`, `"The little dog"`, `"She said"`},
		{`[1, 400, 500]`, `[1, 300]`},
	} {
		var texts []string
		promptTokens := 0
		for _, p := range prompts {
			text, n := single(p)
			texts, promptTokens = append(texts, text), promptTokens+n
		}
		list := "[" + strings.Join(prompts, ",") + "]"
		const n = 2
		c := post(t, ts, "/v1/completions", fmt.Sprintf(`{"model":"m","max_tokens":6,"temperature":0,"n":%d,"prompt":%s}`, n, list))
		if len(c.Choices) != n*len(prompts) || c.Usage.PromptTokens != promptTokens {
			t.Fatalf("%s: %d choices, %d prompt tokens; want %d and %d", list, len(c.Choices), c.Usage.PromptTokens, n*len(prompts), promptTokens)
		}
		for i, ch := range c.Choices {
			if ch.Index != i || ch.Text != texts[i/n] {
				t.Errorf("%s: choice %d is index %d %q, want %q", list, i, ch.Index, ch.Text, texts[i/n])
			}
		}
		st, _, b := do(t, http.MethodPost, ts.URL+"/v1/completions", "", fmt.Sprintf(`{"model":"m","max_tokens":6,"temperature":0,"n":%d,"stream":true,"prompt":%s}`, n, list))
		if st != http.StatusOK {
			t.Fatalf("stream: %d %s", st, b)
		}
		got := streamText(t, b)
		for i := range n * len(prompts) {
			if got[i] != texts[i/n] {
				t.Errorf("%s streamed: choice %d %q, want %q", list, i, got[i], texts[i/n])
			}
		}
	}
}

// A prompt over the context carries OpenAI's code context_length_exceeded
// on every path, so clients that trim and retry on it recognise it: the
// engine's own refusal (a text prompt, token ids, a chat, a max_tokens
// past the context) used to come back with code null.
func TestContextLengthCodeOnEveryPath(t *testing.T) {
	ts := newEngineServer(t, nil)
	long := strings.Repeat("Once upon a time there was a dog. ", 200)
	ids := strings.TrimSuffix(strings.Repeat("400,", 2000), ",")
	for _, c := range []struct{ name, path, body string }{
		{"text prompt", "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q}`, long)},
		{"token prompt", "/v1/completions", `{"model":"m","prompt":[` + ids + `]}`},
		{"token prompt in a list", "/v1/completions", `{"model":"m","prompt":[[` + ids + `]]}`},
		{"batch", "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":["hi",%q]}`, long)},
		{"chat", "/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, long)},
		{"max_tokens past the context", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":100000}`},
	} {
		st, _, b := do(t, http.MethodPost, ts.URL+c.path, "", c.body)
		if st != http.StatusBadRequest {
			t.Errorf("%s: %d %.300s", c.name, st, b)
			continue
		}
		if e := openAIError(t, c.name, b); e.Error.Code == nil || *e.Error.Code != "context_length_exceeded" {
			t.Errorf("%s: code %v in %s", c.name, e.Error.Code, b)
		}
	}
}

// A developer message reaches the model as the system turn: the bundled
// model's plain template used to print a role it never saw.
func TestDeveloperMessageIsSystem(t *testing.T) {
	ts, g := scriptServer(t, "ok", "", "")
	st, _, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"developer","content":"Be brief."},{"role":"user","content":"hi"}]}`)
	if st != http.StatusOK {
		t.Fatalf("%d %s", st, b)
	}
	tok, _ := qwen3(t)
	prompt, _ := g.last()
	if text := tok.Decode(prompt); !strings.HasPrefix(text, "system\nBe brief.\nuser\nhi") {
		t.Errorf("prompt %q has no system turn for the developer message", text)
	}
}
