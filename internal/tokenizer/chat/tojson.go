package chat

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nikolalohinski/gonja/v2/exec"
)

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), keyword arguments
// accepted. Templates put its output into prompts, so the exact spacing
// matters; gonja's own tojson uses Go's compact, HTML-escaped form.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	enc := jsonEncoder{itemSep: ", ", keySep: ": "}
	if v, ok := params.KwArgs["ensure_ascii"]; ok {
		enc.ensureASCII = v.IsTrue()
	}
	if v, ok := params.KwArgs["sort_keys"]; ok {
		enc.sortKeys = v.IsTrue()
	}
	if v, ok := params.KwArgs["indent"]; ok && !v.IsNil() {
		switch {
		case v.IsInteger():
			enc.indent = strings.Repeat(" ", max(v.Integer(), 0))
		case v.IsString():
			enc.indent = v.String()
		default:
			return exec.AsValue(fmt.Errorf("tojson: indent must be an integer or a string, not %s", v.String()))
		}
		enc.indented = true
		enc.itemSep = ","
	}
	if v, ok := params.KwArgs["separators"]; ok && !v.IsNil() {
		if !v.IsList() || v.Len() != 2 {
			return exec.AsValue(fmt.Errorf("tojson: separators must be a pair of strings"))
		}
		enc.itemSep = v.Index(0).String()
		enc.keySep = v.Index(1).String()
	}
	if err := enc.encode(in.Interface(), 0); err != nil {
		return exec.AsValue(fmt.Errorf("tojson: %w", err))
	}
	return exec.AsSafeValue(enc.sb.String())
}

type jsonEncoder struct {
	sb              strings.Builder
	ensureASCII     bool
	sortKeys        bool
	indented        bool
	indent          string
	itemSep, keySep string
}

// newline starts a new line at the given nesting depth when indenting.
func (e *jsonEncoder) newline(depth int) {
	if e.indented {
		e.sb.WriteByte('\n')
		for range depth {
			e.sb.WriteString(e.indent)
		}
	}
}

func (e *jsonEncoder) encode(v any, depth int) error {
	if depth > 100 {
		return fmt.Errorf("value nested too deeply")
	}
	switch x := v.(type) {
	case nil:
		e.sb.WriteString("null")
		return nil
	case *exec.Value:
		if x == nil {
			e.sb.WriteString("null")
			return nil
		}
		return e.encode(x.Interface(), depth)
	case exec.Dict:
		return e.encodeDict(x.Pairs, depth)
	case *exec.Dict:
		if x == nil {
			e.sb.WriteString("null")
			return nil
		}
		return e.encodeDict(x.Pairs, depth)
	case message:
		keys := orderedKeys(x)
		vals := make([]any, len(keys))
		for i, k := range keys {
			vals[i] = x[k]
		}
		return e.encodeObject(keys, vals, depth)
	case string:
		e.encodeString(x)
		return nil
	case bool:
		if x {
			e.sb.WriteString("true")
		} else {
			e.sb.WriteString("false")
		}
		return nil
	case error:
		return x
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		e.sb.WriteString(strconv.FormatInt(rv.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		e.sb.WriteString(strconv.FormatUint(rv.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		e.sb.WriteString(pyFloat(rv.Float()))
	case reflect.String:
		e.encodeString(rv.String())
	case reflect.Bool:
		return e.encode(rv.Bool(), depth)
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			e.sb.WriteString("null")
			return nil
		}
		return e.encode(rv.Elem().Interface(), depth)
	case reflect.Slice, reflect.Array:
		if rv.Kind() == reflect.Slice && rv.IsNil() {
			e.sb.WriteString("[]")
			return nil
		}
		if rv.Len() == 0 {
			e.sb.WriteString("[]")
			return nil
		}
		e.sb.WriteByte('[')
		for i := range rv.Len() {
			if i > 0 {
				e.sb.WriteString(e.itemSep)
			}
			e.newline(depth + 1)
			if err := e.encode(rv.Index(i).Interface(), depth+1); err != nil {
				return err
			}
		}
		e.newline(depth)
		e.sb.WriteByte(']')
	case reflect.Map:
		// Go maps have no order; sorting at least makes the prompt stable.
		keys := make([]string, 0, rv.Len())
		vals := map[string]any{}
		iter := rv.MapRange()
		for iter.Next() {
			k := exec.ToValue(iter.Key()).String()
			keys = append(keys, k)
			vals[k] = iter.Value().Interface()
		}
		slices.Sort(keys)
		ordered := make([]any, len(keys))
		for i, k := range keys {
			ordered[i] = vals[k]
		}
		return e.encodeObject(keys, ordered, depth)
	default:
		return fmt.Errorf("object of type %s is not JSON serializable", rv.Type())
	}
	return nil
}

func (e *jsonEncoder) encodeDict(pairs []*exec.Pair, depth int) error {
	keys := make([]string, len(pairs))
	vals := make([]any, len(pairs))
	for i, p := range pairs {
		keys[i] = p.Key.String()
		vals[i] = p.Value
	}
	return e.encodeObject(keys, vals, depth)
}

func (e *jsonEncoder) encodeObject(keys []string, vals []any, depth int) error {
	if len(keys) == 0 {
		e.sb.WriteString("{}")
		return nil
	}
	idx := make([]int, len(keys))
	for i := range idx {
		idx[i] = i
	}
	if e.sortKeys {
		slices.SortStableFunc(idx, func(a, b int) int { return strings.Compare(keys[a], keys[b]) })
	}
	e.sb.WriteByte('{')
	for n, i := range idx {
		if n > 0 {
			e.sb.WriteString(e.itemSep)
		}
		e.newline(depth + 1)
		e.encodeString(keys[i])
		e.sb.WriteString(e.keySep)
		if err := e.encode(vals[i], depth+1); err != nil {
			return err
		}
	}
	e.newline(depth)
	e.sb.WriteByte('}')
	return nil
}

// escapeMark is the tokenizer's escape mark (tokenizer.EscapeSpecial), a
// noncharacter no client text holds unescaped.
const escapeMark = '\uFDD0'

// encodeString escapes as Python's json module does.
func (e *jsonEncoder) encodeString(s string) {
	sb := &e.sb
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '\b':
			sb.WriteString(`\b`)
		case '\f':
			sb.WriteString(`\f`)
		default:
			switch {
			case r == escapeMark:
				// The tokenizer's mark for a client's control-token text
				// (RenderEscaped) must reach it as it is, not as \ufdd0.
				sb.WriteRune(r)
			case r < 0x20 || (e.ensureASCII && r >= 0x7f):
				if r > 0xFFFF {
					r -= 0x10000
					fmt.Fprintf(sb, `\u%04x\u%04x`, 0xD800+(r>>10), 0xDC00+(r&0x3FF))
				} else {
					fmt.Fprintf(sb, `\u%04x`, r)
				}
			default:
				sb.WriteRune(r)
			}
		}
	}
	sb.WriteByte('"')
}

// pyFloat formats a float as Python's repr does.
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	// Shortest round-trip digits, then Python's choice between fixed
	// and exponent notation: exponent when exp < -4 or exp >= 16.
	s := strconv.FormatFloat(f, 'e', -1, 64)
	mant, expStr, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		return fmt.Sprintf("%se%s%02d", mant, sign, exp)
	}
	out := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(out, ".") {
		out += ".0"
	}
	return out
}

// pyRepr quotes a string as Python's repr does, for printing dicts.
func pyRepr(s string) string {
	quote := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		quote = '"'
	}
	var sb strings.Builder
	sb.WriteByte(quote)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		i += n
		switch {
		case r == rune(quote) || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&sb, `\x%02x`, r)
		default:
			sb.WriteRune(r)
		}
	}
	sb.WriteByte(quote)
	return sb.String()
}

// orderedKeys lists a message's keys: role and content first, the rest
// sorted.
func orderedKeys(m message) []string {
	keys := make([]string, 0, len(m))
	for _, k := range messageKeyOrder {
		if _, ok := m[k]; ok {
			keys = append(keys, k)
		}
	}
	var rest []string
	for k := range m {
		if !slices.Contains(messageKeyOrder, k) {
			rest = append(rest, k)
		}
	}
	slices.Sort(rest)
	return append(keys, rest...)
}
