package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// jval is a parsed JSON value that keeps object keys in document order:
// properties are generated in the order the schema lists them, which
// encoding/json's maps would lose.
type jval struct {
	kind byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' bool, 'z' null
	keys []string
	vals []*jval // object values, or array items
	str  string  // string value, or number text
	b    bool
}

func parseJSON(s string) (*jval, error) {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	v, err := readJSON(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, fmt.Errorf("grammar: trailing data after JSON value")
	}
	return v, nil
}

// maxJSONDepth bounds nesting so hostile input cannot exhaust the stack.
const maxJSONDepth = 200

func readJSON(d *json.Decoder, depth int) (*jval, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("grammar: JSON nested too deeply")
	}
	t, err := d.Token()
	if err != nil {
		return nil, fmt.Errorf("grammar: bad JSON: %w", err)
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			v := &jval{kind: 'o'}
			for d.More() {
				k, err := d.Token()
				if err != nil {
					return nil, fmt.Errorf("grammar: bad JSON: %w", err)
				}
				ks, ok := k.(string)
				if !ok {
					return nil, fmt.Errorf("grammar: bad JSON object key")
				}
				x, err := readJSON(d, depth+1)
				if err != nil {
					return nil, err
				}
				v.keys = append(v.keys, ks)
				v.vals = append(v.vals, x)
			}
			if _, err := d.Token(); err != nil {
				return nil, fmt.Errorf("grammar: bad JSON: %w", err)
			}
			return v, nil
		case '[':
			v := &jval{kind: 'a'}
			for d.More() {
				x, err := readJSON(d, depth+1)
				if err != nil {
					return nil, err
				}
				v.vals = append(v.vals, x)
			}
			if _, err := d.Token(); err != nil {
				return nil, fmt.Errorf("grammar: bad JSON: %w", err)
			}
			return v, nil
		}
		return nil, fmt.Errorf("grammar: bad JSON delimiter %v", t)
	case string:
		return &jval{kind: 's', str: t}, nil
	case json.Number:
		return &jval{kind: 'n', str: string(t)}, nil
	case bool:
		return &jval{kind: 'b', b: t}, nil
	case nil:
		return &jval{kind: 'z'}, nil
	}
	return nil, fmt.Errorf("grammar: bad JSON token %v", t)
}

// get returns the value of key in an object, or nil.
func (v *jval) get(key string) *jval {
	if v == nil || v.kind != 'o' {
		return nil
	}
	for i, k := range v.keys {
		if k == key {
			return v.vals[i]
		}
	}
	return nil
}

// encode writes v as compact JSON, the form generated for enum and const.
func (v *jval) encode(sb *strings.Builder) {
	switch v.kind {
	case 'o':
		sb.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(jsonString(k))
			sb.WriteByte(':')
			v.vals[i].encode(sb)
		}
		sb.WriteByte('}')
	case 'a':
		sb.WriteByte('[')
		for i, x := range v.vals {
			if i > 0 {
				sb.WriteByte(',')
			}
			x.encode(sb)
		}
		sb.WriteByte(']')
	case 's':
		sb.WriteString(jsonString(v.str))
	case 'n':
		sb.WriteString(v.str)
	case 'b':
		if v.b {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	default:
		sb.WriteString("null")
	}
}

// jsonString quotes s as JSON without escaping HTML characters, which a
// model would write plainly.
func jsonString(s string) string {
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	_ = e.Encode(s)
	return strings.TrimSuffix(buf.String(), "\n")
}
