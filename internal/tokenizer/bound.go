package tokenizer

import "unicode/utf8"

// Most a normalizer can divide a text's byte length by. Per character the
// worst cases are the Kelvin sign (3 bytes) that NFC, NFD and Lowercase
// turn into a 1-byte "K"/"k", and mathematical letters (4 bytes) that NFKC
// and NFKD turn into one ASCII letter; composition merges at most a Hangul
// syllable's three 3-byte jamo into one 3-byte character. bound_test.go
// checks every rune and random mixes of the troublesome ones.
const (
	nfShrink    = 3
	nfkShrink   = 4
	lowerShrink = 3
)

// MaxTokenBytes is the most bytes of input text one token of Encode can
// stand for, so that a text of n bytes always becomes at least
// ceil(n/MaxTokenBytes()) tokens (BOS and EOS not counted). 0 means no such
// bound holds: the vocabulary can drop characters it cannot spell, fuse
// any run of unknown characters into one token, or a normalizer can delete
// text. It walks the vocabulary, so callers keep the result.
//
// A token's vocabulary text is never shorter than the input it stands for:
// "▁" (3 bytes) stands for a space, a byte-level character (1 or 2 bytes)
// for one byte, "<0xNN>" for one byte, and special tokens are matched
// literally. An unknown token stands for one character (at most 4 bytes),
// and a merge of two symbols that is no token is as long as its two halves.
func (t *Tokenizer) MaxTokenBytes() int {
	if t.canDrop() {
		return 0
	}
	l := 0
	for _, s := range t.tokens {
		l = max(l, len(s))
	}
	for k := range t.merges {
		l = max(l, len(k.left)+len(k.right))
	}
	if t.unk >= 0 {
		l = max(l, utf8.UTFMax)
	}
	if t.hf != nil {
		if t.hf.shrink <= 0 {
			return 0
		}
		l *= t.hf.shrink
	}
	return l
}

// canDrop reports whether Encode can turn text into nothing, or an
// unbounded run of it into one token.
func (t *Tokenizer) canDrop() bool {
	if t.hf != nil && t.kind == kindSPM && !t.hf.byteFallback {
		// One unknown token per character, or per run when fused.
		return t.unk < 0 || t.hf.fuseUnk
	}
	if t.unk >= 0 {
		return false
	}
	// Without an unknown token, a byte the vocabulary cannot spell is
	// dropped (as llama.cpp does).
	for b := range 256 {
		if t.kind == kindSPM && t.byteTok[b] < 0 {
			return true
		}
		if _, ok := t.toID[byteEncode[b]]; t.kind == kindBPE && !ok {
			return true
		}
	}
	return false
}
