package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Tool choices: the model may call a tool (auto), must not (none), must
// call at least one (required), or must call the one named (function).
const (
	ToolChoiceAuto     = "auto"
	ToolChoiceNone     = "none"
	ToolChoiceRequired = "required"
	ToolChoiceFunction = "function"
)

// maxTools bounds the functions of one request: each is compiled into the
// grammar of a required call.
const maxTools = 128

// Tool is one function the model may call.
type Tool struct {
	Name        string
	Description string
	// Parameters is the function's JSON Schema (nil when not given).
	Parameters json.RawMessage
	// JSON is the tool object as the client sent it, for the chat
	// template's tools variable.
	JSON json.RawMessage
}

// ToolChoice is a request's tool_choice: Mode is one of the ToolChoice
// constants, Name the function when Mode is ToolChoiceFunction.
type ToolChoice struct {
	Mode, Name string
}

// ToolCall is one call of an assistant message, in a request's history
// or in an answer.
type ToolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function ToolCallFunction `json:"function"`
}

// ToolCallFunction names the function called and its arguments as a JSON
// text.
type ToolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// ToolCallDelta is a streamed piece of a tool call: the first names the
// call (id, type, function.name), the later ones add argument text.
type ToolCallDelta struct {
	Index    int                   `json:"index"`
	ID       string                `json:"id,omitempty"`
	Type     string                `json:"type,omitempty"`
	Function ToolCallFunctionDelta `json:"function"`
}

// ToolCallFunctionDelta is the function part of a ToolCallDelta.
type ToolCallFunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// FinishToolCalls ends a choice that made tool calls.
const FinishToolCalls = "tool_calls"

// tools reads tools, tool_choice and parallel_tool_calls. The legacy
// functions field is refused: clients that still send it expect
// function_call back, which is not served.
func (f fields) tools(r *ChatRequest) *Error {
	if raw, ok := f.get("functions"); ok {
		n := 0
		if !eachElement(raw, func(int, json.RawMessage) bool { n++; return false }) {
			return BadRequest("functions must be an array", "functions")
		}
		if n > 0 {
			return BadRequest("functions is deprecated and not supported; send tools", "functions")
		}
	}
	if v, ok, e := f.bool("parallel_tool_calls"); e != nil {
		return e
	} else if ok {
		r.SingleToolCall = !v
	}
	if raw, ok := f.get("tools"); ok {
		var list []json.RawMessage
		if !eachElement(raw, func(_ int, el json.RawMessage) bool {
			list = append(list, el)
			return len(list) <= maxTools
		}) {
			return BadRequest("tools must be an array of tool objects", "tools")
		}
		if len(list) > maxTools {
			return BadRequest(fmt.Sprintf("tools may list at most %d functions", maxTools), "tools")
		}
		seen := map[string]bool{}
		for i, el := range list {
			t, e := parseTool(bytes.TrimSpace(el), fmt.Sprintf("tools[%d]", i))
			if e != nil {
				return e
			}
			if seen[t.Name] {
				return BadRequest(fmt.Sprintf("tools[%d]: function %q is listed twice", i, t.Name), fmt.Sprintf("tools[%d].function.name", i))
			}
			seen[t.Name] = true
			r.Tools = append(r.Tools, t)
		}
	}
	if len(r.Tools) > 0 {
		r.ToolChoice.Mode = ToolChoiceAuto
	}
	raw, ok := f.get("tool_choice")
	if !ok {
		return nil
	}
	if s, ok := parseString(raw); ok {
		switch s {
		case ToolChoiceAuto, ToolChoiceNone, ToolChoiceRequired:
			r.ToolChoice.Mode = s
		default:
			return BadRequest(fmt.Sprintf("tool_choice must be none, auto, required or a function, got %q", Cut(s)), "tool_choice")
		}
	} else {
		var tc struct {
			Type     string `json:"type"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if raw[0] != '{' || json.Unmarshal(raw, &tc) != nil || tc.Type != "function" || tc.Function.Name == "" {
			return BadRequest(`tool_choice must be a string or {"type": "function", "function": {"name": ...}}`, "tool_choice")
		}
		r.ToolChoice = ToolChoice{Mode: ToolChoiceFunction, Name: tc.Function.Name}
	}
	if r.ToolChoice.Mode == ToolChoiceRequired || r.ToolChoice.Mode == ToolChoiceFunction {
		if len(r.Tools) == 0 {
			return BadRequest("tool_choice "+r.ToolChoice.Mode+" needs tools", "tool_choice")
		}
		if r.ToolChoice.Mode == ToolChoiceFunction && !toolNamed(r.Tools, r.ToolChoice.Name) {
			return BadRequest(fmt.Sprintf("tool_choice names function %q, which is not in tools", Cut(r.ToolChoice.Name)), "tool_choice")
		}
	}
	return nil
}

// maxToolName is the longest function name OpenAI accepts.
const maxToolName = 64

// ValidToolName reports whether name is a function name OpenAI accepts,
// ^[a-zA-Z0-9_-]{1,64}$: names go into chat templates and tool-call
// grammars as they are, where anything else could end a string or a turn.
func ValidToolName(name string) bool {
	if len(name) == 0 || len(name) > maxToolName {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func toolNamed(ts []Tool, name string) bool {
	for _, t := range ts {
		if t.Name == name {
			return true
		}
	}
	return false
}

func parseTool(raw json.RawMessage, at string) (Tool, *Error) {
	var t Tool
	var tf struct {
		Type     string `json:"type"`
		Function *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &tf) != nil {
		return t, BadRequest(at+" must be a tool object", at)
	}
	if tf.Type != "function" || tf.Function == nil {
		return t, BadRequest(at+`: only tools of type "function" are supported`, at+".type")
	}
	if tf.Function.Name == "" {
		return t, BadRequest(at+".function.name is required", at+".function.name")
	}
	if !ValidToolName(tf.Function.Name) {
		return t, BadRequest(fmt.Sprintf("%s.function.name %q must be 1 to %d letters, digits, underscores or dashes", at, Cut(tf.Function.Name), maxToolName),
			at+".function.name")
	}
	t.Name, t.Description = tf.Function.Name, tf.Function.Description
	if p, ok := present(tf.Function.Parameters); ok {
		if p[0] != '{' {
			return t, BadRequest(at+".function.parameters must be a JSON Schema object", at+".function.parameters")
		}
		t.Parameters = p
	}
	t.JSON = raw
	return t, nil
}

// parseToolCalls reads an assistant message's tool_calls, at most max.
func parseToolCalls(raw json.RawMessage, at string, max int) ([]ToolCall, *Error) {
	var calls []ToolCall
	n := 0
	if !eachElement(raw, func(int, json.RawMessage) bool { n++; return n <= max }) {
		return nil, BadRequest(at+" must be an array of tool calls", at)
	}
	if n > max {
		return nil, BadRequest(fmt.Sprintf("%s has more than %d calls", at, max), at)
	}
	if json.Unmarshal(raw, &calls) != nil {
		return nil, BadRequest(at+" must be an array of tool calls", at)
	}
	for i, c := range calls {
		if c.Function.Name == "" {
			return nil, BadRequest(fmt.Sprintf("%s[%d].function.name is required", at, i), fmt.Sprintf("%s[%d].function.name", at, i))
		}
	}
	if len(calls) == 0 {
		return nil, nil
	}
	return calls, nil
}
