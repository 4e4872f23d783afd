package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/model/hftest"
)

// A standalone server started without --tool-call-parser serves named
// and required tool choices (the grammar forces the call's JSON, so any
// model can call, as vLLM serves them), whole and streamed, with
// arguments that validate against the function's schema; before, both
// were a 400. The same process answers a browser's CORS preflight
// before the API key, and names the origin on every answer.
func TestForcedToolChoiceWithoutParserAndCORS(t *testing.T) {
	dir := t.TempDir()
	writeQwenShaped(t, dir, hftest.Spec{Arch: "Qwen3ForCausalLM", Vocab: 151936, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 128, Tie: true, DType: "BF16"})
	sa := startServer(t, "--model", dir, "--served-model-name", "tiny-qwen", "--max-total-tokens", "4096")
	val := compileSchema(t, weatherSchema)
	msgs := `"messages":[{"role":"user","content":"Weather in Paris for 3 days?"}]`
	for seed := range 2 {
		for _, choice := range []string{`"required"`, `{"type":"function","function":{"name":"get_weather"}}`} {
			// No model named: the served one answers.
			code, _, b := post(t, sa.URL+"/v1/chat/completions", `{`+msgs+`,"tools":`+toolsJSON+`,"tool_choice":`+choice+
				`,"parallel_tool_calls":false,"max_tokens":200,"temperature":1,"seed":`+string(rune('0'+seed))+`}`)
			var a toolAnswer
			if code != 200 || json.Unmarshal(b, &a) != nil || len(a.Choices) != 1 {
				t.Fatalf("%s: %d %s", choice, code, b)
			}
			c := a.Choices[0]
			if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || !strings.HasPrefix(c.Message.ToolCalls[0].ID, "call_") {
				t.Fatalf("%s seed %d: %s", choice, seed, b)
			}
			if call := c.Message.ToolCalls[0]; call.Function.Name == "get_weather" {
				validate(t, val, call.Function.Arguments)
			} else if choice != `"required"` {
				t.Fatalf("named choice called %q", call.Function.Name)
			}
		}
	}
	name, args, finish := streamToolCall(t, sa.URL, `{"model":"tiny-qwen","stream":true,`+msgs+`,"tools":`+toolsJSON+
		`,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"max_tokens":200,"temperature":1,"seed":5}`)
	if name != "get_weather" || finish != "tool_calls" {
		t.Fatalf("stream: %q %q %q", name, args, finish)
	}
	validate(t, val, args)

	req, _ := http.NewRequest(http.MethodOptions, sa.URL+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "https://app.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	if _, h, _ := post(t, sa.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1}`, "Origin", "https://app.example"); h.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("answer without Access-Control-Allow-Origin: %v", h)
	}
}
