package grammar

import (
	"encoding/json"
	"fmt"
)

// KindToolCalls is the constraint of a request whose tool_choice is
// "required" or names a function: the output is one or more calls, in a
// tool-call parser's wire format, whose arguments follow the functions'
// parameter schemas. Its spec is a ToolCallSpec as JSON.
const KindToolCalls = "tool_calls"

// ToolCallSpec is what a tool-call constraint needs to know: the format
// (a --tool-call-parser name), the functions that may be called and
// whether more than one call may be made.
type ToolCallSpec struct {
	Format   string     `json:"format"`
	Tools    []ToolSpec `json:"tools"`
	Parallel bool       `json:"parallel,omitempty"`
}

// ToolSpec is one callable function: its name and its parameters' JSON
// Schema (absent: any object).
type ToolSpec struct {
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// ToolCallFormats are the formats FromToolCalls knows, named as SGLang
// names its tool-call parsers.
var ToolCallFormats = []string{"hermes", "qwen25", "llama3", "mistral", "pythonic"}

// FromToolCalls builds the grammar of spec's calls. The wrappers are
// those the matching parser (internal/toolcall) reads:
//
//	hermes, qwen25  <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (calls separated by \n)
//	llama3          {"name": "f", "parameters": {...}}                           (separated by "; ")
//	mistral         [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]
//	pythonic        [f(a=1, b="x"), ...]                                           (values written as JSON)
//
// Each function's arguments are compiled from its own schema, so $ref
// inside one resolves against that schema.
func FromToolCalls(spec string) (*Grammar, error) {
	var ts ToolCallSpec
	if err := json.Unmarshal([]byte(spec), &ts); err != nil {
		return nil, fmt.Errorf("grammar: tool-call spec: %v", err)
	}
	if len(ts.Tools) == 0 {
		return nil, fmt.Errorf("grammar: tool-call spec names no function")
	}
	var defs []namedExpr
	calls := make(alt, 0, len(ts.Tools))
	for i, t := range ts.Tools {
		if t.Name == "" {
			return nil, fmt.Errorf("grammar: a function has no name")
		}
		params := string(t.Parameters)
		if len(t.Parameters) == 0 || string(t.Parameters) == "null" {
			params = `{"type":"object"}`
		}
		v, err := parseJSON(params)
		if err != nil {
			return nil, fmt.Errorf("grammar: function %q parameters: %v", t.Name, err)
		}
		sc := &schemaCompiler{ns: fmt.Sprintf("f%d-", i), root: v, refs: map[string]string{}}
		var call expr
		name := jsonString(t.Name)
		switch ts.Format {
		case "hermes", "qwen25":
			args, err := sc.compile(v, 0)
			if err != nil {
				return nil, fmt.Errorf("function %q: %w", t.Name, err)
			}
			call = seq{lit{"<tool_call>\n{\"name\": " + name + ", \"arguments\": "}, args, lit{"}\n</tool_call>"}}
		case "llama3":
			args, err := sc.compile(v, 0)
			if err != nil {
				return nil, fmt.Errorf("function %q: %w", t.Name, err)
			}
			call = seq{lit{"{\"name\": " + name + ", \"parameters\": "}, args, lit{"}"}}
		case "mistral":
			args, err := sc.compile(v, 0)
			if err != nil {
				return nil, fmt.Errorf("function %q: %w", t.Name, err)
			}
			call = seq{lit{"{\"name\": " + name + ", \"arguments\": "}, args, lit{"}"}}
		case "pythonic":
			if !isIdent(t.Name) {
				return nil, fmt.Errorf("grammar: function name %q is not a Python identifier", t.Name)
			}
			kw, err := sc.kwargs(v)
			if err != nil {
				return nil, fmt.Errorf("function %q: %w", t.Name, err)
			}
			call = seq{lit{t.Name + "("}, kw, lit{")"}}
		default:
			return nil, fmt.Errorf("grammar: unknown tool-call format %q", ts.Format)
		}
		r := sc.rule(fmt.Sprintf("call%d", i), call)
		defs = append(defs, sc.defs...)
		calls = append(calls, r)
	}
	var one expr = calls
	if len(calls) == 1 {
		one = calls[0]
	}
	defs = append(defs, namedExpr{"call", one})
	sep, open, close := lit{""}, lit{""}, lit{""}
	switch ts.Format {
	case "hermes", "qwen25":
		sep = lit{"\n"}
	case "llama3":
		sep = lit{"; "}
	case "mistral":
		sep, open, close = lit{", "}, lit{"[TOOL_CALLS] ["}, lit{"]"}
	case "pythonic":
		sep, open, close = lit{", "}, lit{"["}, lit{"]"}
	}
	var body expr = ref{"call"}
	if ts.Parallel {
		body = seq{ref{"call"}, star(seq{sep, ref{"call"}})}
	}
	defs = append(defs, namedExpr{"root", seq{open, body, close}})
	return build(append(jsonBase(), defs...), "root")
}

// kwargs is the keyword-argument list of a pythonic call: the object
// schema's properties as name=value, in schema order, values written as
// JSON (which the pythonic parser reads along with Python literals).
func (sc *schemaCompiler) kwargs(v *jval) (expr, error) {
	if v.kind != 'o' {
		return nil, fmt.Errorf("grammar: parameters must be an object schema")
	}
	props := v.get("properties")
	if props == nil {
		return empty, nil
	}
	if props.kind != 'o' {
		return nil, fmt.Errorf("grammar: properties must be an object")
	}
	required := map[string]bool{}
	if r := v.get("required"); r != nil && r.kind == 'a' {
		for _, x := range r.vals {
			required[x.str] = true
		}
	}
	var first, rest expr = empty, empty
	for i := len(props.keys) - 1; i >= 0; i-- {
		k := props.keys[i]
		if !isIdent(k) {
			return nil, fmt.Errorf("grammar: parameter %q is not a Python identifier", k)
		}
		e, err := sc.compile(props.vals[i], 1)
		if err != nil {
			return nil, err
		}
		kv := seq{lit{k + "="}, e}
		withComma := seq{lit{", "}, kv, rest}
		withoutComma := seq{kv, rest}
		if required[k] {
			rest, first = sc.rule("kwrest", withComma), sc.rule("kwfirst", withoutComma)
		} else {
			rest, first = sc.rule("kwrest", alt{withComma, rest}), sc.rule("kwfirst", alt{withoutComma, first})
		}
	}
	return first, nil
}

func isIdent(s string) bool {
	for i, c := range s {
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}
