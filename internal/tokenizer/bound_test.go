package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// The bound must hold for every text, so the texts here lean on what
// shrinks or merges: byte-fallback characters, spaces that become "▁",
// special-token text, invalid UTF-8, long runs that merge into long tokens,
// and characters normalizers fold (Kelvin, fullwidth, mathematical letters,
// Hangul jamo, combining marks).
func randomText(r *rand.Rand, tok *Tokenizer) string {
	pieces := []string{
		" ", "  ", "▁", "\n", "\t", "a", "e", "the", " the", "Once upon a time", "ing",
		"\u212a", "\u212b", "\uff21", "\U0001d400", "\u1100", "\u1161", "\u11a8", "\u0301", "\u0323",
		"é", "我", "😁", "\xff", "\xe2\x82", "\x00", "<0x41>", "<s>", "</s>", "<unk>", "<|endoftext|>",
		"<|im_start|>", "=", "-", "0", "1",
	}
	var b strings.Builder
	n := r.IntN(400)
	for range n {
		switch r.IntN(4) {
		case 0:
			// a vocabulary token spelled out, often a long one
			id := r.IntN(tok.VocabSize())
			b.WriteString(tok.TokenText(int32(id)))
		case 1:
			b.WriteRune(rune(r.IntN(0x30000)))
		default:
			p := pieces[r.IntN(len(pieces))]
			b.WriteString(strings.Repeat(p, 1+r.IntN(40)))
		}
	}
	return b.String()
}

func checkBound(t *testing.T, name string, tok *Tokenizer, iters int) {
	t.Helper()
	l := tok.MaxTokenBytes()
	if l <= 0 {
		t.Fatalf("%s: MaxTokenBytes = %d, want a bound", name, l)
	}
	r := rand.New(rand.NewPCG(1, uint64(len(name))))
	// The longest tokens repeated are the texts that come closest to it.
	var longest string
	for i := range tok.VocabSize() {
		if s := tok.TokenText(int32(i)); len(s) > len(longest) {
			longest = s
		}
	}
	texts := []string{strings.Repeat(longest, 50), strings.Repeat(" ", 3000), strings.Repeat("\u212a", 500)}
	for range iters {
		texts = append(texts, randomText(r, tok))
	}
	for _, s := range texts {
		for _, special := range []bool{false, true} {
			got := len(tok.Encode(s, false, special))
			if least := (len(s) + l - 1) / l; got < least {
				t.Fatalf("%s: %q (%d bytes) became %d tokens, fewer than ceil(%d/%d) = %d", name, s, len(s), got, len(s), l, least)
			}
		}
	}
}

func TestMaxTokenBytesIsALowerBound(t *testing.T) {
	for _, c := range []struct {
		name string
		tok  func() *Tokenizer
	}{
		{"stories260K gguf", func() *Tokenizer { return load(t, storiesVocab) }},
		{"llama spm gguf", func() *Tokenizer { return load(t, spmVocab) }},
		{"gpt-2 gguf", func() *Tokenizer { return load(t, gpt2Vocab) }},
		{"stories260K hf", func() *Tokenizer { return loadHF(t, storiesHF) }},
		{"qwen3 hf (NFC)", func() *Tokenizer { return loadHF(t, qwen3Dir) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			iters := 200
			if testing.Short() {
				iters = 30
			}
			checkBound(t, c.name, c.tok(), iters)
		})
	}
}

// The stated worst cases of each normalizer hold for every single
// character; composition is exercised by the random texts above.
func TestNormalizerShrink(t *testing.T) {
	for _, c := range []struct {
		name   string
		f      func(string) string
		factor int
	}{
		{"NFC", norm.NFC.String, nfShrink},
		{"NFD", norm.NFD.String, nfShrink},
		{"NFKC", norm.NFKC.String, nfkShrink},
		{"NFKD", norm.NFKD.String, nfkShrink},
		{"Lowercase", strings.ToLower, lowerShrink},
	} {
		for r := rune(0); r <= utf8.MaxRune; r++ {
			if !utf8.ValidRune(r) {
				continue
			}
			s := string(r)
			if out := c.f(s); len(out)*c.factor < len(s) {
				t.Errorf("%s(%U) is %d bytes from %d: shrinks more than %d times", c.name, r, len(out), len(s), c.factor)
			}
		}
		// Compositions: a Hangul syllable from its three jamo, letters with
		// several marks, folded letters with marks.
		r := rand.New(rand.NewPCG(7, 7))
		parts := []string{"\u1100", "\u1161", "\u11a8", "\u3131", "\uffa1", "e", "\u0301", "\u0302", "\u0323", "\u0345", "\u0313",
			"\u212a", "\u212b", "\u2126", "\U0001d41e", "\uff45", "\u03b1", "\u1fef", "K"}
		for range 20000 {
			var b strings.Builder
			for range 1 + r.IntN(12) {
				b.WriteString(parts[r.IntN(len(parts))])
			}
			s := b.String()
			if out := c.f(s); len(out)*c.factor < len(s) {
				t.Errorf("%s(%q) is %d bytes from %d: shrinks more than %d times", c.name, s, len(out), len(s), c.factor)
			}
		}
	}
}

// Vocabularies that can lose text, or fuse any run of it into one token,
// have no bound.
func TestMaxTokenBytesNone(t *testing.T) {
	fused := miniHFMetaspace("always", true)
	m := fused["model"].(map[string]any)
	m["byte_fallback"], m["fuse_unk"] = false, true
	tok, err := hfFrom(t, fused, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l := tok.MaxTokenBytes(); l != 0 {
		t.Errorf("fused unknowns: MaxTokenBytes = %d, want 0", l)
	}
	if n := len(tok.Encode(strings.Repeat("\u00e9", 1000), false, false)); n > 3 {
		t.Logf("fused unknowns: %d tokens", n) // the reason for the 0 above
	}
	deleting := miniHFMetaspace("always", true)
	deleting["normalizer"] = map[string]any{"type": "Replace", "pattern": map[string]any{"String": "x"}, "content": ""}
	tok, err = hfFrom(t, deleting, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l := tok.MaxTokenBytes(); l != 0 {
		t.Errorf("Replace with nothing: MaxTokenBytes = %d, want 0", l)
	}
}
