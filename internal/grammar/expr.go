package grammar

// expr is the front ends' common syntax tree. Front ends build it; build
// lowers it into rules of byte classes.
type expr interface{ isExpr() }

// lit matches its bytes exactly.
type lit struct{ s string }

// class matches one Unicode code point in any of its ranges (inclusive
// pairs), or, when bytes is set, one byte in the ranges.
type class struct {
	ranges []rune
	bytes  bool
}

type seq []expr
type alt []expr

// ref names a rule; it is resolved when the grammar is built so that rules
// may refer to each other in any order.
type ref struct{ name string }

// rep repeats x between min and max times; max < 0 means no bound.
type rep struct {
	x        expr
	min, max int
}

func (lit) isExpr()   {}
func (class) isExpr() {}
func (seq) isExpr()   {}
func (alt) isExpr()   {}
func (ref) isExpr()   {}
func (rep) isExpr()   {}

// empty matches the empty string.
var empty = seq{}

func optional(x expr) expr { return rep{x, 0, 1} }
func star(x expr) expr     { return rep{x, 0, -1} }

// anyChar is every Unicode scalar value.
var anyChar = class{ranges: []rune{0, 0x10FFFF}}

// negate complements rune ranges (sorted, non-overlapping) over all of
// Unicode.
func negate(r []rune) []rune {
	var out []rune
	next := rune(0)
	for i := 0; i+1 < len(r); i += 2 {
		if r[i] > next {
			out = append(out, next, r[i]-1)
		}
		if r[i+1]+1 > next {
			next = r[i+1] + 1
		}
	}
	if next <= 0x10FFFF {
		out = append(out, next, 0x10FFFF)
	}
	return out
}

// normalizeRanges sorts and merges inclusive rune ranges.
func normalizeRanges(r []rune) []rune {
	type pr struct{ lo, hi rune }
	ps := make([]pr, 0, len(r)/2)
	for i := 0; i+1 < len(r); i += 2 {
		lo, hi := r[i], r[i+1]
		if lo > hi {
			lo, hi = hi, lo
		}
		ps = append(ps, pr{lo, hi})
	}
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && ps[j].lo < ps[j-1].lo; j-- {
			ps[j], ps[j-1] = ps[j-1], ps[j]
		}
	}
	var out []rune
	for _, p := range ps {
		n := len(out)
		if n > 0 && p.lo <= out[n-1]+1 {
			if p.hi > out[n-1] {
				out[n-1] = p.hi
			}
			continue
		}
		out = append(out, p.lo, p.hi)
	}
	return out
}
