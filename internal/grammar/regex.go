package grammar

import (
	"fmt"
	"regexp/syntax"
	"unicode"
)

// FromRegex builds the grammar of the strings that pattern matches in
// full, with Go's regexp syntax: literals, classes, '.', * + ? {m,n}
// (greedy or not, which makes no difference to the language), alternation,
// groups and flags. ^ and $ are allowed at the ends only; other assertions
// (\b, multi-line anchors) are refused.
func FromRegex(pattern string) (*Grammar, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("grammar: %w", err)
	}
	re = re.Simplify()
	e, err := regexExpr(re, true, true, false, 0)
	if err != nil {
		return nil, err
	}
	return build([]namedExpr{{"root", e}}, "root")
}

// jsonStringPattern is the expression of the contents of a JSON string
// (quotes not included) whose value matches pattern somewhere, as JSON
// Schema's pattern means: unless anchored with ^ or $, anything may come
// before or after.
func jsonStringPattern(pattern string) (expr, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, fmt.Errorf("grammar: pattern: %w", err)
	}
	re = re.Simplify()
	e, err := regexExpr(re, true, true, true, 0)
	if err != nil {
		return nil, err
	}
	anyText := star(jsonChars(anyChar.ranges))
	s := seq{e}
	if !anchoredStart(re) {
		s = seq{anyText, e}
	}
	if !anchoredEnd(re) {
		s = append(s, anyText)
	}
	return s, nil
}

func anchoredStart(re *syntax.Regexp) bool {
	for re.Op == syntax.OpConcat || re.Op == syntax.OpCapture {
		if len(re.Sub) == 0 {
			return false
		}
		re = re.Sub[0]
	}
	return re.Op == syntax.OpBeginText || re.Op == syntax.OpBeginLine
}

func anchoredEnd(re *syntax.Regexp) bool {
	for re.Op == syntax.OpConcat || re.Op == syntax.OpCapture {
		if len(re.Sub) == 0 {
			return false
		}
		re = re.Sub[len(re.Sub)-1]
	}
	return re.Op == syntax.OpEndText || re.Op == syntax.OpEndLine
}

// jsonUnsafe are the characters a JSON string cannot hold unescaped.
var jsonUnsafe = []rune{0, 0x1F, '"', '"', '\\', '\\'}

// jsonChars matches the characters in ranges as they are written inside a
// JSON string: plainly where allowed, by their escape otherwise.
func jsonChars(ranges []rune) expr {
	r := normalizeRanges(ranges)
	a := alt{class{ranges: intersect(r, negate(jsonUnsafe))}}
	for i := 0; i+1 < len(jsonUnsafe); i += 2 {
		for u := jsonUnsafe[i]; u <= jsonUnsafe[i+1]; u++ {
			if inRanges(r, u) {
				a = append(a, lit{jsonEscape(u)})
			}
		}
	}
	if len(a) == 1 {
		return a[0]
	}
	return a
}

func jsonEscape(r rune) string {
	switch r {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	case '\n':
		return `\n`
	case '\r':
		return `\r`
	case '\t':
		return `\t`
	}
	return fmt.Sprintf(`\u%04x`, r)
}

func inRanges(r []rune, c rune) bool {
	for i := 0; i+1 < len(r); i += 2 {
		if c >= r[i] && c <= r[i+1] {
			return true
		}
	}
	return false
}

// intersect is the intersection of two normalised range lists.
func intersect(a, b []rune) []rune {
	var out []rune
	for i, j := 0, 0; i+1 < len(a) && j+1 < len(b); {
		lo, hi := max(a[i], b[j]), min(a[i+1], b[j+1])
		if lo <= hi {
			out = append(out, lo, hi)
		}
		if a[i+1] < b[j+1] {
			i += 2
		} else {
			j += 2
		}
	}
	return out
}

// regexExpr converts re; atStart and atEnd say whether re can only sit at
// the start or end of the whole match, where ^ and $ are harmless. In a
// JSON string (inJSON) characters are matched as JSON writes them.
func regexExpr(re *syntax.Regexp, atStart, atEnd, inJSON bool, depth int) (expr, error) {
	if depth > 1000 {
		return nil, fmt.Errorf("grammar: regular expression nested too deeply")
	}
	switch re.Op {
	case syntax.OpNoMatch:
		return class{}, nil
	case syntax.OpEmptyMatch:
		return empty, nil
	case syntax.OpLiteral:
		s := seq{}
		for _, r := range re.Rune {
			rs := []rune{r, r}
			if re.Flags&syntax.FoldCase != 0 {
				rs = foldRanges(r)
			}
			s = append(s, chars(rs, inJSON))
		}
		return s, nil
	case syntax.OpCharClass:
		return chars(re.Rune, inJSON), nil
	case syntax.OpAnyCharNotNL:
		return chars([]rune{0, '\n' - 1, '\n' + 1, unicode.MaxRune}, inJSON), nil
	case syntax.OpAnyChar:
		return chars(anyChar.ranges, inJSON), nil
	case syntax.OpBeginText, syntax.OpBeginLine:
		if atStart {
			return empty, nil
		}
	case syntax.OpEndText, syntax.OpEndLine:
		if atEnd {
			return empty, nil
		}
	case syntax.OpCapture:
		return regexExpr(re.Sub[0], atStart, atEnd, inJSON, depth+1)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		// A repeated part may be followed or preceded by itself, so it is
		// at neither end.
		x, err := regexExpr(re.Sub[0], false, false, inJSON, depth+1)
		if err != nil {
			return nil, err
		}
		switch re.Op {
		case syntax.OpStar:
			return star(x), nil
		case syntax.OpPlus:
			return rep{x, 1, -1}, nil
		case syntax.OpQuest:
			return optional(x), nil
		}
		return rep{x, re.Min, re.Max}, nil
	case syntax.OpConcat:
		s := make(seq, len(re.Sub))
		for i, sub := range re.Sub {
			x, err := regexExpr(sub, atStart && i == 0, atEnd && i == len(re.Sub)-1, inJSON, depth+1)
			if err != nil {
				return nil, err
			}
			s[i] = x
		}
		return s, nil
	case syntax.OpAlternate:
		a := make(alt, len(re.Sub))
		for i, sub := range re.Sub {
			x, err := regexExpr(sub, atStart, atEnd, inJSON, depth+1)
			if err != nil {
				return nil, err
			}
			a[i] = x
		}
		return a, nil
	}
	return nil, fmt.Errorf("grammar: regular expression operator %v is not supported here", re.Op)
}

// foldRanges is r in every case.
func foldRanges(r rune) []rune {
	rs := []rune{r, r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rs = append(rs, f, f)
	}
	return rs
}

func chars(ranges []rune, inJSON bool) expr {
	if inJSON {
		return jsonChars(ranges)
	}
	if len(ranges) == 2 && ranges[0] == ranges[1] {
		return lit{string(ranges[0])}
	}
	return class{ranges: append([]rune(nil), ranges...)}
}
