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

func toolCallsValue(calls []ToolCall) []any {
	out := make([]any, len(calls))
	for i, c := range calls {
		var args any = c.Arguments
		if v, err := DecodeJSON([]byte(c.Arguments)); err == nil {
			if _, ok := v.(exec.Dict); ok {
				args = v
			}
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
