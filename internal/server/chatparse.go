package server

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/grammar"
	"github.com/batonlm/baton/internal/reasoning"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer/chat"
	"github.com/batonlm/baton/internal/toolcall"
)

// chatPlan is what a chat request asks of the text beyond sampling: the
// template variables, whether to read tool calls and reasoning out of the
// answer, and the grammar that forces calls.
type chatPlan struct {
	vars      map[string]any
	toolCalls bool // read tool calls (tool_choice other than none)
	single    bool // parallel_tool_calls false: one call at most
	// forced is how calls a tool_choice grammar forced are read without
	// a parser: forcedNamed (the answer is the named function's
	// arguments) or forcedList (a JSON list of calls); "" with a parser.
	forced    string
	named     string // the function tool_choice names
	reasoning bool   // read a reasoning block
	thinking  bool   // the reasoning parser's block is on (enable_thinking)
	echo      string
}

// Ways of reading forced calls without a parser (chatPlan.forced).
const (
	forcedNamed = "named"
	forcedList  = "list"
)

// planChat checks a chat request's tools against the server's parsers and
// sets the tool-call constraint of required and named choices.
func (s *Server) planChat(req *openai.ChatRequest) (chatPlan, *openai.Error) {
	var p chatPlan
	var e *openai.Error
	if p.vars, e = templateVars(req); e != nil {
		return p, e
	}
	mode := req.ToolChoice.Mode
	forced := mode == openai.ToolChoiceRequired || mode == openai.ToolChoiceFunction
	if len(req.Tools) > 0 && mode != openai.ToolChoiceNone {
		// Only auto has to find calls in free text; a forced choice's
		// grammar writes them in a form read without a parser.
		if s.o.ToolCallParser == "" && !forced {
			return p, openai.BadRequest("tool_choice auto needs a tool-call parser; this server was started without --tool-call-parser (a named or required tool_choice needs none)", "tool_choice")
		}
		p.toolCalls, p.single = true, req.SingleToolCall
	}
	if forced {
		if req.Sampling.Constraint.Kind != "" {
			return p, openai.BadRequest("tool_choice "+mode+" cannot be combined with response_format, regex or ebnf", "tool_choice")
		}
		if s.o.ToolCallParser == "" {
			return p, forceJSON(req, &p)
		}
		spec := grammar.ToolCallSpec{Format: s.o.ToolCallParser, Parallel: mode == openai.ToolChoiceRequired && !req.SingleToolCall}
		for _, t := range req.Tools {
			if mode == openai.ToolChoiceFunction && t.Name != req.ToolChoice.Name {
				continue
			}
			spec.Tools = append(spec.Tools, grammar.ToolSpec{Name: t.Name, Parameters: t.Parameters})
		}
		b, err := json.Marshal(spec)
		if err != nil {
			return p, openai.Internal(err.Error())
		}
		req.Sampling.Constraint = openai.Constraint{Kind: grammar.KindToolCalls, Spec: string(b)}
	}
	if s.o.ReasoningParser != "" {
		p.reasoning, p.thinking = true, true
		if v, ok := req.TemplateKwargs["enable_thinking"].(bool); ok && !v && s.o.ReasoningParser == "qwen3" {
			p.thinking = false
		}
	}
	if req.Echo {
		if last := req.Messages[len(req.Messages)-1]; last.Role == openai.RoleAssistant {
			p.echo = last.Content
		}
	}
	return p, nil
}

// forceJSON constrains a forced tool choice on a server without a parser
// as vLLM does: a named function's output is its arguments, following
// its parameters' schema; required's is a JSON list of calls, each
// {"name", "parameters"}, one at most when parallel_tool_calls is false.
func forceJSON(req *openai.ChatRequest, p *chatPlan) *openai.Error {
	params := func(t openai.Tool) json.RawMessage {
		if len(t.Parameters) == 0 || string(t.Parameters) == "null" {
			return json.RawMessage(`{"type":"object"}`)
		}
		return t.Parameters
	}
	var schema any
	if req.ToolChoice.Mode == openai.ToolChoiceFunction {
		p.forced, p.named = forcedNamed, req.ToolChoice.Name
		for _, t := range req.Tools {
			if t.Name == req.ToolChoice.Name {
				schema = params(t)
			}
		}
	} else {
		p.forced = forcedList
		calls := make([]any, len(req.Tools))
		// Each tool's parameters keep their own root: they sit under the
		// list's $defs, and their local $refs are rebased there, so that a
		// "#/$defs/X" of a tool's schema still finds that tool's X.
		defs := map[string]any{}
		for i, t := range req.Tools {
			var schema any
			if err := json.Unmarshal(params(t), &schema); err != nil {
				return openai.BadRequest(fmt.Sprintf("tools[%d].function.parameters is not valid JSON", i), fmt.Sprintf("tools[%d].function.parameters", i))
			}
			root := fmt.Sprintf("#/$defs/tool%d", i)
			defs[fmt.Sprintf("tool%d", i)] = rebaseRefs(schema, root)
			calls[i] = map[string]any{
				"type":                 "object",
				"properties":           map[string]any{"name": map[string]any{"const": t.Name}, "parameters": map[string]any{"$ref": root}},
				"required":             []string{"name", "parameters"},
				"additionalProperties": false,
			}
		}
		list := map[string]any{"type": "array", "minItems": 1, "items": map[string]any{"anyOf": calls}, "$defs": defs}
		if req.SingleToolCall {
			list["maxItems"] = 1
		}
		schema = list
	}
	b, err := json.Marshal(schema)
	if err != nil {
		return openai.Internal(err.Error())
	}
	req.Sampling.Constraint = openai.Constraint{Kind: grammar.KindJSONSchema, Spec: string(b)}
	return nil
}

// templateVars are the chat template's variables beyond the conversation:
// chat_template_kwargs and the tools.
func templateVars(req *openai.ChatRequest) (map[string]any, *openai.Error) {
	vars := map[string]any{}
	for k, v := range req.TemplateKwargs {
		vars[k] = v
	}
	if len(req.Tools) > 0 {
		tools := make([]any, len(req.Tools))
		for i, t := range req.Tools {
			v, err := chat.DecodeJSON(t.JSON)
			if err != nil {
				return nil, openai.BadRequest(fmt.Sprintf("tools[%d] is not valid JSON", i), fmt.Sprintf("tools[%d]", i))
			}
			tools[i] = v
		}
		vars["tools"] = tools
	}
	return vars, nil
}

// chatText is one choice's answer read apart: content, reasoning and
// tool calls, as they stream and as a whole.
type chatText struct {
	reason  *reasoning.Parser
	tools   *toolcall.Parser
	single  bool
	content strings.Builder
	thought strings.Builder
	calls   []openai.ToolCall
}

func newChatText(s *Server, p chatPlan) *chatText {
	t := &chatText{single: p.single}
	if p.reasoning {
		t.reason, _ = reasoning.New(s.o.ReasoningParser, p.thinking)
	}
	switch {
	case !p.toolCalls:
	case p.forced == forcedNamed:
		t.tools = toolcall.Named(p.named)
	case p.forced == forcedList:
		t.tools = toolcall.List()
	default:
		t.tools, _ = toolcall.New(s.o.ToolCallParser)
	}
	return t
}

// chatPiece is what one step adds to a choice's message.
type chatPiece struct {
	content, reasoning string
	calls              []openai.ToolCallDelta
}

func (p chatPiece) empty() bool { return p.content == "" && p.reasoning == "" && len(p.calls) == 0 }

// push reads text released by the stop-string filter; final ends it.
func (t *chatText) push(text string, final bool) chatPiece {
	var out chatPiece
	content := text
	if t.reason != nil {
		var r string
		r, content = t.reason.Push(text)
		if final {
			r2, c2 := t.reason.Finish()
			r, content = r+r2, content+c2
		}
		out.reasoning = r
	}
	if t.tools == nil {
		out.content = content
	} else {
		d := t.tools.Push(content)
		if final {
			d2 := t.tools.Finish()
			d.Content += d2.Content
			d.Calls = append(d.Calls, d2.Calls...)
		}
		out.content = d.Content
		for _, c := range d.Calls {
			if t.single && c.Index > 0 {
				continue // parallel_tool_calls false: the first call is the answer
			}
			cd := openai.ToolCallDelta{Index: c.Index, ID: c.ID, Function: openai.ToolCallFunctionDelta{Name: c.Name, Arguments: c.Arguments}}
			if c.ID != "" {
				cd.Type = "function"
				t.calls = append(t.calls, openai.ToolCall{ID: c.ID, Type: "function", Function: openai.ToolCallFunction{Name: c.Name}})
			}
			t.calls[c.Index].Function.Arguments += c.Arguments
			// Consecutive deltas of one call go out as one.
			if n := len(out.calls); n > 0 && out.calls[n-1].Index == c.Index {
				out.calls[n-1].Function.Arguments += c.Arguments
				continue
			}
			out.calls = append(out.calls, cd)
		}
	}
	t.content.WriteString(out.content)
	t.thought.WriteString(out.reasoning)
	return out
}

// message is the whole answer: content null when the answer is only
// calls, reasoning present when a reasoning parser is on and found some.
func (t *chatText) message(echo string) openai.ChatMessage {
	m := openai.ChatMessage{Role: "assistant", ToolCalls: t.calls}
	content := echo + t.content.String()
	if len(t.calls) == 0 || strings.TrimSpace(content) != "" {
		m.Content = &content
	}
	if t.reason != nil && t.thought.Len() > 0 {
		r := t.thought.String()
		m.ReasoningContent = &r
	}
	return m
}

// constraintParam names the request field a constraint came from, for
// the 400 of one that does not compile.
func constraintParam(c scheduler.Constraint) string {
	if c.Kind == grammar.KindToolCalls {
		return "tools"
	}
	return "response_format"
}

// rebaseRefs rewrites the local $refs of schema (a decoded JSON Schema)
// to resolve from root, a JSON pointer where the schema now sits.
func rebaseRefs(schema any, root string) any {
	switch v := schema.(type) {
	case map[string]any:
		for k, x := range v {
			if ref, ok := x.(string); ok && k == "$ref" && strings.HasPrefix(ref, "#") {
				v[k] = root + ref[1:]
				continue
			}
			v[k] = rebaseRefs(x, root)
		}
	case []any:
		for i, x := range v {
			v[i] = rebaseRefs(x, root)
		}
	}
	return schema
}
