package toolcall

import (
	"encoding/json"
	"strconv"
	"strings"
)

// pythonic reads [f(a=1, b="x"), g()] at the start of the text, optionally
// between <|python_start|> and <|python_end|>. Values are Python literals
// (strings, numbers, True/False/None, lists, dicts) or their JSON forms;
// arguments become a JSON object in the order written.
func pythonic(text string, final, _ bool) snapshot {
	const pyStart, pyEnd = "<|python_start|>", "<|python_end|>"
	var sn snapshot
	lead := wsLen(text)
	p := lead
	if strings.HasPrefix(text[p:], pyStart) {
		p += len(pyStart)
		p += wsLen(text[p:])
	} else if rest := text[p:]; len(rest) < len(pyStart) && strings.HasPrefix(pyStart, rest) && !final {
		return sn
	}
	plain := func() snapshot {
		return snapshot{content: release(text, nil, final, false)}
	}
	if p >= len(text) {
		if final {
			return plain()
		}
		return sn
	}
	if text[p] != '[' {
		return plain()
	}
	p++
	for {
		p += wsLen(text[p:])
		if p >= len(text) {
			break
		}
		if text[p] == ',' && len(sn.calls) > 0 {
			p++
			continue
		}
		if text[p] == ']' {
			if len(sn.calls) == 0 {
				return plain()
			}
			p++
			q := p + wsLen(text[p:])
			if strings.HasPrefix(text[q:], pyEnd) {
				p = q + len(pyEnd)
			}
			sn.content = release(text[p:], []string{pyEnd}, final, true)
			return sn
		}
		c, n, st := pyCall(text[p:])
		if st == bad {
			if len(sn.calls) == 0 {
				return plain()
			}
			sn.content = release(text[p:], nil, final, true)
			return sn
		}
		if st == more {
			break // a call is sent whole: until its ')' it may yet prove not to be one
		}
		sn.calls = append(sn.calls, c)
		p += n
	}
	if final && len(sn.calls) == 0 {
		return plain()
	}
	return sn
}

type status int

const (
	ok status = iota
	more
	bad
)

// pyCall reads name(k=v, ...) at the start of s.
func pyCall(s string) (callSnap, int, status) {
	var c callSnap
	i := 0
	for i < len(s) && (s[i] == '_' || s[i] == '.' || isAlnum(s[i])) {
		i++
	}
	if i == len(s) {
		return c, 0, more
	}
	if i == 0 || s[i] != '(' || (s[0] >= '0' && s[0] <= '9') {
		return c, 0, bad
	}
	c.name, c.nameDone = s[:i], true
	i++
	var args strings.Builder
	args.WriteByte('{')
	first := true
	for {
		i += wsLen(s[i:])
		if i >= len(s) {
			return c, 0, more
		}
		if s[i] == ')' {
			args.WriteByte('}')
			c.args, c.argsDone = args.String(), true
			return c, i + 1, ok
		}
		if s[i] == ',' && !first {
			i++
			continue
		}
		j := i
		for j < len(s) && (s[j] == '_' || isAlnum(s[j])) {
			j++
		}
		if j == len(s) {
			return c, 0, more
		}
		key := s[i:j]
		j += wsLen(s[j:])
		if j >= len(s) {
			return c, 0, more
		}
		if key == "" || s[j] != '=' {
			return c, 0, bad
		}
		j++
		j += wsLen(s[j:])
		v, n, st := pyValue(s[j:], 0)
		if st != ok {
			return c, 0, st
		}
		if !first {
			args.WriteString(", ")
		}
		first = false
		kb, _ := json.Marshal(key)
		args.Write(kb)
		args.WriteString(": ")
		args.WriteString(v)
		i = j + n
	}
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

const maxPyDepth = 64

// pyValue reads one literal and returns it as JSON text.
func pyValue(s string, depth int) (string, int, status) {
	if depth > maxPyDepth {
		return "", 0, bad
	}
	if s == "" {
		return "", 0, more
	}
	switch c := s[0]; {
	case c == '"' || c == '\'':
		return pyString(s)
	case c == '[' || c == '(':
		closer := byte(']')
		if c == '(' {
			closer = ')'
		}
		return pySeq(s, closer, depth)
	case c == '{':
		return pyDict(s, depth)
	}
	i := 0
	for i < len(s) && (isAlnum(s[i]) || s[i] == '-' || s[i] == '+' || s[i] == '.') {
		i++
	}
	if i == len(s) {
		return "", 0, more
	}
	w := s[:i]
	switch w {
	case "True", "true":
		return "true", i, ok
	case "False", "false":
		return "false", i, ok
	case "None", "null":
		return "null", i, ok
	}
	if f, err := strconv.ParseFloat(w, 64); err == nil && !strings.ContainsAny(w, "InfinityNaN") {
		if n, err := strconv.ParseInt(w, 10, 64); err == nil {
			return strconv.FormatInt(n, 10), i, ok
		}
		b, _ := json.Marshal(f)
		return string(b), i, ok
	}
	return "", 0, bad
}

func pyString(s string) (string, int, status) {
	q := s[0]
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == q:
			out, _ := json.Marshal(b.String())
			return string(out), i + 1, ok
		case c == '\\':
			if i+1 >= len(s) {
				return "", 0, more
			}
			i++
			switch e := s[i]; e {
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'r':
				b.WriteByte('\r')
			case 'u':
				if i+4 >= len(s) {
					return "", 0, more
				}
				r, err := strconv.ParseUint(s[i+1:i+5], 16, 32)
				if err != nil {
					return "", 0, bad
				}
				b.WriteRune(rune(r))
				i += 4
			default:
				b.WriteByte(e)
			}
		case c == '\n':
			return "", 0, bad
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, more
}

func pySeq(s string, closer byte, depth int) (string, int, status) {
	var b strings.Builder
	b.WriteByte('[')
	i, first := 1, true
	for {
		i += wsLen(s[i:])
		if i >= len(s) {
			return "", 0, more
		}
		if s[i] == closer {
			b.WriteByte(']')
			return b.String(), i + 1, ok
		}
		if s[i] == ',' && !first {
			i++
			continue
		}
		v, n, st := pyValue(s[i:], depth+1)
		if st != ok {
			return "", 0, st
		}
		if !first {
			b.WriteString(", ")
		}
		first = false
		b.WriteString(v)
		i += n
	}
}

func pyDict(s string, depth int) (string, int, status) {
	var b strings.Builder
	b.WriteByte('{')
	i, first := 1, true
	for {
		i += wsLen(s[i:])
		if i >= len(s) {
			return "", 0, more
		}
		if s[i] == '}' {
			b.WriteByte('}')
			return b.String(), i + 1, ok
		}
		if s[i] == ',' && !first {
			i++
			continue
		}
		k, n, st := pyValue(s[i:], depth+1)
		if st != ok {
			return "", 0, st
		}
		if !strings.HasPrefix(k, `"`) {
			k = strconv.Quote(k) // JSON keys are strings
		}
		i += n
		i += wsLen(s[i:])
		if i >= len(s) {
			return "", 0, more
		}
		if s[i] != ':' {
			return "", 0, bad
		}
		i++
		i += wsLen(s[i:])
		v, n, st := pyValue(s[i:], depth+1)
		if st != ok {
			return "", 0, st
		}
		if !first {
			b.WriteString(", ")
		}
		first = false
		b.WriteString(k)
		b.WriteString(": ")
		b.WriteString(v)
		i += n
	}
}
