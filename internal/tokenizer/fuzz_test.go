package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// checkDecode verifies the Decode/StreamDecoder contract for any ids.
func checkDecode(t *testing.T, tok *Tokenizer, ids []int32) string {
	t.Helper()
	want := tok.Decode(ids)
	if !utf8.ValidString(want) {
		t.Fatalf("Decode(%v) is not valid UTF-8: %q", ids, want)
	}
	d := tok.NewStreamDecoder()
	var sb strings.Builder
	for _, id := range ids {
		c := d.Push(id)
		if !utf8.ValidString(c) {
			t.Fatalf("stream chunk %q for %d is not valid UTF-8", c, id)
		}
		sb.WriteString(c)
	}
	c := d.Flush()
	if !utf8.ValidString(c) {
		t.Fatalf("flushed chunk %q is not valid UTF-8", c)
	}
	sb.WriteString(c)
	if sb.String() != want {
		t.Fatalf("stream %q != Decode %q for %v", sb.String(), want, ids)
	}
	return want
}

func FuzzEncodeDecode(f *testing.F) {
	for _, s := range []string{
		"", " ", "Once upon a time", "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
		"<s>x</s>", "a<|endoftext|>b", "\xe2\x82", "\xff\xfe\x00", "  \t\n\n  x", "▁▁a", "3333333",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	vocabs := []*Tokenizer{load(f, storiesVocab), load(f, gpt2Vocab)}
	f.Fuzz(func(t *testing.T, text string, parseSpecial bool) {
		for _, tok := range vocabs {
			ids := tok.Encode(text, true, parseSpecial)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("Encode(%q) gave id %d outside [0,%d)", text, id, tok.VocabSize())
				}
			}
			got := checkDecode(t, tok, ids)
			// Plain valid text comes back exactly (SentencePiece adds its
			// prefix space and turns "▁" into a space).
			if !parseSpecial && utf8.ValidString(text) && !strings.Contains(text, "▁") {
				want := text
				if tok.kind == kindSPM && text != "" {
					want = " " + text
				}
				if got != want {
					t.Fatalf("Decode(Encode(%q)) = %q", text, got)
				}
			}
			// Arbitrary id sequences, byte tokens included, must decode
			// consistently too.
			raw := make([]int32, 0, len(text)/2)
			for i := 0; i+1 < len(text); i += 2 {
				raw = append(raw, int32(int(text[i])<<8|int(text[i+1]))%int32(tok.VocabSize()+2)-1)
			}
			checkDecode(t, tok, raw)
		}
	})
}
