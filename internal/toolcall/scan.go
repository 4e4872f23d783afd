package toolcall

import (
	"encoding/json"
	"strings"
)

// scanValue reads one JSON value at the start of s (no leading space). It
// returns how many bytes the value takes and whether it is complete; when
// it is not, every byte of s belongs to it (s is a prefix of a value), or
// bad is set when s cannot begin a JSON value at all.
func scanValue(s string) (n int, complete, bad bool) {
	depth := 0
	inStr, esc := false, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
				if depth == 0 {
					return i + 1, true, false
				}
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 {
				if i == 0 {
					return 0, false, true
				}
				return i, true, false // a number or literal ended
			}
			depth--
			if depth == 0 {
				return i + 1, true, false
			}
		case ' ', '\t', '\n', '\r', ',', ':':
			if depth == 0 {
				if i == 0 {
					return 0, false, true
				}
				return i, true, false // a number or literal ended
			}
		default:
			if depth == 0 && !isScalarByte(c) {
				return i, false, true
			}
		}
	}
	return len(s), false, false
}

func isScalarByte(c byte) bool {
	return c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// objectSnap is what can be read of a (possibly unfinished) JSON object
// holding one call: the function's name once its string is complete, and
// as much of the arguments' raw text as has arrived.
type objectSnap struct {
	name               string
	nameDone           bool
	args               string
	argsSeen, argsDone bool
	end                int // bytes of the object, when done
	done               bool
	bad                bool
}

// scanCall reads a call object ({"name": ..., "arguments": ...}) at the
// start of s; argKeys are the keys the arguments may go under.
func scanCall(s string, argKeys ...string) objectSnap {
	var o objectSnap
	if s == "" || s[0] != '{' {
		o.bad = true
		return o
	}
	i := 1
	for {
		i += wsLen(s[i:])
		if i >= len(s) {
			return o
		}
		if s[i] == '}' {
			o.end, o.done = i+1, true
			return o
		}
		if s[i] == ',' {
			i++
			continue
		}
		if s[i] != '"' {
			o.bad = true
			return o
		}
		n, complete, _ := scanValue(s[i:])
		if !complete {
			return o
		}
		var key string
		if json.Unmarshal([]byte(s[i:i+n]), &key) != nil {
			o.bad = true
			return o
		}
		i += n
		i += wsLen(s[i:])
		if i >= len(s) {
			return o
		}
		if s[i] != ':' {
			o.bad = true
			return o
		}
		i++
		i += wsLen(s[i:])
		if i >= len(s) {
			return o
		}
		n, complete, bad := scanValue(s[i:])
		if bad {
			o.bad = true
			return o
		}
		isArgs := false
		for _, k := range argKeys {
			isArgs = isArgs || k == key
		}
		switch {
		case key == "name" && !o.nameDone:
			if complete {
				var name string
				if json.Unmarshal([]byte(s[i:i+n]), &name) != nil || name == "" {
					o.bad = true
					return o
				}
				o.name, o.nameDone = name, true
			}
		case isArgs && !o.argsSeen:
			o.argsSeen = true
			o.args, o.argsDone = s[i:i+n], complete
		}
		if !complete {
			return o
		}
		i += n
	}
}

func wsLen(s string) int {
	return len(s) - len(strings.TrimLeft(s, " \t\r\n"))
}
