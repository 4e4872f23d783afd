package grammar

import (
	"math"
	"strconv"
	"strings"
)

// Integer bounds (minimum, maximum and their exclusive forms) are enforced
// digit by digit: the decimal spellings of the integers in a range, without
// leading zeros, form a regular language, built here from the bounds'
// digits.

var (
	digit      = class{ranges: []rune{'0', '9'}}
	digit19    = class{ranges: []rune{'1', '9'}}
	noBound    = int64(math.MinInt64)
	maxBounded = int64(1e17) // bounds past this are treated as absent
)

// intRange spells the integers in [lo, hi]; noBound stands for a missing
// end. lo <= hi unless one is missing.
func intRange(lo, hi int64) expr {
	var a alt
	// Negative part: "-" followed by the magnitudes in [max(1,-hi), -lo].
	if lo == noBound || lo < 0 {
		mlo := int64(1)
		if hi != noBound && hi < 0 {
			mlo = -hi
		}
		mhi := noBound
		if lo != noBound {
			mhi = -lo
		}
		a = append(a, seq{lit{"-"}, natRange(mlo, mhi)})
	}
	// Non-negative part: [max(0,lo), hi].
	if hi == noBound || hi >= 0 {
		a = append(a, natRange(max(lo, 0), hi))
	}
	if len(a) == 1 {
		return a[0]
	}
	return a
}

// natRange spells the integers in [lo, hi], lo >= 0, hi possibly noBound.
func natRange(lo, hi int64) expr {
	ls := strconv.FormatInt(lo, 10)
	var a alt
	if hi == noBound {
		// Every number as long as lo and not below it, and every longer one.
		a = append(a, sameLength(ls, strings.Repeat("9", len(ls))))
		a = append(a, seq{digit19, rep{digit, len(ls), -1}})
		return a
	}
	hs := strconv.FormatInt(hi, 10)
	for n := len(ls); n <= len(hs); n++ {
		from, to := ls, hs
		if n > len(ls) {
			from = "1" + strings.Repeat("0", n-1)
		}
		if n < len(hs) {
			to = strings.Repeat("9", n)
		}
		a = append(a, sameLength(from, to))
	}
	if len(a) == 1 {
		return a[0]
	}
	return a
}

// sameLength spells the digit strings of len(a) between a and b inclusive.
func sameLength(a, b string) expr {
	if a == "" {
		return empty
	}
	if a[0] == b[0] {
		return seq{lit{a[:1]}, sameLength(a[1:], b[1:])}
	}
	rest := len(a) - 1
	if strings.Trim(a[1:], "0") == "" && strings.Trim(b[1:], "9") == "" {
		return seq{class{ranges: []rune{rune(a[0]), rune(b[0])}}, rep{digit, rest, rest}}
	}
	al := alt{seq{lit{a[:1]}, sameLength(a[1:], strings.Repeat("9", rest))}}
	if a[0]+1 <= b[0]-1 {
		al = append(al, seq{class{ranges: []rune{rune(a[0] + 1), rune(b[0] - 1)}}, rep{digit, rest, rest}})
	}
	al = append(al, seq{lit{b[:1]}, sameLength(strings.Repeat("0", rest), b[1:])})
	return al
}

// intBounds reads an integer schema's bounds; ok is false when it has none
// that can be enforced.
func intBounds(v *jval) (lo, hi int64, ok bool, err error) {
	lo, hi = noBound, noBound
	get := func(k string) (float64, bool) {
		x := v.get(k)
		if x == nil || x.kind != 'n' {
			return 0, false
		}
		f, err := strconv.ParseFloat(x.str, 64)
		if err != nil || math.Abs(f) > float64(maxBounded) {
			return 0, false
		}
		return f, true
	}
	if f, has := get("minimum"); has {
		lo = int64(math.Ceil(f))
	}
	if f, has := get("exclusiveMinimum"); has {
		if l := int64(math.Floor(f)) + 1; lo == noBound || l > lo {
			lo = l
		}
	}
	if f, has := get("maximum"); has {
		hi = int64(math.Floor(f))
	}
	if f, has := get("exclusiveMaximum"); has {
		if h := int64(math.Ceil(f)) - 1; hi == noBound || h < hi {
			hi = h
		}
	}
	if lo == noBound && hi == noBound {
		return lo, hi, false, nil
	}
	if lo != noBound && hi != noBound && lo > hi {
		return 0, 0, false, errEmptyRange
	}
	return lo, hi, true, nil
}
