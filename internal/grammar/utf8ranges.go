package grammar

import "unicode/utf8"

// byteRange is an inclusive range of byte values.
type byteRange struct{ lo, hi byte }

// utf8Sequences splits the code points lo..hi into sequences of byte
// ranges whose concatenations are exactly their UTF-8 encodings. Surrogates
// are skipped since they have no encoding. Each sequence has one range per
// byte, so a class becomes a handful of alternatives of byte classes.
func utf8Sequences(lo, hi rune, out [][]byteRange) [][]byteRange {
	if lo > hi {
		return out
	}
	if hi > utf8.MaxRune {
		hi = utf8.MaxRune
	}
	if lo <= 0xDFFF && hi >= 0xD800 {
		out = utf8Sequences(lo, 0xD7FF, out)
		return utf8Sequences(0xE000, hi, out)
	}
	for _, m := range []rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= m && hi > m {
			out = utf8Sequences(lo, m, out)
			return utf8Sequences(m+1, hi, out)
		}
	}
	if hi < 0x80 {
		return append(out, []byteRange{{byte(lo), byte(hi)}})
	}
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		max := rune(1)<<(6*i) - 1
		if lo&^max != hi&^max {
			if lo&max != 0 {
				out = utf8Sequences(lo, lo|max, out)
				return utf8Sequences((lo|max)+1, hi, out)
			}
			if hi&max != max {
				out = utf8Sequences(lo, (hi&^max)-1, out)
				return utf8Sequences(hi&^max, hi, out)
			}
		}
	}
	var a, b [4]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	s := make([]byteRange, n)
	for i := range n {
		s[i] = byteRange{a[i], b[i]}
	}
	return append(out, s)
}
