package server

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

func TestTokenizeAndDetokenize(t *testing.T) {
	ts := newEngineServer(t, nil)
	tokenize := func(body string) tokenizeResponse {
		t.Helper()
		st, _, b := do(t, http.MethodPost, ts.URL+"/tokenize", "", body)
		if st != http.StatusOK {
			t.Fatalf("%s: %d %s", body, st, b)
		}
		var r tokenizeResponse
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	want := loadReference(t)
	r := tokenize(`{"model":"m","prompt":"Once upon a time"}`)
	if !slices.Equal(r.Tokens, want.PromptIDs) || r.Count != len(want.PromptIDs) || r.MaxModelLen != 512 {
		t.Errorf("prompt: %+v, want tokens %v and max_model_len 512", r, want.PromptIDs)
	}
	if r := tokenize(`{"prompt":"Once upon a time","add_special_tokens":false}`); !slices.Equal(r.Tokens, want.PromptIDs[1:]) {
		t.Errorf("without special tokens: %v", r.Tokens)
	}
	// Messages are counted as chat would send them: the plain template's
	// "user: ...\n\nassistant: ".
	r = tokenize(`{"model":"m","messages":[{"role":"user","content":"Once upon a time"}]}`)
	st, _, b := do(t, http.MethodPost, ts.URL+"/detokenize", "", `{"model":"m","tokens":`+mustJSON(r.Tokens)+`}`)
	var d struct{ Prompt string }
	if st != http.StatusOK || json.Unmarshal(b, &d) != nil || d.Prompt != "user: Once upon a time\n\nassistant: " {
		t.Errorf("messages round trip: %d %s", st, b)
	}
	c := post(t, ts, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":1}`)
	if c.Usage.PromptTokens != r.Count {
		t.Errorf("tokenize counts %d, chat used %d", r.Count, c.Usage.PromptTokens)
	}
	for _, bad := range []struct{ path, body, param string }{
		{"/tokenize", `{"model":"m"}`, "prompt"},
		{"/tokenize", `{"model":"m","prompt":5}`, "prompt"},
		{"/tokenize", `{"model":"m","messages":[{"role":"robot","content":"x"}]}`, "messages[0].role"},
		{"/tokenize", `{"prompt":"a","add_special_tokens":"yes"}`, "add_special_tokens"},
		{"/detokenize", `{"model":"m"}`, "tokens"},
		{"/detokenize", `{"tokens":[1,"a"]}`, "tokens"},
		{"/detokenize", `{"tokens":[1,512]}`, "tokens[1]"},
		{"/detokenize", `{"tokens":[-1]}`, "tokens[0]"},
	} {
		st, _, b := do(t, http.MethodPost, ts.URL+bad.path, "", bad.body)
		e := openAIError(t, bad.body, b)
		if st != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != bad.param {
			t.Errorf("%s %s: %d %s, want 400 naming %s", bad.path, bad.body, st, b, bad.param)
		}
	}
	if st, _, _ := do(t, http.MethodPost, ts.URL+"/tokenize", "", `{"model":"other","prompt":"a"}`); st != http.StatusNotFound {
		t.Errorf("unknown model: %d", st)
	}
}

func TestModelsCarryMaxModelLen(t *testing.T) {
	ts := newEngineServer(t, nil)
	for _, path := range []string{"/v1/models", "/v1/models/m"} {
		_, _, b := do(t, http.MethodGet, ts.URL+path, "", "")
		var m struct {
			MaxModelLen int `json:"max_model_len"`
			Data        []struct {
				MaxModelLen int `json:"max_model_len"`
			} `json:"data"`
		}
		_ = json.Unmarshal(b, &m)
		if got := m.MaxModelLen; path == "/v1/models" {
			if len(m.Data) != 1 || m.Data[0].MaxModelLen != 512 {
				t.Errorf("%s: %s", path, b)
			}
		} else if got != 512 {
			t.Errorf("%s: %s", path, b)
		}
	}
}

// Completions stop at 16 tokens when max_tokens is not given (OpenAI's
// documented default); chat goes on to the context or EOS.
func TestCompletionsDefaultMaxTokens(t *testing.T) {
	ts := newEngineServer(t, nil)
	c := post(t, ts, "/v1/completions", `{"model":"m","prompt":"Once upon a time","temperature":0}`)
	if c.Usage.CompletionTokens != 16 || c.Choices[0].FinishReason != "length" {
		t.Errorf("completions without max_tokens: %+v", c)
	}
	c = post(t, ts, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"Once upon a time"}],"temperature":0}`)
	if c.Usage.CompletionTokens <= 16 {
		t.Errorf("chat without max_tokens stopped at %d tokens", c.Usage.CompletionTokens)
	}
}

func TestSamplingRefusals(t *testing.T) {
	ts := newEngineServer(t, nil)
	for _, bad := range []struct{ path, body, param string }{
		{"/v1/completions", `{"model":"m","prompt":"a","logit_bias":{"512":1}}`, "logit_bias"},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"a"}],"logit_bias":{"99999":-100}}`, "logit_bias"},
		{"/v1/completions", `{"model":"m","prompt":"a","repetition_penalty":0}`, "repetition_penalty"},
		{"/v1/completions", `{"model":"m","prompt":[` + strings.Repeat("1,", maxEchoLogprobsTokens) + `1],"echo":true,"logprobs":0}`, "echo"},
		// Above the default max_tokens of 16.
		{"/v1/completions", `{"model":"m","prompt":"a","min_tokens":17}`, "min_tokens"},
	} {
		st, _, b := do(t, http.MethodPost, ts.URL+bad.path, "", bad.body)
		e := openAIError(t, bad.body, b)
		if st != http.StatusBadRequest || e.Error.Param == nil || *e.Error.Param != bad.param {
			t.Errorf("%s: %d %s, want 400 naming %s", bad.body, st, b, bad.param)
		}
	}
}
