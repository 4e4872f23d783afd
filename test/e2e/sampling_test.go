package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

type choices struct {
	Choices []struct {
		Index   int    `json:"index"`
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

func (c choices) texts() []string {
	var out []string
	for i, ch := range c.Choices {
		if ch.Index != i {
			return append(out, fmt.Sprintf("<choice %d at index %d>", ch.Index, i))
		}
		out = append(out, ch.Text+ch.Message.Content)
	}
	return out
}

func ask(t *testing.T, url, path, body string) choices {
	t.Helper()
	code, _, b := post(t, url+path, body)
	var c choices
	if err := json.Unmarshal(b, &c); err != nil || code != 200 || len(c.Choices) == 0 {
		t.Fatalf("%s %s: %d %s", url+path, body, code, b)
	}
	return c
}

// The sampling controls and the chat template's inputs give the same
// answer standalone and through router, prefill and decode, and a different
// one from the request without them: a field dropped anywhere on the PD path
// (parser, router, the wire to prefill or decode, the engine) fails here.
func TestSamplingFieldsStandaloneAndPD(t *testing.T) {
	tmpl := filepath.Join(t.TempDir(), "t.jinja")
	src := "{{ bos_token }}{% for m in messages %}{% if m.name is defined %}{{ m.name }} said: {% endif %}{{ m['content'] }}{% endfor %}" +
		"{% if sad %} The end.{% endif %}"
	if err := os.WriteFile(tmpl, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: []string{"--kv-poison"}, RouterArgs: []string{"--chat-template", tmpl}})
	sa := startServer(t, "--kv-poison", "--chat-template", tmpl)

	const cmpl = `{"model":"stories260K","prompt":"Once upon a time","temperature":0,"max_tokens":48%s}`
	const chat = `{"model":"stories260K","messages":[{"role":"user","content":"Once upon a time"%s}],"temperature":0,"max_tokens":32%s}`
	ref := loadReference(t)
	for _, tc := range []struct {
		name, path, base, with string
	}{
		{"logit_bias", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, fmt.Sprintf(`,"logit_bias":{"%d":-100}`, ref.GeneratedIDs[0]))},
		{"frequency_penalty", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, `,"frequency_penalty":1.5`)},
		{"presence_penalty", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, `,"presence_penalty":2`)},
		{"repetition_penalty", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, `,"repetition_penalty":1.8`)},
		// The first token is prefill's, the rest decode's: EOS biased to the
		// top must be held off on both sides.
		{"min_tokens", "/v1/completions", fmt.Sprintf(cmpl, `,"logit_bias":{"2":100}`), fmt.Sprintf(cmpl, `,"logit_bias":{"2":100},"min_tokens":5`)},
		{"echo", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, `,"echo":true`)},
		{"n", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, `,"n":3`)},
		{"stop", "/v1/completions", fmt.Sprintf(cmpl, ""), fmt.Sprintf(cmpl, `,"stop":["x1","x2","x3","x4","x5"," girl"]`)},
		{"name", "/v1/chat/completions", fmt.Sprintf(chat, "", ""), fmt.Sprintf(chat, `,"name":"Tom"`, "")},
		{"chat_template_kwargs", "/v1/chat/completions", fmt.Sprintf(chat, "", ""), fmt.Sprintf(chat, "", `,"chat_template_kwargs":{"sad":true}`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := ask(t, sa.URL, tc.path, tc.base).texts()
			want := ask(t, sa.URL, tc.path, tc.with).texts()
			got := ask(t, c.Router.URL, tc.path, tc.with).texts()
			if strings.Join(got, "|") != strings.Join(want, "|") {
				t.Errorf("PD %q\nstandalone %q", got, want)
			}
			if strings.Join(want, "|") == strings.Join(base, "|") {
				t.Errorf("the field changed nothing: %q", want)
			}
		})
	}

	// echo with logprobs: the prompt's logprobs are prefill's on the PD
	// path, and must come through decode and the router unchanged.
	body0 := `{"model":"stories260K","prompt":"Once upon a time, there was a little","temperature":0,"max_tokens":4,"logprobs":1,"echo":true}`
	var lps [2][]*float64
	for i, u := range []string{sa.URL, c.Router.URL} {
		code, _, b := post(t, u+"/v1/completions", body0)
		var r struct {
			Choices []struct {
				Logprobs struct {
					TokenLogprobs []*float64 `json:"token_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
			Usage struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &r); err != nil || code != 200 || len(r.Choices) != 1 {
			t.Fatalf("%s echo with logprobs: %d %s", u, code, b)
		}
		lps[i] = r.Choices[0].Logprobs.TokenLogprobs
		if len(lps[i]) != r.Usage.PromptTokens+4 || lps[i][0] != nil || lps[i][1] == nil {
			t.Fatalf("%s echo with logprobs: %s", u, b)
		}
	}
	for j := 1; j < len(lps[0]); j++ {
		if d := *lps[0][j] - *lps[1][j]; d > 1e-3 || d < -1e-3 {
			t.Errorf("echo logprob %d: standalone %v, PD %v", j, *lps[0][j], *lps[1][j])
		}
	}

	// Seeded choices through the router: as many as asked, not all alike,
	// and the same again for the same seed.
	body := `{"model":"stories260K","prompt":"Once upon a time","temperature":1,"max_tokens":24,"seed":5,"n":3}`
	first := ask(t, c.Router.URL, "/v1/completions", body).texts()
	if len(first) != 3 || (first[0] == first[1] && first[1] == first[2]) {
		t.Errorf("seeded n=3 through the router: %q", first)
	}
	if again := ask(t, c.Router.URL, "/v1/completions", body).texts(); strings.Join(again, "|") != strings.Join(first, "|") {
		t.Errorf("seeded n=3 not reproducible: %q then %q", first, again)
	}
	// A seed means the same text wherever the request runs: decode carries
	// on the random stream prefill drew the first token from.
	if sat := ask(t, sa.URL, "/v1/completions", body).texts(); strings.Join(sat, "|") != strings.Join(first, "|") {
		t.Errorf("seeded n=3: PD %q, standalone %q", first, sat)
	}

	// The router answers /tokenize and /v1/models as standalone does.
	for _, path := range []string{"/tokenize"} {
		_, _, b1 := post(t, c.Router.URL+path, `{"model":"stories260K","prompt":"Once upon a time"}`)
		_, _, b2 := post(t, sa.URL+path, `{"model":"stories260K","prompt":"Once upon a time"}`)
		if string(b1) != string(b2) || !strings.Contains(string(b1), `"tokens":[1,403,407,261,378]`) {
			t.Errorf("%s: router %s, standalone %s", path, b1, b2)
		}
	}
	for _, u := range []string{c.Router.URL, sa.URL} {
		if code, b := get(t, u+"/v1/models"); code != 200 || !strings.Contains(string(b), `"max_model_len":512`) {
			t.Errorf("%s/v1/models: %d %s", u, code, b)
		}
	}
	c.WaitClean(t)
	waitPagesFree(t, sa)
}
