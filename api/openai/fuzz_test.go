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
	if model == "" {
		t.Fatalf("accepted without a model: %q", body)
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
