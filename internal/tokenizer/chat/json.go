package chat

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// ToolCall is one call of an assistant turn as the template sees it:
// {"id", "type": "function", "function": {"name", "arguments"}}, with the
// arguments decoded when they are a JSON object, as vLLM hands them to
// templates (most write them with tojson).
type ToolCall struct {
	ID, Name, Arguments string
	// escape, when set, is applied to the arguments' strings once they
	// are decoded (RenderEscaped).
	escape func(string) string
}

// DecodeJSON decodes a JSON text into template values, objects keeping
// their key order (as a Python dict from json.loads would), so that
// tools rendered with tojson read as the client wrote them.
func DecodeJSON(raw []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err == nil {
		return nil, fmt.Errorf("chat: trailing data after JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder, depth int) (any, error) {
	if depth > 100 {
		return nil, fmt.Errorf("chat: JSON nested too deeply")
	}
	t, err := d.Token()
	if err != nil {
		return nil, err
	}
	switch x := t.(type) {
	case json.Delim:
		switch x {
		case '{':
			var dict exec.Dict
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, err
				}
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				dict.Pairs = append(dict.Pairs, &exec.Pair{Key: exec.AsValue(k), Value: exec.AsValue(v)})
			}
			_, err := d.Token()
			return dict, err
		case '[':
			list := []any{}
			for d.More() {
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			_, err := d.Token()
			return list, err
		}
		return nil, fmt.Errorf("chat: unexpected %v", x)
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n, nil
		}
		return x.Float64()
	}
	return t, nil
}

// escapeMessages is messages with escape applied to all their text.
func escapeMessages(msgs []Message, escape func(string) string) []Message {
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		m.Role, m.Content, m.Name, m.ToolCallID = escape(m.Role), escape(m.Content), escape(m.Name), escape(m.ToolCallID)
		if len(m.ToolCalls) > 0 {
			calls := make([]ToolCall, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				calls[j] = ToolCall{ID: escape(c.ID), Name: escape(c.Name), Arguments: c.Arguments, escape: escape}
			}
			m.ToolCalls = calls
		}
		out[i] = m
	}
	return out
}

// escapeValue is v with escape applied to every string in it, names of
// members included; v is built of what DecodeJSON and the request decoder
// make (maps, lists, dicts, template values, scalars), depth bounded as
// theirs is.
func escapeValue(v any, escape func(string) string, depth int) any {
	if depth > maxEscapeDepth {
		return v
	}
	switch x := v.(type) {
	case string:
		return escape(x)
	case *exec.Value:
		if x == nil {
			return x
		}
		return exec.AsValue(escapeValue(x.Interface(), escape, depth+1))
	case exec.Dict:
		pairs := make([]*exec.Pair, len(x.Pairs))
		for i, p := range x.Pairs {
			pairs[i] = &exec.Pair{Key: escapeValue(p.Key, escape, depth+1).(*exec.Value), Value: escapeValue(p.Value, escape, depth+1).(*exec.Value)}
		}
		return exec.Dict{Pairs: pairs}
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[escape(k)] = escapeValue(e, escape, depth+1)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = escapeValue(e, escape, depth+1)
		}
		return out
	}
	return v
}

// maxEscapeDepth is deeper than anything DecodeJSON decodes.
const maxEscapeDepth = 200

func toolCallsValue(calls []ToolCall) []any {
	out := make([]any, len(calls))
	for i, c := range calls {
		var args any = c.Arguments
		if v, err := DecodeJSON([]byte(c.Arguments)); err == nil {
			if _, ok := v.(exec.Dict); ok {
				args = v
			}
		}
		if c.escape != nil {
			args = escapeValue(args, c.escape, 0)
		}
		fn := exec.Dict{Pairs: []*exec.Pair{
			{Key: exec.AsValue("name"), Value: exec.AsValue(c.Name)},
			{Key: exec.AsValue("arguments"), Value: exec.AsValue(args)},
		}}
		out[i] = exec.Dict{Pairs: []*exec.Pair{
			{Key: exec.AsValue("id"), Value: exec.AsValue(c.ID)},
			{Key: exec.AsValue("type"), Value: exec.AsValue("function")},
			{Key: exec.AsValue("function"), Value: exec.AsValue(fn)},
		}}
	}
	return out
}
