package openai

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// seedBodies gives the fuzzers valid bodies and near misses to mutate.
func seedBodies(f *testing.F) {
	for _, c := range sharedBad {
		f.Add([]byte(strings.ReplaceAll(c.body, "%s", `"prompt":"a","messages":[{"role":"user","content":"a"}]`)))
	}
	for _, s := range []string{
		`{"model":"m","prompt":"Once upon a time","max_tokens":16,"temperature":0}`,
		`{"model":"m","prompt":[[1,2,3]],"logprobs":2,"stop":["x"],"stop_token_ids":[2]}`,
		`{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"max_completion_tokens":4}`,
		`{"model":"m","messages":[{"role":"assistant","content":null}],"logprobs":true,"top_logprobs":3,"seed":1e3}`,
		`{"model":"m","prompt":"a","top_k":-1,"min_p":0.1,"top_p":0.5,"n":1,"presence_penalty":0}`,
		`{"model":"m","prompt":"a","n":2,"echo":true,"logit_bias":{"3":-100},"frequency_penalty":1,"repetition_penalty":1.2,"min_tokens":2}`,
		`{"model":"m","messages":[{"role":"user","content":"a","name":"x"}],"chat_template_kwargs":{"enable_thinking":true},"n":3}`,
	} {
		f.Add([]byte(s))
	}
}

// checkParsed holds a parser to its contract: a request or a 400, never
// both, and any accepted request within the documented ranges.
func checkParsed(t *testing.T, body []byte, model string, s *Sampling, stream, includeUsage bool, e *Error) {
	if e != nil {
		if e.Status != http.StatusBadRequest || e.Message == "" || e.Type != TypeInvalidRequest {
			t.Fatalf("bad error %+v for %q", e, body)
		}
		if _, err := json.Marshal(e); err != nil {
			t.Fatalf("error does not marshal: %v", err)
		}
		return
	}
	if s.MaxTokens < 0 || s.Temperature < 0 || s.Temperature > 2 || s.TopP <= 0 || s.TopP > 1 ||
		s.TopK < 0 || s.MinP < 0 || s.MinP > 1 || len(s.Stop) > MaxStop ||
		s.TopLogprobs < 0 || s.TopLogprobs > MaxChatTopLogprobs || (s.TopLogprobs > 0 && !s.Logprobs) {
		t.Fatalf("out-of-range sampling %+v from %q", *s, body)
	}
	if s.N < 1 || s.N > MaxN || s.MinTokens < 0 || (s.MaxTokens > 0 && s.MinTokens > s.MaxTokens) ||
		s.PresencePenalty < -2 || s.PresencePenalty > 2 || s.FrequencyPenalty < -2 || s.FrequencyPenalty > 2 ||
		s.RepetitionPenalty <= 0 || s.RepetitionPenalty > 2 || len(s.LogitBias) > MaxLogitBias {
		t.Fatalf("out-of-range sampling %+v from %q", *s, body)
	}
	for id, b := range s.LogitBias {
		if id < 0 || b < -MaxLogitBiasValue || b > MaxLogitBiasValue {
			t.Fatalf("bad logit_bias %d:%g from %q", id, b, body)
		}
	}
	for _, st := range s.Stop {
		if st == "" || len(st) > MaxStopBytes {
			t.Fatalf("bad stop %q from %q", st, body)
		}
	}
	for _, id := range s.StopTokenIDs {
		if id < 0 {
			t.Fatalf("negative stop token id from %q", body)
		}
	}
	if includeUsage && !stream {
		t.Fatalf("include_usage without stream from %q", body)
	}
}

func FuzzParseCompletionRequest(f *testing.F) {
	seedBodies(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, e := ParseCompletionRequest(body)
		if (r == nil) == (e == nil) {
			t.Fatalf("want exactly one of request and error, got %v and %v", r, e)
		}
		if r == nil {
			checkParsed(t, body, "", nil, false, false, e)
			return
		}
		checkParsed(t, body, r.Model, &r.Sampling, r.Stream, r.IncludeUsage, nil)
		if (r.Prompt == "") == (r.PromptTokenIDs == nil) || (r.PromptTokenIDs != nil && len(r.PromptTokenIDs) == 0) {
			t.Fatalf("want exactly one non-empty prompt form, got %q and %v from %q", r.Prompt, r.PromptTokenIDs, body)
		}
		if r.Sampling.TopLogprobs > MaxCompletionLogprobs {
			t.Fatalf("logprobs %d from %q", r.Sampling.TopLogprobs, body)
		}
	})
}

func FuzzParseChatRequest(f *testing.F) {
	seedBodies(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		r, e := ParseChatRequest(body)
		if (r == nil) == (e == nil) {
			t.Fatalf("want exactly one of request and error, got %v and %v", r, e)
		}
		if r == nil {
			checkParsed(t, body, "", nil, false, false, e)
			return
		}
		checkParsed(t, body, r.Model, &r.Sampling, r.Stream, r.IncludeUsage, nil)
		if len(r.Messages) == 0 {
			t.Fatalf("accepted with no messages: %q", body)
		}
		for _, m := range r.Messages {
			switch m.Role {
			case RoleSystem, RoleUser, RoleAssistant, RoleDeveloper, RoleTool:
			default:
				t.Fatalf("role %q accepted from %q", m.Role, body)
			}
		}
	})
}

func FuzzParseResponsesRequest(f *testing.F) {
	seedBodies(f)
	for _, s := range []string{
		`{"model":"m","input":"hi","instructions":"be brief","max_output_tokens":8,"temperature":0}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"x"}]}`,
		`{"model":"m","input":"a","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, e := ParseResponsesRequest(body)
		if (r == nil) == (e == nil) {
			t.Fatalf("want exactly one of request and error, got %v and %v", r, e)
		}
		if r == nil {
			checkParsed(t, body, "", nil, false, false, e)
			return
		}
		checkParsed(t, body, r.Chat.Model, &r.Chat.Sampling, r.Stream, false, nil)
		if len(r.Chat.Messages) == 0 || r.Chat.Sampling.N != 1 {
			t.Fatalf("accepted %+v from %q", r.Chat, body)
		}
	})
}

func TestParseResponsesRequest(t *testing.T) {
	r, e := ParseResponsesRequest([]byte(`{"model":"m","instructions":"sys","max_output_tokens":9,"parallel_tool_calls":false,
		"tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},
		"input":[{"role":"user","content":"q"},{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
		{"type":"function_call","call_id":"c2","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"r1"},
		{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}]}`))
	if e != nil {
		t.Fatal(e)
	}
	c := r.Chat
	got := []string{}
	for _, m := range c.Messages {
		s := m.Role + ":" + m.Content + ":" + m.ToolCallID
		for _, tc := range m.ToolCalls {
			s += ":" + tc.ID + "=" + tc.Function.Name + tc.Function.Arguments
		}
		got = append(got, s)
	}
	want := []string{"system:sys:", "user:q:", `assistant:::c1=f{"a":1}:c2=f{}`, "tool:r1:c1", "assistant:done:"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("messages\n%v\nwant\n%v", got, want)
	}
	if c.Sampling.MaxTokens != 9 || !c.SingleToolCall || c.ToolChoice != (ToolChoice{Mode: ToolChoiceFunction, Name: "f"}) || len(c.Tools) != 1 || c.Tools[0].Name != "f" {
		t.Fatalf("request %+v", c)
	}
	for body, param := range map[string]string{
		`{"model":"m","input":"a","max_output_tokens":0}`:                                         "max_output_tokens",
		`{"model":"m","input":[]}`:                                                                "input",
		`{"model":"m","input":[{"type":"image"}]}`:                                                "input[0].type",
		`{"model":"m","input":"a","text":{"format":{"type":"xml"}}}`:                              "text.format.type",
		`{"model":"m","input":"a","tool_choice":{"type":"function"}}`:                             "tool_choice",
		`{"model":"m","input":[{"type":"function_call","name":"f"}]}`:                             "input[0]",
		`{"model":"m","input":"a","previous_response_id":"r"}`:                                    "previous_response_id",
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_file","file_id":"x"}]}]}`: "input[0].content[0].type",
	} {
		_, e := ParseResponsesRequest([]byte(body))
		if e == nil || e.Param == nil || *e.Param != param {
			t.Errorf("%s: %+v, want param %s", body, e, param)
		}
	}
}
