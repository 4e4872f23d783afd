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
	e, err := regexExpr(re, true, true, 0)
	if err != nil {
		return nil, err
	}
	return build([]namedExpr{{"root", e}}, "root")
}

// regexExpr converts re; atStart and atEnd say whether re can only sit at
// the start or end of the whole match, where ^ and $ are harmless.
func regexExpr(re *syntax.Regexp, atStart, atEnd bool, depth int) (expr, error) {
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
			if re.Flags&syntax.FoldCase != 0 {
				s = append(s, foldClass(r))
			} else {
				s = append(s, lit{string(r)})
			}
		}
		return s, nil
	case syntax.OpCharClass:
		return class{ranges: append([]rune(nil), re.Rune...)}, nil
	case syntax.OpAnyCharNotNL:
		return class{ranges: []rune{0, '\n' - 1, '\n' + 1, unicode.MaxRune}}, nil
	case syntax.OpAnyChar:
		return anyChar, nil
	case syntax.OpBeginText, syntax.OpBeginLine:
		if atStart {
			return empty, nil
		}
	case syntax.OpEndText, syntax.OpEndLine:
		if atEnd {
			return empty, nil
		}
	case syntax.OpCapture:
		return regexExpr(re.Sub[0], atStart, atEnd, depth+1)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest, syntax.OpRepeat:
		// A repeated part may be followed or preceded by itself, so it is
		// at neither end.
		x, err := regexExpr(re.Sub[0], false, false, depth+1)
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
			x, err := regexExpr(sub, atStart && i == 0, atEnd && i == len(re.Sub)-1, depth+1)
			if err != nil {
				return nil, err
			}
			s[i] = x
		}
		return s, nil
	case syntax.OpAlternate:
		a := make(alt, len(re.Sub))
		for i, sub := range re.Sub {
			x, err := regexExpr(sub, atStart, atEnd, depth+1)
			if err != nil {
				return nil, err
			}
			a[i] = x
		}
		return a, nil
	}
	return nil, fmt.Errorf("grammar: regular expression operator %v is not supported here", re.Op)
}

// foldClass is r in every case.
func foldClass(r rune) expr {
	rs := []rune{r, r}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rs = append(rs, f, f)
	}
	return class{ranges: rs}
}
