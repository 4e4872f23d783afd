package grammar

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// FromGBNF builds a grammar from llama.cpp's GBNF notation:
//
//	root  ::= item ("," " "? item)*
//	item  ::= [a-z]+ | "\"" [^"]* "\""   # comments run to the end of the line
//
// Rules are name ::= alternatives; an expression is a sequence of string
// literals (escapes \n \r \t \\ \" \xHH \uHHHH \UHHHHHHHH, standing for code
// points), character classes [a-z], [^...], '.' for any character, rule
// names and parenthesised groups, each optionally followed by *, +, ?,
// {m}, {m,} or {m,n}. The start rule is root. Line breaks may appear
// anywhere between symbols; a rule ends where the next "name ::=" begins.
func FromGBNF(src string) (*Grammar, error) {
	p := &gbnfParser{src: src}
	var defs []namedExpr
	p.space()
	for !p.eof() {
		name := p.name()
		if name == "" {
			return nil, p.errorf("expected a rule name")
		}
		p.space()
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return nil, p.errorf("expected ::= after %q", name)
		}
		p.pos += 3
		body, err := p.alternates(0)
		if err != nil {
			return nil, err
		}
		defs = append(defs, namedExpr{name, body})
		p.space()
	}
	return build(defs, "root")
}

type gbnfParser struct {
	src string
	pos int
}

func (p *gbnfParser) eof() bool { return p.pos >= len(p.src) }

func (p *gbnfParser) errorf(format string, args ...any) error {
	line := 1 + strings.Count(p.src[:min(p.pos, len(p.src))], "\n")
	return fmt.Errorf("grammar: GBNF line %d: %s", line, fmt.Sprintf(format, args...))
}

// space skips blanks, line breaks and comments.
func (p *gbnfParser) space() {
	for !p.eof() {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t' || c == '\r' || c == '\n':
			p.pos++
		case c == '#':
			for !p.eof() && p.src[p.pos] != '\n' {
				p.pos++
			}
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	start := p.pos
	for !p.eof() && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// atRuleStart reports whether "name ::=" begins here.
func (p *gbnfParser) atRuleStart() bool {
	save := p.pos
	defer func() { p.pos = save }()
	if p.name() == "" {
		return false
	}
	p.space()
	return strings.HasPrefix(p.src[p.pos:], "::=")
}

// maxGBNFDepth bounds group nesting.
const maxGBNFDepth = 200

func (p *gbnfParser) alternates(depth int) (expr, error) {
	if depth > maxGBNFDepth {
		return nil, p.errorf("groups nested too deeply")
	}
	var a alt
	for {
		s, err := p.sequence(depth)
		if err != nil {
			return nil, err
		}
		a = append(a, s)
		p.space()
		if p.eof() || p.src[p.pos] != '|' {
			break
		}
		p.pos++
	}
	if len(a) == 1 {
		return a[0], nil
	}
	return a, nil
}

func (p *gbnfParser) sequence(depth int) (expr, error) {
	var s seq
	for {
		p.space()
		if p.eof() {
			break
		}
		c := p.src[p.pos]
		if c == '|' || c == ')' || p.atRuleStart() {
			break
		}
		var x expr
		var err error
		switch {
		case c == '"':
			x, err = p.literal()
		case c == '[':
			x, err = p.class()
		case c == '.':
			p.pos++
			x = anyChar
		case c == '(':
			p.pos++
			x, err = p.alternates(depth + 1)
			if err == nil {
				p.space()
				if p.eof() || p.src[p.pos] != ')' {
					return nil, p.errorf("expected )")
				}
				p.pos++
			}
		case isNameByte(c):
			x = ref{p.name()}
		default:
			return nil, p.errorf("unexpected %q", c)
		}
		if err != nil {
			return nil, err
		}
		x, err = p.postfix(x)
		if err != nil {
			return nil, err
		}
		s = append(s, x)
	}
	if len(s) == 1 {
		return s[0], nil
	}
	return s, nil
}

func (p *gbnfParser) postfix(x expr) (expr, error) {
	for !p.eof() {
		switch p.src[p.pos] {
		case '*':
			x = star(x)
		case '+':
			x = rep{x, 1, -1}
		case '?':
			x = optional(x)
		case '{':
			end := strings.IndexByte(p.src[p.pos:], '}')
			if end < 0 {
				return nil, p.errorf("unterminated {")
			}
			body := p.src[p.pos+1 : p.pos+end]
			lo, hi, err := parseBounds(body)
			if err != nil {
				return nil, p.errorf("bad repetition {%s}", body)
			}
			x = rep{x, lo, hi}
			p.pos += end
		default:
			return x, nil
		}
		p.pos++
	}
	return x, nil
}

func parseBounds(s string) (lo, hi int, err error) {
	s = strings.TrimSpace(s)
	a, b, comma := strings.Cut(s, ",")
	lo, err = strconv.Atoi(strings.TrimSpace(a))
	if err != nil || lo < 0 || lo > maxRepeat {
		return 0, 0, fmt.Errorf("bad bound")
	}
	if !comma {
		return lo, lo, nil
	}
	b = strings.TrimSpace(b)
	if b == "" {
		return lo, -1, nil
	}
	hi, err = strconv.Atoi(b)
	if err != nil || hi < lo || hi > maxRepeat {
		return 0, 0, fmt.Errorf("bad bound")
	}
	return lo, hi, nil
}

// char reads one possibly escaped character of a literal or class.
func (p *gbnfParser) char() (rune, error) {
	if p.eof() {
		return 0, p.errorf("unexpected end")
	}
	if p.src[p.pos] != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		p.pos += n
		return r, nil
	}
	p.pos++
	if p.eof() {
		return 0, p.errorf("unexpected end after \\")
	}
	c := p.src[p.pos]
	p.pos++
	hex := 0
	switch c {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'x':
		hex = 2
	case 'u':
		hex = 4
	case 'U':
		hex = 8
	default:
		return rune(c), nil
	}
	if p.pos+hex > len(p.src) {
		return 0, p.errorf("short \\%c escape", c)
	}
	v, err := strconv.ParseUint(p.src[p.pos:p.pos+hex], 16, 32)
	if err != nil || v > utf8.MaxRune {
		return 0, p.errorf("bad \\%c escape", c)
	}
	p.pos += hex
	return rune(v), nil
}

func (p *gbnfParser) literal() (expr, error) {
	p.pos++ // opening quote
	var sb strings.Builder
	for {
		if p.eof() {
			return nil, p.errorf("unterminated string")
		}
		if p.src[p.pos] == '"' {
			p.pos++
			return lit{sb.String()}, nil
		}
		r, err := p.char()
		if err != nil {
			return nil, err
		}
		sb.WriteRune(r)
	}
}

func (p *gbnfParser) class() (expr, error) {
	p.pos++ // [
	neg := false
	if !p.eof() && p.src[p.pos] == '^' {
		neg = true
		p.pos++
	}
	var rs []rune
	for {
		if p.eof() {
			return nil, p.errorf("unterminated character class")
		}
		if p.src[p.pos] == ']' {
			p.pos++
			break
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
		}
		rs = append(rs, lo, hi)
	}
	rs = normalizeRanges(rs)
	if neg {
		rs = negate(rs)
	}
	return class{ranges: rs}, nil
}
