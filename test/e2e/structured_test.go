package e2e

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/batonlm/baton/test/harness"
)

// Structured output, standalone and through router, prefill and decode
// (prefill's first token obeys the constraint too, decode follows it from
// there): a JSON Schema's output parses and validates and ends when the
// object closes, a regex's output matches it whole, an EBNF grammar's is a
// sentence of it, and a schema that cannot be compiled is a 400 before any
// worker holds anything.
func TestStructuredOutput(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: []string{"--kv-poison"}})
	sa := startServer(t, "--kv-poison")
	schema := `{"type":"object","properties":{"name":{"type":"string","maxLength":8},"ok":{"type":"boolean"},` +
		`"mood":{"enum":["happy","sad"]},"tags":{"type":"array","items":{"enum":[1,2,3]},"maxItems":2}},` +
		`"required":["name","ok","mood"],"additionalProperties":false}`
	for _, url := range []string{sa.URL, c.Router.URL} {
		for seed := range 4 {
			body := `{"model":"stories260K","messages":[{"role":"user","content":"Tell me about Lily"}],"max_tokens":150,"temperature":0.9,"seed":` +
				string(rune('0'+seed)) + `,"response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"schema":` + schema + `}}}`
			code, _, b := post(t, url+"/v1/chat/completions", body)
			var r struct {
				Choices []struct {
					Message      struct{ Content string } `json:"message"`
					FinishReason string                   `json:"finish_reason"`
				} `json:"choices"`
			}
			if code != 200 || json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 {
				t.Fatalf("%s: %d %s", url, code, b)
			}
			out := r.Choices[0].Message.Content
			var v struct {
				Name *string `json:"name"`
				OK   *bool   `json:"ok"`
				Mood *string `json:"mood"`
				Tags []int   `json:"tags"`
			}
			dec := json.NewDecoder(strings.NewReader(out))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&v); err != nil {
				t.Fatalf("%s seed %d: output %q is not the schema's object: %v", url, seed, out, err)
			}
			switch {
			case v.Name == nil || v.OK == nil || v.Mood == nil:
				t.Errorf("%s seed %d: %q misses a required property", url, seed, out)
			case utf8.RuneCountInString(*v.Name) > 8:
				t.Errorf("%s seed %d: name %q is over maxLength 8", url, seed, *v.Name)
			case *v.Mood != "happy" && *v.Mood != "sad":
				t.Errorf("%s seed %d: mood %q is not in the enum", url, seed, *v.Mood)
			case len(v.Tags) > 2:
				t.Errorf("%s seed %d: %d tags, maxItems 2", url, seed, len(v.Tags))
			}
			if r.Choices[0].FinishReason != "stop" {
				t.Errorf("%s seed %d: finish %q, want stop once the object closed", url, seed, r.Choices[0].FinishReason)
			}
		}
		re := regexp.MustCompile(`^(yes|no)\. [a-z]{1,6}\.$`)
		for _, prompt := range []string{"Once upon a time", "Lily was"} {
			got := ask(t, url, "/v1/completions", `{"model":"stories260K","prompt":"`+prompt+`","max_tokens":40,"regex":"(yes|no)\\. [a-z]{1,6}\\."}`).texts()[0]
			if !re.MatchString(got) {
				t.Errorf("%s: %q does not match the regex", url, got)
			}
		}
		got := ask(t, url, "/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":40,"ebnf":"root ::= \"The \" animal \" ran.\"\nanimal ::= \"cat\" | \"dog\""}`).texts()[0]
		if got != "The cat ran." && got != "The dog ran." {
			t.Errorf("%s: %q is not a sentence of the grammar", url, got)
		}
		code, _, b := post(t, url+"/v1/completions", `{"model":"stories260K","prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{"properties":{"a":{"$ref":"#/nope"}}}}}}`)
		if code != 400 || !strings.Contains(string(b), "invalid_request_error") {
			t.Errorf("%s: a schema that cannot compile: %d %s", url, code, b)
		}
	}
	// Without a constraint the same chat request is free text, so the
	// checks above are the constraint's doing.
	free := ask(t, sa.URL, "/v1/chat/completions", `{"model":"stories260K","messages":[{"role":"user","content":"Tell me about Lily"}],"max_tokens":40,"temperature":0.9,"seed":1}`).texts()[0]
	if json.Valid([]byte(free)) {
		t.Fatalf("unconstrained output %q is JSON already; the test shows nothing", free)
	}
	for _, w := range c.Workers() {
		if m := harness.Metrics(t, w); m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] != m["baton_kv_pages_capacity"] {
			t.Errorf("%s: pages held after the requests: %v of %v free, %v cached", w.URL, m["baton_kv_pages_free"], m["baton_kv_pages_capacity"], m["baton_kv_pages_cached"])
		}
	}
}
