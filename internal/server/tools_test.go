package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/grammar"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
	"github.com/batonlm/baton/internal/tokenizer/chat"
)

// scriptGen answers every request with the tokens of a fixed text and
// remembers the last prompt and parameters it was given.
type scriptGen struct {
	tok  *tokenizer.Tokenizer
	text string
	mu   sync.Mutex
	// last request's
	prompt []int32
	params scheduler.Params
}

type scriptStream struct {
	ids []int32
	i   int
}

func (g *scriptGen) Generate(_ string, prompt []int32, p scheduler.Params) (Stream, error) {
	g.mu.Lock()
	g.prompt, g.params = prompt, p
	g.mu.Unlock()
	return &scriptStream{ids: g.tok.Encode(g.text, false, true)}, nil
}

func (s *scriptStream) Next(context.Context) (scheduler.Event, bool) {
	ev := scheduler.Event{Token: &model.Sampled{TokenLogprob: model.TokenLogprob{ID: s.ids[s.i]}}}
	s.i++
	if s.i == len(s.ids) {
		ev.Finish = scheduler.FinishStop
	}
	return ev, true
}
func (s *scriptStream) Cancel() {}
func (s *scriptStream) Stop()   {}

func (g *scriptGen) last() ([]int32, scheduler.Params) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.prompt, g.params
}

var qwen3Once struct {
	sync.Once
	tok *tokenizer.Tokenizer
	tpl *chat.Template
	err error
}

func qwen3(t *testing.T) (*tokenizer.Tokenizer, *chat.Template) {
	t.Helper()
	q := &qwen3Once
	q.Do(func() {
		const dir = "../../testdata/tokenizers/qwen3"
		q.tok, q.err = tokenizer.FromHFDir(dir)
		if q.err != nil {
			return
		}
		var b []byte
		if b, q.err = os.ReadFile(dir + "/tokenizer_config.json"); q.err != nil {
			return
		}
		var cfg struct {
			ChatTemplate string `json:"chat_template"`
		}
		if q.err = json.Unmarshal(b, &cfg); q.err == nil {
			q.tpl, q.err = chat.New(cfg.ChatTemplate, "", "<|im_end|>")
		}
	})
	if q.err != nil {
		t.Fatal(q.err)
	}
	return q.tok, q.tpl
}

// scriptServer serves the Qwen3 tokenizer and template over a scriptGen
// that answers text.
func scriptServer(t *testing.T, text, toolParser, reasoningParser string) (*httptest.Server, *scriptGen) {
	tok, tpl := qwen3(t)
	g := &scriptGen{tok: tok, text: text}
	s := New(Options{ModelName: "m", Tokenizer: tok, Template: tpl, Generator: g, Metrics: metrics.New("standalone"),
		ToolCallParser: toolParser, ReasoningParser: reasoningParser,
		Constraints: func(c scheduler.Constraint, _ prefixcache.Salt) error {
			_, err := grammar.Parse(c.Kind, c.Spec)
			return err
		}})
	s.SetReady(true)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, g
}

type chatAnswer struct {
	Choices []struct {
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content          *string `json:"content"`
			ReasoningContent *string `json:"reasoning_content"`
			ToolCalls        []struct {
				ID       string `json:"id"`
				Type     string `json:"type"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
	} `json:"choices"`
}

func chatPost(t *testing.T, ts *httptest.Server, body string) (int, chatAnswer, string) {
	t.Helper()
	st, _, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", "", body)
	var a chatAnswer
	if st == http.StatusOK {
		if err := json.Unmarshal(b, &a); err != nil {
			t.Fatalf("%v in %s", err, b)
		}
	}
	return st, a, string(b)
}

// streamed reassembles a chat stream as a client does.
type streamed struct {
	content, reasoning string
	names, args        []string
	ids                []string
	finish             string
}

func chatStream(t *testing.T, ts *httptest.Server, body string) streamed {
	t.Helper()
	resp, err := http.Post(ts.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var out streamed
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || line == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					Content          *string `json:"content"`
					ReasoningContent *string `json:"reasoning_content"`
					ToolCalls        []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Type     string `json:"type"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			t.Fatalf("%v in %s", err, line)
		}
		for _, c := range ch.Choices {
			if c.Delta.Content != nil {
				out.content += *c.Delta.Content
			}
			if c.Delta.ReasoningContent != nil {
				out.reasoning += *c.Delta.ReasoningContent
			}
			for _, tc := range c.Delta.ToolCalls {
				if tc.Index == len(out.names) {
					if tc.ID == "" || tc.Function.Name == "" || tc.Type != "function" {
						t.Fatalf("call %d starts without id, type or name: %s", tc.Index, line)
					}
					out.names, out.args, out.ids = append(out.names, tc.Function.Name), append(out.args, ""), append(out.ids, tc.ID)
				} else if tc.Function.Name != "" || tc.ID != "" {
					t.Fatalf("call %d named again: %s", tc.Index, line)
				}
				out.args[tc.Index] += tc.Function.Arguments
			}
			if c.FinishReason != nil {
				out.finish = *c.FinishReason
			}
		}
	}
	return out
}

const (
	weatherTool = `{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}`
	timeTool    = `{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}`
	userMsg     = `"messages":[{"role":"user","content":"Weather in Paris?"}]`
	oneCall     = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"
)

func TestToolCallsAuto(t *testing.T) {
	ts, g := scriptServer(t, oneCall, "hermes", "")
	body := `{"model":"m",` + userMsg + `,"tools":[` + weatherTool + `]}`
	st, a, raw := chatPost(t, ts, body)
	if st != 200 {
		t.Fatal(raw)
	}
	m := a.Choices[0].Message
	if a.Choices[0].FinishReason != "tool_calls" || m.Content != nil || len(m.ToolCalls) != 1 ||
		m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].Function.Arguments != `{"city": "Paris"}` ||
		m.ToolCalls[0].Type != "function" || !strings.HasPrefix(m.ToolCalls[0].ID, "call_") {
		t.Fatalf("answer %s", raw)
	}
	// The tools reached the template.
	prompt, p := g.last()
	if text := g.tok.Decode(prompt); !strings.Contains(text, "<tools>\n"+`{"type": "function", "function": {"name": "get_weather"`) {
		t.Fatalf("the prompt does not list the tools:\n%s", text)
	}
	if p.Constraint.Kind != "" {
		t.Fatalf("auto constrained the output: %+v", p.Constraint)
	}
	s := chatStream(t, ts, strings.Replace(body, `"model":"m"`, `"model":"m","stream":true`, 1))
	if s.finish != "tool_calls" || len(s.names) != 1 || s.names[0] != "get_weather" || s.args[0] != `{"city": "Paris"}` || s.content != "" {
		t.Fatalf("stream reassembled to %+v", s)
	}
}

func TestToolChoiceNone(t *testing.T) {
	ts, _ := scriptServer(t, oneCall, "hermes", "")
	st, a, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[`+weatherTool+`],"tool_choice":"none"}`)
	if st != 200 || len(a.Choices[0].Message.ToolCalls) != 0 || a.Choices[0].Message.Content == nil ||
		*a.Choices[0].Message.Content != oneCall || a.Choices[0].FinishReason != "stop" {
		t.Fatalf("tool_choice none: %s", raw)
	}
}

func TestToolChoiceConstrains(t *testing.T) {
	ts, g := scriptServer(t, oneCall, "hermes", "")
	for _, tc := range []struct {
		choice   string
		parallel string
		names    []string
		multi    bool
	}{
		{`"required"`, ``, []string{"get_weather", "get_time"}, true},
		{`"required"`, `,"parallel_tool_calls":false`, []string{"get_weather", "get_time"}, false},
		{`{"type":"function","function":{"name":"get_time"}}`, ``, []string{"get_time"}, false},
	} {
		st, _, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[`+weatherTool+`,`+timeTool+`],"tool_choice":`+tc.choice+tc.parallel+`}`)
		if st != 200 {
			t.Fatal(raw)
		}
		_, p := g.last()
		if p.Constraint.Kind != grammar.KindToolCalls {
			t.Fatalf("tool_choice %s: constraint %+v", tc.choice, p.Constraint)
		}
		var spec grammar.ToolCallSpec
		if err := json.Unmarshal([]byte(p.Constraint.Spec), &spec); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, f := range spec.Tools {
			names = append(names, f.Name)
		}
		if spec.Format != "hermes" || spec.Parallel != tc.multi || strings.Join(names, ",") != strings.Join(tc.names, ",") {
			t.Fatalf("tool_choice %s%s: spec %+v", tc.choice, tc.parallel, spec)
		}
	}
	// A schema the grammar cannot follow is the client's 400.
	st, _, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","not":{}}}}],"tool_choice":"required"}`)
	if st != 400 || !strings.Contains(raw, `"param":"tools"`) {
		t.Fatalf("uncompilable parameters: %d %s", st, raw)
	}
	st, _, raw = chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[`+weatherTool+`],"tool_choice":"required","response_format":{"type":"json_object"}}`)
	if st != 400 {
		t.Fatalf("required with response_format: %d %s", st, raw)
	}
}

func TestParallelToolCallsFalseKeepsOne(t *testing.T) {
	ts, _ := scriptServer(t, oneCall+"\n"+strings.Replace(oneCall, "Paris", "Rome", 1), "hermes", "")
	for _, extra := range []string{``, `,"parallel_tool_calls":false`} {
		_, a, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[`+weatherTool+`]`+extra+`}`)
		want := 2
		if extra != "" {
			want = 1
		}
		if len(a.Choices[0].Message.ToolCalls) != want {
			t.Fatalf("%q: %s", extra, raw)
		}
	}
}

func TestToolsNeedAParser(t *testing.T) {
	ts, _ := scriptServer(t, oneCall, "", "")
	if st, _, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[`+weatherTool+`]}`); st != 400 || !strings.Contains(raw, "tool-call-parser") {
		t.Fatalf("tools without a parser: %d %s", st, raw)
	}
	if st, _, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`,"tools":[`+weatherTool+`],"tool_choice":"none"}`); st != 200 {
		t.Fatalf("tool_choice none without a parser: %d %s", st, raw)
	}
}

func TestToolHistoryReachesTemplate(t *testing.T) {
	ts, g := scriptServer(t, "It is sunny.", "hermes", "")
	st, a, raw := chatPost(t, ts, `{"model":"m","messages":[{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"sunny, 21C"}],"tools":[`+weatherTool+`]}`)
	if st != 200 || *a.Choices[0].Message.Content != "It is sunny." || a.Choices[0].FinishReason != "stop" {
		t.Fatal(raw)
	}
	prompt, _ := g.last()
	text := g.tok.Decode(prompt)
	for _, want := range []string{
		// (decoding drops the special tokens <|im_start|> and <|im_end|>)
		"assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\nuser",
		"<tool_response>\nsunny, 21C\n</tool_response>",
	} {
		if !strings.Contains(text, want) {
			t.Fatalf("prompt lacks %q:\n%s", want, text)
		}
	}
}

func TestReasoningParser(t *testing.T) {
	const answer = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny."
	ts, g := scriptServer(t, answer, "", "qwen3")
	_, a, raw := chatPost(t, ts, `{"model":"m",`+userMsg+`}`)
	m := a.Choices[0].Message
	if m.ReasoningContent == nil || *m.ReasoningContent != "The user wants weather." || *m.Content != "It is sunny." {
		t.Fatalf("reasoning not split: %s", raw)
	}
	s := chatStream(t, ts, `{"model":"m","stream":true,`+userMsg+`}`)
	if s.reasoning != "The user wants weather." || s.content != "It is sunny." {
		t.Fatalf("streamed split: %+v", s)
	}
	// enable_thinking=false: the template closes the block in the prompt
	// and the answer is all content.
	_, a, raw = chatPost(t, ts, `{"model":"m",`+userMsg+`,"chat_template_kwargs":{"enable_thinking":false}}`)
	if a.Choices[0].Message.ReasoningContent != nil || *a.Choices[0].Message.Content != answer {
		t.Fatalf("enable_thinking false: %s", raw)
	}
	if prompt, _ := g.last(); !strings.HasSuffix(g.tok.Decode(prompt), "<think>\n\n</think>\n\n") {
		t.Fatalf("enable_thinking did not reach the template")
	}
	// Without the parser the block stays in the content.
	ts2, _ := scriptServer(t, answer, "", "")
	if _, a, raw := chatPost(t, ts2, `{"model":"m",`+userMsg+`}`); a.Choices[0].Message.ReasoningContent != nil || *a.Choices[0].Message.Content != answer {
		t.Fatalf("no parser: %s", raw)
	}
}

func TestReasoningThenToolCall(t *testing.T) {
	ts, _ := scriptServer(t, "<think>\nI should call it.\n</think>\n\n"+oneCall, "hermes", "qwen3")
	s := chatStream(t, ts, `{"model":"m","stream":true,`+userMsg+`,"tools":[`+weatherTool+`]}`)
	if s.reasoning != "I should call it." || len(s.names) != 1 || s.args[0] != `{"city": "Paris"}` || s.finish != "tool_calls" {
		t.Fatalf("got %+v", s)
	}
}

func TestChatEcho(t *testing.T) {
	ts, _ := scriptServer(t, " upon a time", "", "")
	body := `{"model":"m","messages":[{"role":"user","content":"Tell a story"},{"role":"assistant","content":"Once"}],"echo":true}`
	if _, a, raw := chatPost(t, ts, body); *a.Choices[0].Message.Content != "Once upon a time" {
		t.Fatalf("echo: %s", raw)
	}
	if s := chatStream(t, ts, strings.Replace(body, `"echo"`, `"stream":true,"echo"`, 1)); s.content != "Once upon a time" {
		t.Fatalf("streamed echo: %+v", s)
	}
	if _, a, raw := chatPost(t, ts, strings.Replace(body, `"echo":true`, `"echo":false`, 1)); *a.Choices[0].Message.Content != " upon a time" {
		t.Fatalf("no echo: %s", raw)
	}
}

// /tokenize renders the tools as a chat request would, with or without a
// tool-call parser.
func TestTokenizeWithTools(t *testing.T) {
	for _, parser := range []string{"", "hermes"} {
		ts, _ := scriptServer(t, "x", parser, "")
		count := func(body string) int {
			st, _, b := do(t, http.MethodPost, ts.URL+"/tokenize", "", body)
			var r struct{ Count int }
			if st != 200 || json.Unmarshal(b, &r) != nil {
				t.Fatalf("%d %s", st, b)
			}
			return r.Count
		}
		plain, with := count(`{`+userMsg+`}`), count(`{`+userMsg+`,"tools":[`+weatherTool+`]}`)
		if with <= plain+20 {
			t.Fatalf("parser %q: %d tokens with tools, %d without", parser, with, plain)
		}
	}
}
