package chat

import (
	"strings"
	"testing"
)

// TestQwen3Tools renders tools, an assistant turn with a tool call and the
// tool's answer through the real Qwen3 template: the tools keep the key
// order the client wrote, and the call and its answer come back in the
// model's own format.
func TestQwen3Tools(t *testing.T) {
	tpl := qwen3Template(t)
	tool, err := DecodeJSON([]byte(`{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := tpl.RenderWith([]Message{
		{Role: "user", Content: "Weather in Paris?"},
		{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Name: "get_weather", Arguments: `{"city": "Paris"}`}}},
		{Role: "tool", Content: "sunny", ToolCallID: "c1"},
	}, true, map[string]any{"tools": []any{tool}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"<tools>\n" + `{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}` + "\n</tools>",
		"<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>",
		"<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered prompt lacks %q:\n%s", want, out)
		}
	}
}
