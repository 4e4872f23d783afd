package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/scheduler"
)

type responseObj struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
	Output []struct {
		Type      string `json:"type"`
		ID        string `json:"id"`
		Role      string `json:"role"`
		Name      string `json:"name"`
		CallID    string `json:"call_id"`
		Arguments string `json:"arguments"`
		Content   []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
	} `json:"output"`
	Usage struct {
		InputTokens  int `json:"input_tokens"`
		OutputTokens int `json:"output_tokens"`
	} `json:"usage"`
	Instructions *string `json:"instructions"`
}

func postResponse(t *testing.T, ts *httptest.Server, body string) (int, responseObj, string) {
	t.Helper()
	st, _, b := do(t, http.MethodPost, ts.URL+"/v1/responses", "", body)
	var r responseObj
	if st == 200 {
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("%v in %s", err, b)
		}
	}
	return st, r, string(b)
}

func TestResponsesText(t *testing.T) {
	ts, g := scriptServer(t, "<think>\nshort\n</think>\n\nHello there.", "", "qwen3")
	st, r, raw := postResponse(t, ts, `{"model":"m","input":"Say hello","instructions":"Be kind."}`)
	if st != 200 || r.Object != "response" || r.Status != "completed" || len(r.Output) != 2 ||
		r.Output[0].Type != "reasoning" || r.Output[0].Content[0].Text != "short" ||
		r.Output[1].Type != "message" || r.Output[1].Role != "assistant" || r.Output[1].Content[0].Type != "output_text" ||
		r.Output[1].Content[0].Text != "Hello there." || r.Usage.OutputTokens == 0 || r.Instructions == nil || *r.Instructions != "Be kind." {
		t.Fatalf("%d %s", st, raw)
	}
	prompt, _ := g.last()
	if text := g.tok.Decode(prompt); !strings.Contains(text, "system\nBe kind.") || !strings.Contains(text, "user\nSay hello") {
		t.Fatalf("instructions or input missing from the prompt:\n%s", text)
	}
	// max_output_tokens and text.format reach the sampling parameters.
	postResponse(t, ts, `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":7,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}}}`)
	if _, p := g.last(); p.MaxTokens != 7 || p.Constraint.Kind != "json_schema" {
		t.Fatalf("params %+v", p)
	}
	for _, bad := range []string{
		`{"model":"m"}`,
		`{"model":"m","input":"x","previous_response_id":"resp_1"}`,
		`{"model":"m","input":"x","tools":[{"type":"web_search"}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`,
	} {
		if st, _, raw := postResponse(t, ts, bad); st != 400 {
			t.Errorf("%s: %d %s", bad, st, raw)
		}
	}
}

func TestResponsesFunctionCalls(t *testing.T) {
	ts, g := scriptServer(t, oneCall, "hermes", "")
	tool := `{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}`
	st, r, raw := postResponse(t, ts, `{"model":"m","input":"Weather in Paris?","tools":[`+tool+`],"tool_choice":"required"}`)
	if st != 200 || len(r.Output) != 1 || r.Output[0].Type != "function_call" || r.Output[0].Name != "get_weather" ||
		r.Output[0].Arguments != `{"city": "Paris"}` || !strings.HasPrefix(r.Output[0].CallID, "call_") {
		t.Fatalf("%d %s", st, raw)
	}
	if _, p := g.last(); p.Constraint.Kind != "tool_calls" {
		t.Fatalf("required did not constrain: %+v", p.Constraint)
	}
	// The call and its output go back through the template.
	postResponse(t, ts, `{"model":"m","tools":[`+tool+`],"input":[{"role":"user","content":"Weather in Paris?"},
		{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\": \"Paris\"}"},
		{"type":"function_call_output","call_id":"call_1","output":"sunny"}]}`)
	prompt, _ := g.last()
	if text := g.tok.Decode(prompt); !strings.Contains(text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>") ||
		!strings.Contains(text, "<tool_response>\nsunny\n</tool_response>") {
		t.Fatalf("history missing from the prompt:\n%s", text)
	}
}

// TestResponsesStream checks the event sequence a Responses client
// follows, and that its deltas rebuild the final response.
func TestResponsesStream(t *testing.T) {
	ts, _ := scriptServer(t, "Sure.\n"+oneCall, "hermes", "")
	resp, err := http.Post(ts.URL+"/v1/responses", "application/json", strings.NewReader(`{"model":"m","stream":true,"input":"Weather?","tools":[{"type":"function","name":"get_weather"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	var text, args string
	var final responseObj
	sc := bufio.NewScanner(resp.Body)
	lastEvent := ""
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			lastEvent = name
			continue
		}
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Type     string          `json:"type"`
			Seq      int             `json:"sequence_number"`
			Delta    string          `json:"delta"`
			Response json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		if ev.Type != lastEvent || ev.Seq != len(types) {
			t.Fatalf("event %q (line %q) numbered %d after %d events", ev.Type, lastEvent, ev.Seq, len(types))
		}
		types = append(types, ev.Type)
		switch ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.function_call_arguments.delta":
			args += ev.Delta
		case "response.completed":
			if err := json.Unmarshal(ev.Response, &final); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []string{"response.created", "response.in_progress",
		"response.output_item.added", "response.content_part.added", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done", "response.completed"}
	var compact []string
	for _, ty := range types {
		if n := len(compact); n > 0 && compact[n-1] == ty && strings.HasSuffix(ty, ".delta") {
			continue
		}
		compact = append(compact, ty)
	}
	if strings.Join(compact, ",") != strings.Join(want, ",") {
		t.Fatalf("events:\n%s\nwant\n%s", strings.Join(compact, "\n"), strings.Join(want, "\n"))
	}
	if text != "Sure." || args != `{"city": "Paris"}` || final.Status != "completed" || len(final.Output) != 2 ||
		final.Output[0].Content[0].Text != text || final.Output[1].Arguments != args {
		t.Fatalf("text %q args %q final %+v", text, args, final)
	}
}

// capGen is a scriptGen that ends at the request's max_tokens with
// finish length, as the scheduler does.
type capGen struct{ *scriptGen }

type capStream struct {
	Stream
	left int
}

func (g capGen) Generate(id string, prompt []int32, p scheduler.Params) (Stream, error) {
	st, err := g.scriptGen.Generate(id, prompt, p)
	if err != nil || p.MaxTokens <= 0 {
		return st, err
	}
	return &capStream{Stream: st, left: p.MaxTokens}, nil
}

func (s *capStream) Next(ctx context.Context) (scheduler.Event, bool) {
	ev, ok := s.Stream.Next(ctx)
	if s.left--; ok && s.left == 0 && ev.Finish == "" {
		ev.Finish = scheduler.FinishLength
	}
	return ev, ok
}

// capServer is scriptServer over a capGen.
func capServer(t *testing.T, text, reasoningParser string) *httptest.Server {
	tok, tpl := qwen3(t)
	s := New(Options{ModelName: "m", Tokenizer: tok, Template: tpl, Generator: capGen{&scriptGen{tok: tok, text: text}},
		Metrics: metrics.New("standalone"), ReasoningParser: reasoningParser})
	s.SetReady(true)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts
}

// streamResponse posts a streamed Responses request and returns its
// events' data in order.
func streamResponse(t *testing.T, ts *httptest.Server, body string) []map[string]any {
	t.Helper()
	resp, err := http.Post(ts.URL+"/v1/responses", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var evs []map[string]any
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, ev)
	}
	return evs
}

// TestResponsesIncompleteItem: an answer cut by max_output_tokens leaves
// its last item incomplete, as the response is; items finished before
// the cut stay completed.
func TestResponsesIncompleteItem(t *testing.T) {
	ts := capServer(t, "<think>\nshort\n</think>\n\nHello there, this is a long answer.", "qwen3")
	const body = `{"model":"m","input":"hi","max_output_tokens":12`
	st, _, raw := do(t, http.MethodPost, ts.URL+"/v1/responses", "", body+`}`)
	var whole struct {
		Status string `json:"status"`
		Output []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"output"`
	}
	if err := json.Unmarshal(raw, &whole); err != nil || st != 200 {
		t.Fatalf("%d %v %s", st, err, raw)
	}
	if whole.Status != "incomplete" || len(whole.Output) != 2 || whole.Output[0].Status != "completed" || whole.Output[1].Status != "incomplete" {
		t.Fatalf("whole: %s", raw)
	}
	var done []string
	var final map[string]any
	for _, ev := range streamResponse(t, ts, body+`,"stream":true}`) {
		switch ev["type"] {
		case "response.output_item.done":
			done = append(done, ev["item"].(map[string]any)["status"].(string))
		case "response.incomplete":
			final = ev["response"].(map[string]any)
		}
	}
	if strings.Join(done, ",") != "completed,incomplete" || final == nil {
		t.Fatalf("streamed item statuses %v, final %v", done, final)
	}
	out := final["output"].([]any)
	if s := out[len(out)-1].(map[string]any)["status"]; s != "incomplete" {
		t.Fatalf("final response's last item %v", s)
	}
}

// TestResponsesTextLogprobs: an output_text part carries logprobs ([]
// when none were asked for), as OpenAI's schema requires, in the whole
// response and in every streamed part.
func TestResponsesTextLogprobs(t *testing.T) {
	ts, _ := scriptServer(t, "Hello there.", "", "")
	_, _, raw := do(t, http.MethodPost, ts.URL+"/v1/responses", "", `{"model":"m","input":"hi"}`)
	if !strings.Contains(string(raw), `"type":"output_text"`) || !strings.Contains(string(raw), `"logprobs":[]`) {
		t.Fatalf("whole: %s", raw)
	}
	parts := 0
	for _, ev := range streamResponse(t, ts, `{"model":"m","input":"hi","stream":true}`) {
		var part map[string]any
		switch ev["type"] {
		case "response.content_part.added", "response.content_part.done":
			part = ev["part"].(map[string]any)
		case "response.output_item.done", "response.completed":
			if it, ok := ev["item"].(map[string]any); ok {
				part = it["content"].([]any)[0].(map[string]any)
			} else {
				r := ev["response"].(map[string]any)
				part = r["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)
			}
		default:
			continue
		}
		parts++
		if lp, ok := part["logprobs"].([]any); !ok || len(lp) != 0 {
			t.Fatalf("%s: part %v", ev["type"], part)
		}
	}
	if parts != 4 {
		t.Fatalf("%d parts seen", parts)
	}
}

// TestResponsesReasoningTokens: usage counts the tokens spent inside the
// reasoning block, all of them when the cut leaves only reasoning.
func TestResponsesReasoningTokens(t *testing.T) {
	ts := capServer(t, "<think>\nthinking hard about the question for a while\n</think>\n\nHi.", "qwen3")
	type usage struct {
		Status string `json:"status"`
		Usage  struct {
			OutputTokens int `json:"output_tokens"`
			Details      struct {
				Reasoning int `json:"reasoning_tokens"`
			} `json:"output_tokens_details"`
		} `json:"usage"`
	}
	for _, c := range []struct {
		body string
		all  bool
	}{
		{`{"model":"m","input":"hi","max_output_tokens":4}`, true},
		{`{"model":"m","input":"hi"}`, false},
	} {
		_, _, raw := do(t, http.MethodPost, ts.URL+"/v1/responses", "", c.body)
		var u usage
		if err := json.Unmarshal(raw, &u); err != nil {
			t.Fatal(err)
		}
		r, out := u.Usage.Details.Reasoning, u.Usage.OutputTokens
		if c.all && r != out || !c.all && (r == 0 || r >= out) {
			t.Errorf("%s: %d of %d output tokens counted as reasoning: %s", c.body, r, out, raw)
		}
	}
	// Without a reasoning parser nothing is reasoning.
	ts, _ = scriptServer(t, "<think>\nx\n</think>\n\nHi.", "", "")
	_, _, raw := do(t, http.MethodPost, ts.URL+"/v1/responses", "", `{"model":"m","input":"hi"}`)
	if !strings.Contains(string(raw), `"reasoning_tokens":0`) {
		t.Errorf("no parser: %s", raw)
	}
}

// The tools a response repeats carry what OpenAI's schema requires of a
// function tool, strict and parameters, with their defaults when the
// client left them out, and keep what it sent.
func TestResponsesEchoedToolsAreComplete(t *testing.T) {
	ts, _ := scriptServer(t, oneCall, "hermes", "")
	body := `{"model":"m","input":"Weather?","tools":[{"type":"function","name":"get_weather"},` +
		`{"type":"function","name":"now","parameters":{"type":"object"},"strict":false}]}`
	st, _, raw := postResponse(t, ts, body)
	var r struct {
		Tools []map[string]json.RawMessage `json:"tools"`
	}
	if st != 200 || json.Unmarshal([]byte(raw), &r) != nil || len(r.Tools) != 2 {
		t.Fatalf("%d %s", st, raw)
	}
	for i, want := range []map[string]string{
		{"name": `"get_weather"`, "strict": "true", "parameters": "null"},
		{"name": `"now"`, "strict": "false", "parameters": `{"type":"object"}`},
	} {
		for k, v := range want {
			if got, ok := r.Tools[i][k]; !ok || string(got) != v {
				t.Errorf("tools[%d].%s = %s (present %v), want %s", i, k, got, ok, v)
			}
		}
	}
}
