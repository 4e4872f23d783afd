package openai

import (
	"encoding/json"
	"fmt"
	"strings"
)

// ResponsesRequest is a validated POST /v1/responses body. It is served as
// the chat request it amounts to: instructions become a system message,
// the input items messages (function calls an assistant turn's tool_calls,
// their outputs tool turns), function tools chat tools and text.format
// response_format.
type ResponsesRequest struct {
	Chat   *ChatRequest
	Stream bool
	// Echo are the request fields a response object repeats back.
	Echo ResponsesEcho
}

// ResponsesEcho are the request's settings as the response reports them.
type ResponsesEcho struct {
	Instructions      *string         `json:"instructions"`
	MaxOutputTokens   *int            `json:"max_output_tokens"`
	Temperature       float64         `json:"temperature"`
	TopP              float64         `json:"top_p"`
	ParallelToolCalls bool            `json:"parallel_tool_calls"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	Tools             json.RawMessage `json:"tools"`
	Text              json.RawMessage `json:"text"`
	Metadata          json.RawMessage `json:"metadata"`
}

// ParseResponsesRequest decodes and validates a /v1/responses body.
func ParseResponsesRequest(body []byte) (*ResponsesRequest, *Error) {
	return ParseResponsesRequestLimited(body, Limits{})
}

// ParseResponsesRequestLimited is ParseResponsesRequest within a
// server's limits (see ParseChatRequestLimited).
func ParseResponsesRequestLimited(body []byte, lim Limits) (*ResponsesRequest, *Error) {
	f, e := decodeObject(body, lim)
	if e != nil {
		return nil, e
	}
	if _, ok := f.get("previous_response_id"); ok {
		return nil, BadRequest("previous_response_id is not supported: responses are not stored; send the conversation as input", "previous_response_id")
	}
	if _, ok := f.get("conversation"); ok {
		return nil, BadRequest("conversation is not supported: responses are not stored; send the conversation as input", "conversation")
	}
	r := &ResponsesRequest{}
	var e2 *Error
	if r.Stream, _, e2 = f.bool("stream"); e2 != nil {
		return nil, e2
	}
	chat := fields{}
	for _, k := range []string{"model", "temperature", "top_p", "parallel_tool_calls", "metadata", "top_logprobs", "seed", "stop"} {
		if v, ok := f[k]; ok {
			chat[k] = v
		}
	}
	if v, ok := f.get("max_output_tokens"); ok {
		chat["max_completion_tokens"] = v
	}
	var msgs []map[string]any
	instr, ok, e2 := f.string("instructions")
	if e2 != nil {
		return nil, e2
	}
	if ok {
		r.Echo.Instructions = &instr
		msgs = append(msgs, map[string]any{"role": RoleSystem, "content": instr})
	}
	in, e2 := f.input(lim.promptTokens())
	if e2 != nil {
		return nil, e2
	}
	msgs = append(msgs, in...)
	chat["messages"], _ = json.Marshal(msgs)
	if raw, ok := f.get("tools"); ok {
		var list []fields
		if !eachElement(raw, func(_ int, el json.RawMessage) bool {
			t, ok := objectFields(el)
			list = append(list, t)
			return ok && len(list) <= maxTools
		}) || (len(list) > 0 && list[len(list)-1] == nil) {
			return nil, BadRequest("tools must be an array of tool objects", "tools")
		}
		if len(list) > maxTools {
			return nil, BadRequest(fmt.Sprintf("tools may list at most %d functions", maxTools), "tools")
		}
		out := make([]map[string]any, len(list))
		echo := make([]fields, len(list))
		for i, t := range list {
			if typ, _ := parseString(t["type"]); typ != "function" {
				return nil, BadRequest(fmt.Sprintf(`tools[%d]: only tools of type "function" are supported`, i), fmt.Sprintf("tools[%d].type", i))
			}
			fn := map[string]json.RawMessage{}
			for _, k := range []string{"name", "description", "parameters"} {
				if v, ok := t[k]; ok {
					fn[k] = v
				}
			}
			out[i] = map[string]any{"type": "function", "function": fn}
			echo[i] = echoTool(t)
		}
		chat["tools"], _ = json.Marshal(out)
		r.Echo.Tools, _ = json.Marshal(echo)
	}
	if raw, ok := f.get("tool_choice"); ok {
		r.Echo.ToolChoice = raw
		if raw[0] == '{' {
			var tc struct {
				Type string `json:"type"`
				Name string `json:"name"`
			}
			if json.Unmarshal(raw, &tc) != nil || tc.Type != "function" || tc.Name == "" {
				return nil, BadRequest(`tool_choice must be none, auto, required or {"type": "function", "name": ...}`, "tool_choice")
			}
			chat["tool_choice"], _ = json.Marshal(map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}})
		} else {
			chat["tool_choice"] = raw
		}
	}
	if raw, ok := f.get("text"); ok {
		r.Echo.Text = raw
		var text struct {
			Format map[string]json.RawMessage `json:"format"`
		}
		if raw[0] != '{' || json.Unmarshal(raw, &text) != nil {
			return nil, BadRequest("text must be an object", "text")
		}
		if text.Format != nil {
			typ, _ := parseString(text.Format["type"])
			switch typ {
			case "text", "json_object":
				chat["response_format"], _ = json.Marshal(map[string]string{"type": typ})
			case "json_schema":
				chat["response_format"], _ = json.Marshal(map[string]any{"type": "json_schema", "json_schema": text.Format})
			default:
				return nil, BadRequest(fmt.Sprintf("text.format type %q is not supported (text, json_object, json_schema)", Cut(typ)), "text.format.type")
			}
		}
	}
	b, _ := json.Marshal(chat)
	cr, e2 := ParseChatRequestLimited(b, lim)
	if e2 != nil {
		if e2.Param != nil {
			p := *e2.Param
			switch {
			case strings.HasPrefix(p, "max_completion_tokens"):
				p = "max_output_tokens"
			case strings.HasPrefix(p, "messages"), strings.HasPrefix(p, "response_format"):
				p = "input"
				if strings.HasPrefix(*e2.Param, "response_format") {
					p = "text.format"
				}
			}
			e2.Param = &p
		}
		return nil, e2
	}
	if cr.Sampling.N != 1 {
		return nil, BadRequest("n is not a field of the Responses API", "n")
	}
	r.Chat = cr
	r.Echo.Temperature, r.Echo.TopP = cr.Sampling.Temperature, cr.Sampling.TopP
	r.Echo.ParallelToolCalls = !cr.SingleToolCall
	if cr.Sampling.MaxTokens > 0 {
		n := cr.Sampling.MaxTokens
		r.Echo.MaxOutputTokens = &n
	}
	if raw, ok := f.get("metadata"); ok {
		r.Echo.Metadata = raw
	}
	return r, nil
}

// input reads the Responses input: a string (one user message) or an
// array of items: messages (content a string or input_text/output_text
// parts), function_call and function_call_output; reasoning items are
// skipped, as the chat template rebuilds what it needs from messages.
// Each item takes at least a token, so more than max are refused unread.
func (f fields) input(max int) ([]map[string]any, *Error) {
	raw, ok := f.get("input")
	if !ok {
		return nil, BadRequest("you must provide an input parameter", "input")
	}
	if s, ok := parseString(raw); ok {
		return []map[string]any{{"role": RoleUser, "content": s}}, nil
	}
	var items []json.RawMessage
	if !eachElement(raw, func(_ int, el json.RawMessage) bool {
		items = append(items, el)
		return len(items) <= max
	}) || len(items) == 0 {
		return nil, BadRequest("input must be a string or a non-empty array of input items", "input")
	}
	if len(items) > max {
		return nil, PromptTooLong(fmt.Sprintf("this model's maximum context length is %d tokens; the input has more than %d items", max+1, max), "input")
	}
	var out []map[string]any
	for i, el := range items {
		at := fmt.Sprintf("input[%d]", i)
		it, ok := objectFields(el)
		if !ok {
			return nil, BadRequest(at+" must be an object", at)
		}
		typ, _ := parseString(it["type"])
		switch typ {
		case "function_call":
			name, _ := parseString(it["name"])
			callID, _ := parseString(it["call_id"])
			args, _ := parseString(it["arguments"])
			if name == "" || callID == "" {
				return nil, BadRequest(at+": a function_call needs name and call_id", at)
			}
			call := map[string]any{"id": callID, "type": "function", "function": map[string]string{"name": name, "arguments": args}}
			// Calls in a row are one assistant turn.
			if n := len(out); n > 0 && out[n-1]["role"] == RoleAssistant && out[n-1]["tool_calls"] != nil {
				out[n-1]["tool_calls"] = append(out[n-1]["tool_calls"].([]any), call)
				continue
			}
			out = append(out, map[string]any{"role": RoleAssistant, "content": nil, "tool_calls": []any{call}})
		case "function_call_output":
			callID, _ := parseString(it["call_id"])
			output, ok := parseString(it["output"])
			if !ok {
				return nil, BadRequest(at+".output must be a string", at+".output")
			}
			out = append(out, map[string]any{"role": RoleTool, "tool_call_id": callID, "content": output})
		case "reasoning":
		case "", "message":
			role, _ := parseString(it["role"])
			var content any
			if s, ok := parseString(it["content"]); ok {
				content = s
			} else {
				var parts []fields
				raw, ok := it.get("content")
				if !ok || !eachElement(raw, func(_ int, el json.RawMessage) bool {
					p, ok := objectFields(el)
					parts = append(parts, p)
					return ok && len(parts) <= max
				}) || (len(parts) > 0 && parts[len(parts)-1] == nil) || len(parts) > max {
					return nil, BadRequest(at+".content must be a string or an array of at most "+fmt.Sprint(max)+" content parts", at+".content")
				}
				var sb strings.Builder
				for j, p := range parts {
					pt, _ := parseString(p["type"])
					text, ok := parseString(p["text"])
					if (pt != "input_text" && pt != "output_text" && pt != "text") || !ok {
						return nil, BadRequest(fmt.Sprintf("%s.content[%d]: only text parts are supported, got %q", at, j, Cut(pt)), fmt.Sprintf("%s.content[%d].type", at, j))
					}
					sb.WriteString(text)
				}
				content = sb.String()
			}
			out = append(out, map[string]any{"role": role, "content": content})
		default:
			return nil, BadRequest(fmt.Sprintf("%s: input items of type %q are not supported", at, Cut(typ)), at+".type")
		}
	}
	return out, nil
}

// Response is a Responses API response object.
type Response struct {
	ID                string            `json:"id"`
	Object            string            `json:"object"`
	CreatedAt         int64             `json:"created_at"`
	Status            string            `json:"status"` // in_progress, completed, incomplete, failed
	Error             *Error            `json:"error"`
	IncompleteDetails *IncompleteReason `json:"incomplete_details"`
	Model             string            `json:"model"`
	Output            []OutputItem      `json:"output"`
	Usage             *ResponseUsage    `json:"usage"`
	ResponsesEcho
}

// MarshalJSON fills in Object and sends output as [] rather than null.
func (r Response) MarshalJSON() ([]byte, error) {
	type plain Response
	r.Object = orDefault(r.Object, "response")
	r.Output = nonNil(r.Output)
	if r.Tools == nil {
		r.Tools = json.RawMessage("[]")
	}
	if r.ToolChoice == nil {
		r.ToolChoice = json.RawMessage(`"auto"`)
	}
	if r.Text == nil {
		r.Text = json.RawMessage(`{"format":{"type":"text"}}`)
	}
	if r.Metadata == nil {
		r.Metadata = json.RawMessage("{}")
	}
	return json.Marshal(plain(r))
}

// IncompleteReason says why a response stopped early.
type IncompleteReason struct {
	Reason string `json:"reason"`
}

// ResponseUsage is a response's token accounting.
type ResponseUsage struct {
	InputTokens         int            `json:"input_tokens"`
	InputTokensDetails  map[string]int `json:"input_tokens_details"`
	OutputTokens        int            `json:"output_tokens"`
	OutputTokensDetails map[string]int `json:"output_tokens_details"`
	TotalTokens         int            `json:"total_tokens"`
}

// NewResponseUsage fills in the totals and the detail objects clients
// read; reasoning is the part of out spent in the reasoning block.
func NewResponseUsage(in, out, reasoning int) *ResponseUsage {
	return &ResponseUsage{InputTokens: in, OutputTokens: out, TotalTokens: in + out,
		InputTokensDetails: map[string]int{"cached_tokens": 0}, OutputTokensDetails: map[string]int{"reasoning_tokens": reasoning}}
}

// OutputItem is one item of a response's output: a message, a function
// call or reasoning.
type OutputItem struct {
	Type   string `json:"type"`
	ID     string `json:"id"`
	Status string `json:"status,omitempty"`
	// message
	Role    string        `json:"role,omitempty"`
	Content []ContentPart `json:"content,omitempty"`
	// function_call
	CallID    string  `json:"call_id,omitempty"`
	Name      string  `json:"name,omitempty"`
	Arguments *string `json:"arguments,omitempty"`
	// reasoning
	Summary []ContentPart `json:"summary,omitempty"`
}

// MarshalJSON sends the fields each item type has: a message's content
// and a reasoning item's summary as arrays even when empty.
func (o OutputItem) MarshalJSON() ([]byte, error) {
	type plain OutputItem
	m := map[string]any{}
	b, err := json.Marshal(plain(o))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	switch o.Type {
	case "message":
		if o.Content == nil {
			m["content"] = []ContentPart{}
		}
	case "reasoning":
		if o.Summary == nil {
			m["summary"] = []ContentPart{}
		}
	}
	return json.Marshal(m)
}

// ContentPart is a part of a message (output_text) or of reasoning
// (reasoning_text).
type ContentPart struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations,omitempty"`
}

// MarshalJSON sends an output_text part's annotations and logprobs as []
// when it has none: clients index them and OpenAI's schema requires both
// (baton returns no per-token logprobs on Responses).
func (c ContentPart) MarshalJSON() ([]byte, error) {
	type plain ContentPart
	if c.Type == "output_text" {
		return json.Marshal(struct {
			plain
			Annotations []any `json:"annotations"`
			Logprobs    []any `json:"logprobs"`
		}{plain(c), nonNil(c.Annotations), []any{}})
	}
	return json.Marshal(plain(c))
}

// echoTool is a function tool as the response repeats it: as sent, with
// the fields OpenAI's schema requires of it (parameters, strict) filled in
// with the defaults they had when the client left them out.
func echoTool(t fields) fields {
	e := make(fields, len(t)+2)
	for k, v := range t {
		e[k] = v
	}
	if _, ok := t.get("parameters"); !ok {
		e["parameters"] = json.RawMessage("null")
	}
	if _, ok := t.get("strict"); !ok {
		e["strict"] = json.RawMessage("true")
	}
	return e
}
