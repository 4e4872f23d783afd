package openai

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// badCase is a body that must be rejected with 400 naming param ("" = none).
type badCase struct {
	name, body, param string
}

func checkBad(t *testing.T, parse func([]byte) *Error, cases []badCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := parse([]byte(c.body))
			if e == nil {
				t.Fatalf("accepted %s", c.body)
			}
			if e.Status != http.StatusBadRequest || e.Type != TypeInvalidRequest {
				t.Errorf("status %d type %q, want 400 invalid_request_error", e.Status, e.Type)
			}
			if e.Message == "" {
				t.Error("empty message")
			}
			got := ""
			if e.Param != nil {
				got = *e.Param
			}
			if got != c.param {
				t.Errorf("param %q, want %q (message %q)", got, c.param, e.Message)
			}
		})
	}
}

func parseCompletionErr(b []byte) *Error {
	r, e := ParseCompletionRequest(b)
	if (r == nil) == (e == nil) {
		panic("exactly one of request and error must be set")
	}
	return e
}

func parseChatErr(b []byte) *Error {
	r, e := ParseChatRequest(b)
	if (r == nil) == (e == nil) {
		panic("exactly one of request and error must be set")
	}
	return e
}

// sharedBad are failures common to both endpoints; %s stands for the
// endpoint's required input field.
var sharedBad = []badCase{
	{"empty body", ``, ""},
	{"bad json", `{"model":`, ""},
	{"trailing garbage", `{"model":"m"} x`, ""},
	{"not object", `[1,2]`, ""},
	{"null body", `null`, ""},
	{"string body", `"hi"`, ""},
	{"model not a string", `{"model":5,%s}`, "model"},
	{"model wrong type", `{"model":3,%s}`, "model"},
	{"stream wrong type", `{"model":"m",%s,"stream":"yes"}`, "stream"},
	{"stream_options without stream", `{"model":"m",%s,"stream_options":{"include_usage":true}}`, "stream_options"},
	{"stream_options wrong type", `{"model":"m",%s,"stream":true,"stream_options":true}`, "stream_options"},
	{"include_usage wrong type", `{"model":"m",%s,"stream":true,"stream_options":{"include_usage":1}}`, "stream_options.include_usage"},
	{"max_tokens zero", `{"model":"m",%s,"max_tokens":0}`, "max_tokens"},
	{"max_tokens negative", `{"model":"m",%s,"max_tokens":-5}`, "max_tokens"},
	{"max_tokens fractional", `{"model":"m",%s,"max_tokens":1.5}`, "max_tokens"},
	{"max_tokens string", `{"model":"m",%s,"max_tokens":"16"}`, "max_tokens"},
	{"max_tokens huge", `{"model":"m",%s,"max_tokens":99999999999999999999}`, "max_tokens"},
	{"temperature negative", `{"model":"m",%s,"temperature":-0.1}`, "temperature"},
	{"temperature too high", `{"model":"m",%s,"temperature":2.5}`, "temperature"},
	{"temperature overflow", `{"model":"m",%s,"temperature":1e999}`, "temperature"},
	{"temperature string", `{"model":"m",%s,"temperature":"0"}`, "temperature"},
	{"top_p zero", `{"model":"m",%s,"top_p":0}`, "top_p"},
	{"top_p above one", `{"model":"m",%s,"top_p":1.01}`, "top_p"},
	{"top_k -2", `{"model":"m",%s,"top_k":-2}`, "top_k"},
	{"top_k fractional", `{"model":"m",%s,"top_k":2.5}`, "top_k"},
	{"min_p above one", `{"model":"m",%s,"min_p":1.5}`, "min_p"},
	{"min_p negative", `{"model":"m",%s,"min_p":-1}`, "min_p"},
	{"seed string", `{"model":"m",%s,"seed":"1"}`, "seed"},
	{"seed fractional", `{"model":"m",%s,"seed":1.25}`, "seed"},
	{"n zero", `{"model":"m",%s,"n":0}`, "n"},
	{"n wrong type", `{"model":"m",%s,"n":"1"}`, "n"},
	{"stop number", `{"model":"m",%s,"stop":5}`, "stop"},
	{"stop empty string", `{"model":"m",%s,"stop":""}`, "stop"},
	{"stop element number", `{"model":"m",%s,"stop":["a",1]}`, "stop[1]"},
	{"stop element empty", `{"model":"m",%s,"stop":[""]}`, "stop[0]"},
	{"stop_token_ids not array", `{"model":"m",%s,"stop_token_ids":2}`, "stop_token_ids"},
	{"stop_token_ids negative", `{"model":"m",%s,"stop_token_ids":[1,-2]}`, "stop_token_ids[1]"},
	{"stop_token_ids too big", `{"model":"m",%s,"stop_token_ids":[4294967296]}`, "stop_token_ids[0]"},
	{"stop_token_ids string", `{"model":"m",%s,"stop_token_ids":["2"]}`, "stop_token_ids[0]"},
	{"ignore_eos wrong type", `{"model":"m",%s,"ignore_eos":1}`, "ignore_eos"},
	{"presence_penalty out of range", `{"model":"m",%s,"presence_penalty":3}`, "presence_penalty"},
	{"frequency_penalty wrong type", `{"model":"m",%s,"frequency_penalty":"0"}`, "frequency_penalty"},
	{"logit_bias wrong type", `{"model":"m",%s,"logit_bias":[]}`, "logit_bias"},
	{"n too many", `{"model":"m",%s,"n":129}`, "n"},
	{"n fractional", `{"model":"m",%s,"n":1.5}`, "n"},
	{"cache_salt empty", `{"model":"m",%s,"cache_salt":""}`, "cache_salt"},
	{"cache_salt number", `{"model":"m",%s,"cache_salt":7}`, "cache_salt"},
	{"cache_salt too long", `{"model":"m",%s,"cache_salt":"` + strings.Repeat("s", 1025) + `"}`, "cache_salt"},
	{"stop too many", `{"model":"m",%s,"stop":[` + strings.Repeat(`"a",`, MaxStop) + `"b"]}`, "stop"},
	{"stop too long", `{"model":"m",%s,"stop":"` + strings.Repeat("x", MaxStopBytes+1) + `"}`, "stop"},
	{"stop element too long", `{"model":"m",%s,"stop":["a","` + strings.Repeat("x", MaxStopBytes+1) + `"]}`, "stop[1]"},
	{"presence_penalty too low", `{"model":"m",%s,"presence_penalty":-2.5}`, "presence_penalty"},
	{"frequency_penalty out of range", `{"model":"m",%s,"frequency_penalty":2.01}`, "frequency_penalty"},
	{"repetition_penalty zero", `{"model":"m",%s,"repetition_penalty":0}`, "repetition_penalty"},
	{"repetition_penalty negative", `{"model":"m",%s,"repetition_penalty":-1}`, "repetition_penalty"},
	{"repetition_penalty too high", `{"model":"m",%s,"repetition_penalty":2.5}`, "repetition_penalty"},
	{"repetition_penalty string", `{"model":"m",%s,"repetition_penalty":"1"}`, "repetition_penalty"},
	{"logit_bias key not id", `{"model":"m",%s,"logit_bias":{"the":5}}`, "logit_bias"},
	{"logit_bias negative key", `{"model":"m",%s,"logit_bias":{"-1":5}}`, "logit_bias"},
	{"logit_bias key too big", `{"model":"m",%s,"logit_bias":{"4294967296":5}}`, "logit_bias"},
	{"logit_bias value too big", `{"model":"m",%s,"logit_bias":{"5":101}}`, "logit_bias"},
	{"logit_bias value too small", `{"model":"m",%s,"logit_bias":{"5":-100.5}}`, "logit_bias"},
	{"logit_bias value string", `{"model":"m",%s,"logit_bias":{"5":"1"}}`, "logit_bias"},
	{"logit_bias too many", `{"model":"m",%s,"logit_bias":{` + manyBiases(MaxLogitBias+1) + `}}`, "logit_bias"},
	{"min_tokens negative", `{"model":"m",%s,"min_tokens":-1}`, "min_tokens"},
	{"min_tokens string", `{"model":"m",%s,"min_tokens":"2"}`, "min_tokens"},
	{"min_tokens above max_tokens", `{"model":"m",%s,"min_tokens":9,"max_tokens":8}`, "min_tokens"},
}

func manyBiases(n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprintf(`"%d":1`, i)
	}
	return strings.Join(parts, ",")
}

func withField(cases []badCase, field string) []badCase {
	out := make([]badCase, len(cases))
	for i, c := range cases {
		c.body = strings.ReplaceAll(c.body, "%s", field)
		out[i] = c
	}
	return out
}

func TestParseCompletionRequestErrors(t *testing.T) {
	cases := withField(sharedBad, `"prompt":"hi"`)
	cases = append(cases, []badCase{
		{"no prompt", `{"model":"m"}`, "prompt"},
		{"null prompt", `{"model":"m","prompt":null}`, "prompt"},
		{"empty prompt", `{"model":"m","prompt":""}`, "prompt"},
		{"empty prompt array", `{"model":"m","prompt":[]}`, "prompt"},
		{"empty prompt in array", `{"model":"m","prompt":[""]}`, "prompt[0]"},
		{"empty ids in array", `{"model":"m","prompt":[[]]}`, "prompt[0]"},
		{"empty prompt in a batch", `{"model":"m","prompt":["a",""]}`, "prompt[1]"},
		{"number in a batch", `{"model":"m","prompt":["a",5]}`, "prompt[1]"},
		{"bad id in a batch", `{"model":"m","prompt":[[1],[2,-1]]}`, "prompt[1][1]"},
		{"batch over its bound", `{"model":"m","prompt":[` + strings.Repeat(`"a",`, MaxPrompts) + `"a"]}`, "prompt"},
		{"batch of too many choices", `{"model":"m","n":128,"prompt":[` + strings.Repeat(`"a",`, 8) + `"a"]}`, "n"},
		{"prompt number", `{"model":"m","prompt":5}`, "prompt"},
		{"prompt object", `{"model":"m","prompt":{"text":"a"}}`, "prompt"},
		{"mixed ids", `{"model":"m","prompt":[1,"a"]}`, "prompt[1]"},
		{"negative id", `{"model":"m","prompt":[1,2,-3]}`, "prompt[2]"},
		{"fractional id", `{"model":"m","prompt":[1.5]}`, "prompt[0]"},
		{"bad nested id", `{"model":"m","prompt":[[1,true]]}`, "prompt[0][1]"},
		{"nested string array", `{"model":"m","prompt":[["a"]]}`, "prompt[0][0]"},
		{"logprobs too many", `{"model":"m","prompt":"a","logprobs":6}`, "logprobs"},
		{"logprobs negative", `{"model":"m","prompt":"a","logprobs":-1}`, "logprobs"},
		{"logprobs bool", `{"model":"m","prompt":"a","logprobs":true}`, "logprobs"},
		{"echo wrong type", `{"model":"m","prompt":"a","echo":"no"}`, "echo"},
		{"best_of", `{"model":"m","prompt":"a","best_of":3}`, "best_of"},
		{"best_of not n", `{"model":"m","prompt":"a","n":2,"best_of":3}`, "best_of"},
		{"suffix", `{"model":"m","prompt":"a","suffix":"end"}`, "suffix"},
	}...)
	checkBad(t, parseCompletionErr, cases)
}

func TestParseChatRequestErrors(t *testing.T) {
	const msg = `"messages":[{"role":"user","content":"hi"}]`
	cases := withField(sharedBad, msg)
	cases = append(cases, []badCase{
		{"no messages", `{"model":"m"}`, "messages"},
		{"messages empty", `{"model":"m","messages":[]}`, "messages"},
		{"messages object", `{"model":"m","messages":{"role":"user"}}`, "messages"},
		{"message not object", `{"model":"m","messages":["hi"]}`, "messages[0]"},
		{"no role", `{"model":"m","messages":[{"content":"hi"}]}`, "messages[0].role"},
		{"bad role", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"robot","content":"hi"}]}`, "messages[1].role"},
		{"role wrong type", `{"model":"m","messages":[{"role":1,"content":"hi"}]}`, "messages[0].role"},
		{"no content", `{"model":"m","messages":[{"role":"user"}]}`, "messages[0].content"},
		{"content number", `{"model":"m","messages":[{"role":"user","content":5}]}`, "messages[0].content"},
		{"part not object", `{"model":"m","messages":[{"role":"user","content":["a"]}]}`, "messages[0].content[0]"},
		{"image part", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`, "messages[0].content[1].type"},
		{"part without type", `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, "messages[0].content[0].type"},
		{"text part without text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0].text"},
		{"name wrong type", `{"model":"m","messages":[{"role":"user","content":"a","name":7}]}`, "messages[0].name"},
		{"max_completion_tokens zero", `{"model":"m",` + msg + `,"max_completion_tokens":0}`, "max_completion_tokens"},
		{"max_completion_tokens string", `{"model":"m",` + msg + `,"max_completion_tokens":"8"}`, "max_completion_tokens"},
		{"max_tokens zero with max_completion_tokens", `{"model":"m",` + msg + `,"max_tokens":0,"max_completion_tokens":8}`, "max_tokens"},
		{"logprobs integer", `{"model":"m",` + msg + `,"logprobs":1}`, "logprobs"},
		{"top_logprobs without logprobs", `{"model":"m",` + msg + `,"top_logprobs":2}`, "top_logprobs"},
		{"top_logprobs too many", `{"model":"m",` + msg + `,"logprobs":true,"top_logprobs":21}`, "top_logprobs"},
		{"top_logprobs wrong type", `{"model":"m",` + msg + `,"logprobs":true,"top_logprobs":true}`, "top_logprobs"},
		{"tool_choice unknown function", `{"model":"m",` + msg + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`, "tool_choice"},
		{"tool_choice required without tools", `{"model":"m",` + msg + `,"tool_choice":"required"}`, "tool_choice"},
		{"tool_choice unknown", `{"model":"m",` + msg + `,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"any"}`, "tool_choice"},
		{"tool without name", `{"model":"m",` + msg + `,"tools":[{"type":"function","function":{}}]}`, "tools[0].function.name"},
		{"tool twice", `{"model":"m",` + msg + `,"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}`, "tools[1].function.name"},
		{"tool parameters not a schema", `{"model":"m",` + msg + `,"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]}`, "tools[0].function.parameters"},
		{"parallel_tool_calls not bool", `{"model":"m",` + msg + `,"parallel_tool_calls":1}`, "parallel_tool_calls"},
		{"tool_calls on a user turn", `{"model":"m","messages":[{"role":"user","content":"a","tool_calls":[]}]}`, "messages[0].tool_calls"},
		{"functions", `{"model":"m",` + msg + `,"functions":[{"name":"f"}]}`, "functions"},
		{"tools wrong type", `{"model":"m",` + msg + `,"tools":{}}`, "tools"},
		{"response_format unknown type", `{"model":"m",` + msg + `,"response_format":{"type":"xml"}}`, "response_format.type"},
		{"response_format schema missing", `{"model":"m",` + msg + `,"response_format":{"type":"json_schema","json_schema":{"name":"x"}}}`, "response_format.json_schema.schema"},
		{"two constraints", `{"model":"m",` + msg + `,"response_format":{"type":"json_object"},"regex":"a+"}`, "regex"},
		{"empty regex", `{"model":"m",` + msg + `,"regex":""}`, "regex"},
		{"ebnf not a string", `{"model":"m",` + msg + `,"ebnf":3}`, "ebnf"},
		{"chat_template_kwargs not object", `{"model":"m",` + msg + `,"chat_template_kwargs":[1]}`, "chat_template_kwargs"},
		{"min_tokens above max_completion_tokens", `{"model":"m",` + msg + `,"max_tokens":50,"max_completion_tokens":4,"min_tokens":5}`, "min_tokens"},
		{"response_format wrong type", `{"model":"m",` + msg + `,"response_format":"json"}`, "response_format"},
	}...)
	checkBad(t, parseChatErr, cases)
}

func defaults() Sampling { return Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1} }

func TestParseCompletionRequest(t *testing.T) {
	seed := int64(-7)
	for _, c := range []struct {
		name, body string
		want       CompletionRequest
	}{
		{"minimal", `{"model":"m","prompt":"Once upon a time"}`,
			CompletionRequest{Model: "m", Prompt: "Once upon a time", Sampling: defaults()}},
		{"one string in array", `{"model":"m","prompt":["hello"]}`,
			CompletionRequest{Model: "m", Prompt: "hello", Sampling: defaults()}},
		{"token ids", `{"model":"m","prompt":[1, 403, 407]}`,
			CompletionRequest{Model: "m", PromptTokenIDs: []int32{1, 403, 407}, Sampling: defaults()}},
		{"one id array", `{"model":"m","prompt":[[1,2147483647]]}`,
			CompletionRequest{Model: "m", PromptTokenIDs: []int32{1, 2147483647}, Sampling: defaults()}},
		{"everything", `{
			"model":"stories260K","prompt":"a","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false},
			"max_tokens":16,"temperature":0,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":-7,
			"stop":["\n","The end"],"stop_token_ids":[2],"logprobs":3,"n":1,"best_of":1,"echo":false,
			"presence_penalty":0,"frequency_penalty":0.0,"repetition_penalty":1,"logit_bias":{},
			"user":"u","ignore_eos":true,"suffix":null,"some_future_field":{"x":[1]}}`,
			CompletionRequest{Model: "stories260K", Prompt: "a", Stream: true, IncludeUsage: true, Sampling: Sampling{
				MaxTokens: 16, Temperature: 0, TopP: 0.9, TopK: 40, MinP: 0.05, Seed: &seed,
				Stop: []string{"\n", "The end"}, StopTokenIDs: []int32{2}, Logprobs: true, TopLogprobs: 3, IgnoreEOS: true,
				RepetitionPenalty: 1, N: 1,
			}}},
		{"sampling extensions", `{"model":"m","prompt":"a","n":3,"best_of":3,"echo":true,"presence_penalty":-0.5,"frequency_penalty":1.5,
			"repetition_penalty":1.3,"logit_bias":{"7":-100,"12":2.5},"min_tokens":4,"max_tokens":8}`,
			CompletionRequest{Model: "m", Prompt: "a", Echo: true, Sampling: Sampling{Temperature: 1, TopP: 1, MaxTokens: 8, N: 3,
				PresencePenalty: -0.5, FrequencyPenalty: 1.5, RepetitionPenalty: 1.3, LogitBias: map[int32]float64{7: -100, 12: 2.5}, MinTokens: 4}}},
		{"logprobs zero still on", `{"model":"m","prompt":"a","logprobs":0}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, Logprobs: true}}},
		{"nulls are absent", `{"model":"m","prompt":"a","max_tokens":null,"temperature":null,"stop":null,"logprobs":null,"n":null,"stream":null,"stream_options":null,"seed":null}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: defaults()}},
		{"cache salt", `{"model":"m","prompt":"a","cache_salt":"team-7"}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, CacheSalt: "team-7"}}},
		{"stop string", `{"model":"m","prompt":"a","stop":"\n\n"}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, Stop: []string{"\n\n"}}}},
		{"integral floats", `{"model":"m","prompt":"a","max_tokens":16.0,"top_k":1e1}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, MaxTokens: 16, TopK: 10}}},
		{"top_k -1 is off", `{"model":"m","prompt":"a","top_k":-1}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: defaults()}},
		{"stream without usage", `{"model":"m","prompt":"a","stream":true}`,
			CompletionRequest{Model: "m", Prompt: "a", Stream: true, Sampling: defaults()}},
		{"case-sensitive keys", `{"model":"m","prompt":"a","MAX_TOKENS":0}`,
			CompletionRequest{Model: "m", Prompt: "a", Sampling: defaults()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, e := ParseCompletionRequest([]byte(c.body))
			if e != nil {
				t.Fatalf("rejected: %v", e)
			}
			got.Sampling.Given = Given{} // checked by TestSamplingGiven
			if len(got.Prompts) != 1 || got.Prompts[0].Text != got.Prompt || !reflect.DeepEqual(got.Prompts[0].TokenIDs, got.PromptTokenIDs) {
				t.Errorf("Prompts %+v do not hold the one prompt", got.Prompts)
			}
			got.Prompts = nil
			if !reflect.DeepEqual(*got, c.want) {
				t.Errorf("got  %+v\nwant %+v", *got, c.want)
			}
		})
	}
}

func TestParseChatRequest(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       ChatRequest
	}{
		{"minimal", `{"model":"m","messages":[{"role":"user","content":"Once upon a time"}]}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "Once upon a time"}}, Sampling: defaults()}},
		{"roles and parts", `{"model":"m","messages":[
			{"role":"system","content":"be brief"},
			{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
			{"role":"user","content":"q","name":"ann"},
			{"role":"assistant","content":null,"tool_calls":[]},
			{"role":"tool","content":"r","tool_call_id":"x"}]}`,
			ChatRequest{Model: "m", Messages: []Message{
				{Role: "system", Content: "be brief"},
				{Role: "developer", Content: "ab"},
				{Role: "user", Content: "q", Name: "ann"},
				{Role: "assistant"},
				{Role: "tool", Content: "r", ToolCallID: "x"},
			}, Sampling: defaults()}},
		{"max_completion_tokens wins", `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":100,"max_completion_tokens":16}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}}, Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, MaxTokens: 16}}},
		{"max_tokens alone", `{"model":"m","messages":[{"role":"user","content":"a"}],"max_tokens":100}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}}, Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, MaxTokens: 100}}},
		{"logprobs", `{"model":"m","messages":[{"role":"user","content":"a"}],"logprobs":true,"top_logprobs":20,"stream":true,"stream_options":{"include_usage":false}}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}}, Stream: true, Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 1, Logprobs: true, TopLogprobs: 20}}},
		{"top_logprobs zero without logprobs", `{"model":"m","messages":[{"role":"user","content":"a"}],"top_logprobs":0}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}}, Sampling: defaults()}},
		{"template kwargs and n", `{"model":"m","messages":[{"role":"user","content":"a"}],"n":2,"min_tokens":3,"chat_template_kwargs":{"enable_thinking":false,"k":[1,"x"]}}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}}, Sampling: Sampling{Temperature: 1, TopP: 1, RepetitionPenalty: 1, N: 2, MinTokens: 3},
				TemplateKwargs: map[string]any{"enable_thinking": false, "k": []any{int64(1), "x"}}}},
		{"empty tools and text format", `{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[],"tool_choice":"none","response_format":{"type":"text"}}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}}, Sampling: defaults(), ToolChoice: ToolChoice{Mode: "none"}}},
		{"tools", `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":{"type":"function","function":{"name":"f"}},"parallel_tool_calls":false}`,
			ChatRequest{Model: "m", Messages: []Message{{Role: "user", Content: "a"}, {Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Type: "function", Function: ToolCallFunction{Name: "f", Arguments: "{}"}}}}}, Sampling: defaults(),
				Tools:      []Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object"}`), JSON: json.RawMessage(`{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}`)}},
				ToolChoice: ToolChoice{Mode: "function", Name: "f"}, SingleToolCall: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, e := ParseChatRequest([]byte(c.body))
			if e != nil {
				t.Fatalf("rejected: %v", e)
			}
			got.Sampling.Given = Given{} // checked by TestSamplingGiven
			if !reflect.DeepEqual(*got, c.want) {
				t.Errorf("got  %+v\nwant %+v", *got, c.want)
			}
		})
	}
}

func TestSamplingGreedy(t *testing.T) {
	for _, c := range []struct {
		s    Sampling
		want bool
	}{
		{Sampling{Temperature: 0, TopP: 1}, true},
		{Sampling{Temperature: 0.7, TopP: 1, TopK: 1}, true},
		{Sampling{Temperature: 0.7, TopP: 1}, false},
	} {
		if got := c.s.Greedy(); got != c.want {
			t.Errorf("%+v: Greedy() = %v", c.s, got)
		}
	}
}

// Given records exactly the sampling fields the request set, so a server can
// fill the others from the model's defaults.
func TestSamplingGiven(t *testing.T) {
	for body, want := range map[string]Given{
		`{"model":"m","prompt":"a"}`:                                                 {},
		`{"model":"m","prompt":"a","temperature":1}`:                                 {Temperature: true},
		`{"model":"m","prompt":"a","top_p":0.5,"top_k":-1}`:                          {TopP: true, TopK: true},
		`{"model":"m","prompt":"a","min_p":0,"temperature":null}`:                    {MinP: true},
		`{"model":"m","prompt":"a","temperature":0,"top_p":1,"top_k":3,"min_p":0.1}`: {true, true, true, true},
	} {
		got, e := ParseCompletionRequest([]byte(body))
		if e != nil {
			t.Fatalf("%s: %v", body, e)
		}
		if got.Sampling.Given != want {
			t.Errorf("%s: Given %+v, want %+v", body, got.Sampling.Given, want)
		}
	}
}

// The structured-output fields become one Constraint: the schema's own JSON
// for json_schema, the expression or grammar for regex and ebnf.
func TestParseConstraint(t *testing.T) {
	msg := `"messages":[{"role":"user","content":"hi"}]`
	for _, c := range []struct {
		body       string
		kind, spec string
	}{
		{`{"model":"m",` + msg + `}`, "", ""},
		{`{"model":"m",` + msg + `,"response_format":{"type":"text"}}`, "", ""},
		{`{"model":"m",` + msg + `,"response_format":{"type":"json_object"}}`, "json_object", ""},
		{`{"model":"m",` + msg + `,"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":{"type":"object"}}}}`, "json_schema", `{"type":"object"}`},
		{`{"model":"m",` + msg + `,"regex":"[a-z]+"}`, "regex", "[a-z]+"},
		{`{"model":"m",` + msg + `,"ebnf":"root ::= \"a\""}`, "ebnf", `root ::= "a"`},
	} {
		r, e := ParseChatRequest([]byte(c.body))
		if e != nil {
			t.Fatalf("%s: %v", c.body, e)
		}
		if got := r.Sampling.Constraint; got.Kind != c.kind || got.Spec != c.spec {
			t.Errorf("%s: constraint %+v, want %s %q", c.body, got, c.kind, c.spec)
		}
	}
	r, e := ParseCompletionRequest([]byte(`{"model":"m","prompt":"x","regex":"b+"}`))
	if e != nil || r.Sampling.Constraint.Kind != "regex" {
		t.Fatalf("completions regex: %+v %v", r, e)
	}
}
