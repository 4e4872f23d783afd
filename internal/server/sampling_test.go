package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer/chat"
	testref "github.com/batonlm/baton/test/reference"
)

// newEngineServer serves the bundled model through a real engine, so that
// a field the server or the engine ignores shows in the output.
func newEngineServer(t *testing.T, tpl *chat.Template) *httptest.Server {
	t.Helper()
	l, err := model.Load(model.LoadOptions{}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 256, PageSize: 16, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	tok := bundledTokenizer(t)
	ms := metrics.New("standalone")
	e := scheduler.NewEngine(l.Model, pool, scheduler.Config{ContextLength: c.ContextLength, IsEOG: tok.IsEOG}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	if tpl == nil {
		tpl = chat.Plain()
	}
	s := New(Options{ModelName: "m", Tokenizer: tok, Template: tpl, Generator: EngineGenerator{Engine: e}, Metrics: ms,
		MaxModelLen: func() int { return c.ContextLength }})
	s.SetReady(true)
	ts := httptest.NewServer(s)
	t.Cleanup(func() { ts.Close(); cancel(); <-done })
	return ts
}

type completion struct {
	Choices []struct {
		Index        int    `json:"index"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
		Message      struct {
			Content string `json:"content"`
		} `json:"message"`
		Logprobs *struct {
			Tokens        []string  `json:"tokens"`
			TokenLogprobs []float64 `json:"token_logprobs"`
			TextOffset    []int     `json:"text_offset"`
		} `json:"logprobs"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func post(t *testing.T, ts *httptest.Server, path, body string) completion {
	t.Helper()
	st, _, b := do(t, http.MethodPost, ts.URL+path, "", body)
	if st != http.StatusOK {
		t.Fatalf("%s %s: %d %s", path, body, st, b)
	}
	var c completion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v in %s", path, err, b)
	}
	return c
}

// complete asks for a greedy completion of the reference prompt with extra
// fields and returns its text.
func complete(t *testing.T, ts *httptest.Server, extra string) string {
	t.Helper()
	c := post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":64`+extra+`}`)
	return c.Choices[0].Text
}

// Every sampling control changes the greedy completion; each test would
// pass with the field ignored only if the outputs matched, and they do not.
func TestSamplingFieldsChangeTheCompletion(t *testing.T) {
	ts := newEngineServer(t, nil)
	want := loadReference(t)
	base := complete(t, ts, "")
	if !strings.HasPrefix(want.GeneratedText, base) {
		t.Fatalf("greedy %q is not the reference %q", base, want.GeneratedText)
	}
	first := want.GeneratedIDs[0]
	for _, extra := range []string{
		fmt.Sprintf(`,"logit_bias":{"%d":-100}`, first),
		`,"frequency_penalty":2`,
		`,"presence_penalty":2`,
		`,"repetition_penalty":1.8`,
	} {
		got := complete(t, ts, extra)
		if got == base {
			t.Errorf("%s changed nothing: %q", extra, got)
		}
		if again := complete(t, ts, extra); again != got {
			t.Errorf("%s is not deterministic under greedy: %q then %q", extra, got, again)
		}
	}
	// Neutral values are the default.
	if got := complete(t, ts, `,"frequency_penalty":0,"presence_penalty":0,"repetition_penalty":1,"logit_bias":{}`); got != base {
		t.Errorf("neutral values changed the completion: %q", got)
	}
	// logit_bias can force a token too.
	tok := bundledTokenizer(t)
	forced, _ := tok.TokenID("▁Lily")
	if got := complete(t, ts, fmt.Sprintf(`,"logit_bias":{"%d":100},"max_tokens":3`, forced)); got != " Lily Lily Lily" {
		t.Errorf("logit_bias +100 on Lily: %q", got)
	}
}

// min_tokens keeps a stop string, a stop token and EOS from ending the
// completion early.
func TestMinTokens(t *testing.T) {
	ts := newEngineServer(t, nil)
	c := post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"stop":[" little"]}`)
	if c.Choices[0].Text != ", there was a" || c.Choices[0].FinishReason != "stop" {
		t.Fatalf("stop string: %+v", c.Choices[0])
	}
	c = post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"stop":[" little"],"min_tokens":8}`)
	if !strings.Contains(c.Choices[0].Text, " little") {
		t.Fatalf("stop string before min_tokens ended it: %+v", c.Choices[0])
	}
	want := loadReference(t)
	stop := want.GeneratedIDs[1]
	c = post(t, ts, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"stop_token_ids":[%d]}`, stop))
	if c.Usage.CompletionTokens != 2 {
		t.Fatalf("stop token: %+v", c)
	}
	c = post(t, ts, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"stop_token_ids":[%d],"min_tokens":6}`, stop))
	if c.Usage.CompletionTokens <= 6 {
		t.Fatalf("stop token before min_tokens ended it: %+v", c)
	}
	// EOS (id 2), pushed to the top by logit_bias, cannot end it early.
	c = post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"logit_bias":{"2":100}}`)
	if c.Usage.CompletionTokens != 1 || c.Choices[0].FinishReason != "stop" {
		t.Fatalf("EOS biased up: %+v", c)
	}
	c = post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"logit_bias":{"2":100},"min_tokens":5}`)
	if c.Usage.CompletionTokens != 6 || c.Choices[0].FinishReason != "stop" {
		t.Fatalf("EOS biased up with min_tokens 5: %+v", c)
	}
}

func TestEcho(t *testing.T) {
	ts := newEngineServer(t, nil)
	base := complete(t, ts, "")
	if got := complete(t, ts, `,"echo":true`); got != "Once upon a time"+base {
		t.Errorf("echo: %q", got)
	}
	c := post(t, ts, "/v1/completions", `{"model":"m","prompt":[1,403,407,261,378],"temperature":0,"max_tokens":64,"echo":true}`)
	if got := c.Choices[0].Text; got != "Once upon a time"+base {
		t.Errorf("echo of token ids: %q", got)
	}
	// Streamed, the prompt comes first, once.
	st, _, b := do(t, http.MethodPost, ts.URL+"/v1/completions", "", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":64,"echo":true,"stream":true}`)
	if st != http.StatusOK {
		t.Fatalf("%d %s", st, b)
	}
	if got := streamText(t, b)[0]; got != "Once upon a time"+base {
		t.Errorf("streamed echo: %q", got)
	}
}

// streamText joins the text of each choice index of an SSE body.
func streamText(t *testing.T, body []byte) map[int]string {
	t.Helper()
	out := map[int]string{}
	for _, line := range strings.Split(string(body), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Index int    `json:"index"`
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		for _, c := range ch.Choices {
			out[c.Index] += c.Text + c.Delta.Content
		}
	}
	return out
}

func TestManyStops(t *testing.T) {
	ts := newEngineServer(t, nil)
	stops := make([]string, 63)
	for i := range stops {
		stops[i] = fmt.Sprintf("zz%d", i)
	}
	stops = append(stops, " girl")
	b, _ := json.Marshal(stops)
	if got := complete(t, ts, `,"stop":`+string(b)); got != ", there was a little" {
		t.Errorf("64th stop string: %q", got)
	}
}

func TestN(t *testing.T) {
	ts := newEngineServer(t, nil)
	base := complete(t, ts, `,"max_tokens":24`)
	// Greedy: n identical choices, indexed, usage summed.
	c := post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0,"max_tokens":24,"n":3}`)
	if len(c.Choices) != 3 || c.Usage.CompletionTokens != 3*24 || c.Usage.PromptTokens != 5 {
		t.Fatalf("n=3: %+v", c)
	}
	for i, ch := range c.Choices {
		if ch.Index != i || ch.Text != base {
			t.Errorf("choice %d: %+v", i, ch)
		}
	}
	// Sampled with a seed: the choices differ from each other, the first is
	// the n=1 answer for that seed, and the whole is reproducible.
	body := `{"model":"m","prompt":"Once upon a time","temperature":1,"max_tokens":24,"seed":42,"n":4}`
	c = post(t, ts, "/v1/completions", body)
	texts := []string{}
	for _, ch := range c.Choices {
		texts = append(texts, ch.Text)
	}
	slices.Sort(texts)
	if len(slices.Compact(slices.Clone(texts))) < 3 {
		t.Errorf("seeded choices hardly differ: %q", texts)
	}
	one := post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":1,"max_tokens":24,"seed":42}`)
	if one.Choices[0].Text != c.Choices[0].Text {
		t.Errorf("choice 0 %q differs from n=1 %q for the same seed", c.Choices[0].Text, one.Choices[0].Text)
	}
	again := post(t, ts, "/v1/completions", body)
	for i := range c.Choices {
		if again.Choices[i].Text != c.Choices[i].Text {
			t.Errorf("choice %d not reproducible: %q then %q", i, c.Choices[i].Text, again.Choices[i].Text)
		}
	}
	// Chat, streamed: each index gets its own text.
	st, _, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", "",
		`{"model":"m","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":12,"seed":7,"n":3,"stream":true}`)
	if st != http.StatusOK {
		t.Fatalf("%d %s", st, b)
	}
	nc := post(t, ts, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":12,"seed":7,"n":3}`)
	streamed := streamText(t, b)
	if len(streamed) != 3 {
		t.Fatalf("streamed %d choices: %v", len(streamed), streamed)
	}
	for i, ch := range nc.Choices {
		if streamed[i] != ch.Message.Content {
			t.Errorf("choice %d: streamed %q, whole %q", i, streamed[i], ch.Message.Content)
		}
	}
}

// A chat template sees message names and chat_template_kwargs.
func TestChatTemplateNameAndKwargs(t *testing.T) {
	tpl, err := chat.New(`{% for m in messages %}{% if m.name is defined %}{{ m.name }} said: {% endif %}{{ m.content }}{% endfor %}`+
		`{% if short %} The end.{% endif %}`, "", "")
	if err != nil {
		t.Fatal(err)
	}
	ts := newEngineServer(t, tpl)
	ask := func(extra, name string) string {
		n := ""
		if name != "" {
			n = `,"name":"` + name + `"`
		}
		st, _, b := do(t, http.MethodPost, ts.URL+"/tokenize", "", `{"model":"m","messages":[{"role":"user","content":"Once upon a time"`+n+`}]`+extra+`}`)
		if st != http.StatusOK {
			t.Fatalf("%d %s", st, b)
		}
		var tr tokenizeResponse
		_ = json.Unmarshal(b, &tr)
		st, _, b = do(t, http.MethodPost, ts.URL+"/detokenize", "", fmt.Sprintf(`{"tokens":%s}`, mustJSON(tr.Tokens)))
		if st != http.StatusOK {
			t.Fatalf("%d %s", st, b)
		}
		var dr struct{ Prompt string }
		_ = json.Unmarshal(b, &dr)
		return dr.Prompt
	}
	if got := ask("", ""); got != "Once upon a time" {
		t.Errorf("plain: %q", got)
	}
	if got := ask("", "Tom"); got != "Tom said: Once upon a time" {
		t.Errorf("name: %q", got)
	}
	if got := ask(`,"chat_template_kwargs":{"short":true}`, ""); got != "Once upon a time The end." {
		t.Errorf("kwargs: %q", got)
	}
	// And generation runs from that prompt: different prompts, different text.
	gen := func(extra string) string {
		return post(t, ts, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Once upon a time"}],"temperature":0,"max_tokens":12`+extra+`}`).Choices[0].Message.Content
	}
	if gen("") == gen(`,"chat_template_kwargs":{"short":true}`) {
		t.Error("chat_template_kwargs did not reach the prompt")
	}
	st, _, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", "", `{"model":"m","messages":[{"role":"user","content":"a"}],"chat_template_kwargs":{"messages":[]}}`)
	if st != http.StatusBadRequest || openAIError(t, "reserved kwarg", b).Error.Param == nil {
		t.Errorf("reserved kwarg: %d %s", st, b)
	}
}

func loadReference(t *testing.T) testref.Greedy { return testref.Load(t) }

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// echo with logprobs puts the prompt's tokens in front: the first with a
// null logprob, each other with the model's prediction of it, which for a
// prompt made of a greedy continuation is the logprob it was generated with.
func TestEchoLogprobs(t *testing.T) {
	ts := newEngineServer(t, nil)
	want := loadReference(t)
	const k = 8
	plain := post(t, ts, "/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%s,"temperature":0,"max_tokens":%d,"logprobs":2}`, mustJSON(want.PromptIDs), k))
	prompt := append(append([]int32(nil), want.PromptIDs...), want.GeneratedIDs[:k]...)
	for _, stream := range []bool{false, true} {
		body := fmt.Sprintf(`{"model":"m","prompt":%s,"temperature":0,"max_tokens":3,"logprobs":2,"echo":true,"stream":%v}`, mustJSON(prompt), stream)
		st, _, b := do(t, http.MethodPost, ts.URL+"/v1/completions", "", body)
		if st != http.StatusOK {
			t.Fatalf("%d %s", st, b)
		}
		text, lp := joinLegacy(t, b, stream)
		if len(lp.Tokens) != len(prompt)+3 || len(lp.TokenLogprobs) != len(lp.Tokens) || len(lp.TextOffset) != len(lp.Tokens) || len(lp.TopLogprobs) != len(lp.Tokens) {
			t.Fatalf("stream=%v: %d tokens for a %d-token prompt and 3 generated: %s", stream, len(lp.Tokens), len(prompt), b)
		}
		if lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.Tokens[0] != "<s>" {
			t.Errorf("stream=%v: first prompt token %q logprob %v top %v, want null", stream, lp.Tokens[0], lp.TokenLogprobs[0], lp.TopLogprobs[0])
		}
		for j := range k {
			got, ref := lp.TokenLogprobs[len(want.PromptIDs)+j], plain.Choices[0].Logprobs.TokenLogprobs[j]
			if got == nil || *got-ref > 1e-4 || ref-*got > 1e-4 {
				t.Errorf("stream=%v: prompt token %d logprob %v, generated with %v", stream, len(want.PromptIDs)+j, got, ref)
			}
		}
		if !strings.HasPrefix(text, want.Prompt+want.GeneratedText[:10]) {
			t.Errorf("stream=%v: text %q", stream, text)
		}
		for i := 2; i < len(lp.Tokens); i++ {
			if off := lp.TextOffset[i]; off < lp.TextOffset[i-1] || !strings.HasPrefix(text[off:], lp.Tokens[i]) {
				t.Errorf("stream=%v: token %d %q at offset %d of %q", stream, i, lp.Tokens[i], off, text)
			}
		}
	}
}

type legacyLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// joinLegacy reads choice 0's text and logprobs from a completions answer,
// streamed or not.
func joinLegacy(t *testing.T, body []byte, stream bool) (string, legacyLogprobs) {
	t.Helper()
	type choice struct {
		Text     string          `json:"text"`
		Logprobs *legacyLogprobs `json:"logprobs"`
	}
	var text string
	var lp legacyLogprobs
	add := func(c choice) {
		text += c.Text
		if c.Logprobs != nil {
			lp.Tokens = append(lp.Tokens, c.Logprobs.Tokens...)
			lp.TokenLogprobs = append(lp.TokenLogprobs, c.Logprobs.TokenLogprobs...)
			lp.TopLogprobs = append(lp.TopLogprobs, c.Logprobs.TopLogprobs...)
			lp.TextOffset = append(lp.TextOffset, c.Logprobs.TextOffset...)
		}
	}
	lines := []string{string(body)}
	if stream {
		lines = nil
		for _, l := range strings.Split(string(body), "\n") {
			if d, ok := strings.CutPrefix(l, "data: "); ok && d != "[DONE]" {
				lines = append(lines, d)
			}
		}
	}
	for _, l := range lines {
		var r struct{ Choices []choice }
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		for _, c := range r.Choices {
			add(c)
		}
	}
	return text, lp
}
