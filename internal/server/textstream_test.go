package server

import (
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/tokenizer"
)

func bundledTokenizer(t *testing.T) *tokenizer.Tokenizer {
	f, err := gguf.Parse(bundled.Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// Text released while streaming never contains any part of a stop string,
// and the released pieces add up to the text before the first stop.
func TestTextStreamHoldsBackStopStrings(t *testing.T) {
	tok := bundledTokenizer(t)
	ids := tok.Encode("there was a little girl named Lily. She loved to play outside in the park.", false, false)
	text := tok.Decode(ids) // the SentencePiece prefix space is part of a continuation
	if text != " there was a little girl named Lily. She loved to play outside in the park." {
		t.Fatalf("decoded %q", text)
	}
	for _, tc := range []struct {
		stops []string
		want  string
		stop  bool
	}{
		{[]string{"Lily"}, " there was a little girl named ", true},
		{[]string{"park.", "girl"}, " there was a little ", true},
		{[]string{"Lilx"}, text, false},
		{[]string{"ay outside in the park.!"}, text, false},
		{nil, text, false},
	} {
		ts := textStream{dec: tok.NewStreamDecoder(), stops: tc.stops}
		var got strings.Builder
		stopped := false
		for _, id := range ids {
			piece, s := ts.push(id)
			for _, st := range tc.stops {
				for n := 1; n <= len(st) && !s; n++ {
					if strings.Contains(got.String()+piece, st[:n]) && !strings.Contains(tc.want, st[:n]) {
						t.Fatalf("stops %q: released %q, which holds %q", tc.stops, got.String()+piece, st[:n])
					}
				}
			}
			got.WriteString(piece)
			if s {
				stopped = true
				break
			}
		}
		if !stopped {
			got.WriteString(ts.flush())
		}
		if got.String() != tc.want || stopped != tc.stop || ts.out.String() != tc.want {
			t.Fatalf("stops %q: got %q (stopped %v), want %q (%v)", tc.stops, got.String(), stopped, tc.want, tc.stop)
		}
	}
}

func TestOverlap(t *testing.T) {
	for _, tc := range []struct {
		text, stop string
		want       int
	}{{"abc", "cde", 1}, {"abcd", "cde", 2}, {"abc", "abc", 0}, {"xab", "abc", 2}, {"xyz", "abc", 0}, {"", "abc", 0}} {
		if got := overlap(tc.text, tc.stop); got != tc.want {
			t.Errorf("overlap(%q, %q) = %d, want %d", tc.text, tc.stop, got, tc.want)
		}
	}
}
