package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/batonlm/baton/internal/model/hftest"
	"github.com/batonlm/baton/test/harness"
)

const weatherSchema = `{"type":"object","properties":{"city":{"type":"string","maxLength":10},` +
	`"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city","days"],"additionalProperties":false}`

var toolsJSON = `[{"type":"function","function":{"name":"get_weather","description":"Weather of a city","parameters":` + weatherSchema + `}},` +
	`{"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{"zone":{"enum":["UTC","CET"]}},"required":["zone"]}}}]`

type toolAnswer struct {
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

// Tool calls on a Qwen3-shaped model with random weights and the real
// Qwen3 tokenizer and template, standalone and through router, prefill
// and decode (--tool-call-parser hermes, --reasoning-parser qwen3): a
// required choice returns calls whose arguments validate against the
// function's schema; a named choice calls that function once; a streamed
// call reassembles; tool_choice none leaves call-shaped text as content
// while auto reads it as a call; a <think> block becomes reasoning_content.
func TestToolCallsQwen3(t *testing.T) {
	dir := t.TempDir()
	writeQwenShaped(t, dir, hftest.Spec{Arch: "Qwen3ForCausalLM", Vocab: 151936, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 32, FF: 128, Tie: true, DType: "BF16"})
	model := []string{"--model", dir, "--served-model-name", "tiny-qwen"}
	engine := append([]string{"--max-total-tokens", "4096"}, model...)
	// The parsers read the text the client gets: standalone and the router.
	parsers := append([]string{"--tool-call-parser", "hermes", "--reasoning-parser", "qwen3"}, model...)
	sa := startServer(t, append(append([]string{"--kv-poison"}, engine...), parsers[:4]...)...)
	cl := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: engine, RouterArgs: parsers})
	val := compileSchema(t, weatherSchema)
	msgs := `"messages":[{"role":"user","content":"Weather in Paris for 3 days?"}]`
	for _, url := range []string{sa.URL, cl.Router.URL} {
		ask := func(body string) toolAnswer {
			t.Helper()
			code, _, b := post(t, url+"/v1/chat/completions", body)
			var a toolAnswer
			if code != 200 || json.Unmarshal(b, &a) != nil || len(a.Choices) != 1 {
				t.Fatalf("%s: %d %s", url, code, b)
			}
			return a
		}
		for seed := range 3 {
			a := ask(`{"model":"tiny-qwen",` + msgs + `,"tools":` + toolsJSON + `,"tool_choice":"required","parallel_tool_calls":false,` +
				`"max_tokens":200,"temperature":1,"seed":` + string(rune('0'+seed)) + `}`)
			c := a.Choices[0]
			if c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 {
				t.Fatalf("%s required seed %d: %+v", url, seed, c)
			}
			call := c.Message.ToolCalls[0]
			if call.Type != "function" || !strings.HasPrefix(call.ID, "call_") {
				t.Fatalf("%s: call %+v", url, call)
			}
			if call.Function.Name == "get_weather" {
				validate(t, val, call.Function.Arguments)
			}
		}
		a := ask(`{"model":"tiny-qwen",` + msgs + `,"tools":` + toolsJSON + `,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"max_tokens":200,"temperature":1,"seed":4}`)
		if c := a.Choices[0]; c.FinishReason != "tool_calls" || len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "get_weather" {
			t.Fatalf("%s named: %+v", url, c)
		} else {
			validate(t, val, c.Message.ToolCalls[0].Function.Arguments)
		}
		// Streamed: the deltas add up to one call whose arguments validate.
		name, args, finish := streamToolCall(t, url, `{"model":"tiny-qwen","stream":true,`+msgs+`,"tools":`+toolsJSON+
			`,"tool_choice":{"type":"function","function":{"name":"get_weather"}},"max_tokens":200,"temperature":1,"seed":5}`)
		if name != "get_weather" || finish != "tool_calls" {
			t.Fatalf("%s stream: %q %q %q", url, name, args, finish)
		}
		validate(t, val, args)
		// Call-shaped text (forced by a regex): auto reads it as a call,
		// none leaves it as content.
		const callText = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>"
		re, _ := json.Marshal(strings.NewReplacer("{", `\{`, "}", `\}`).Replace(callText))
		for _, choice := range []string{"auto", "none"} {
			a := ask(`{"model":"tiny-qwen",` + msgs + `,"tools":` + toolsJSON + `,"tool_choice":"` + choice + `","regex":` + string(re) + `,"max_tokens":100}`)
			m := a.Choices[0].Message
			switch choice {
			case "auto":
				if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Arguments != `{"zone": "UTC"}` || m.Content != nil || a.Choices[0].FinishReason != "tool_calls" {
					t.Fatalf("%s auto: %+v", url, a.Choices[0])
				}
			case "none":
				if len(m.ToolCalls) != 0 || m.Content == nil || *m.Content != callText || a.Choices[0].FinishReason != "stop" {
					t.Fatalf("%s none: %+v", url, a.Choices[0])
				}
			}
		}
		// A think block (forced by a regex) is split off as reasoning.
		a = ask(`{"model":"tiny-qwen",` + msgs + `,"regex":"<think>\\nsunny\\n</think>\\n\\nIt is sunny\\.","max_tokens":100}`)
		if m := a.Choices[0].Message; m.ReasoningContent == nil || *m.ReasoningContent != "sunny" || m.Content == nil || *m.Content != "It is sunny." {
			t.Fatalf("%s reasoning: %+v", url, a.Choices[0])
		}
	}
	waitPagesFree(t, sa)
	cl.WaitClean(t)
}

func compileSchema(t *testing.T, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("s.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("s.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, args string) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		t.Fatalf("arguments %q are not JSON: %v", args, err)
	}
	if err := s.Validate(v); err != nil {
		t.Fatalf("arguments %q do not validate: %v", args, err)
	}
}

// streamToolCall streams a chat completion and reassembles its one tool
// call from the deltas.
func streamToolCall(t *testing.T, url, body string) (name, args, finish string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	pieces := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Delta struct {
					ToolCalls []struct {
						Index    int    `json:"index"`
						ID       string `json:"id"`
						Function struct {
							Name      string `json:"name"`
							Arguments string `json:"arguments"`
						} `json:"function"`
					} `json:"tool_calls"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		for _, c := range ch.Choices {
			for _, tc := range c.Delta.ToolCalls {
				if tc.Index != 0 {
					t.Fatalf("a second call: %s", data)
				}
				if tc.Function.Name != "" {
					if name != "" || tc.ID == "" {
						t.Fatalf("call named twice or without id: %s", data)
					}
					name = tc.Function.Name
				}
				args += tc.Function.Arguments
				pieces++
			}
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	if pieces < 2 {
		t.Fatalf("the call came in %d chunk(s); want it streamed", pieces)
	}
	return name, args, finish
}
