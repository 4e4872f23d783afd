package reasoning

import (
	"math/rand/v2"
	"testing"
)

func split(t testing.TB, name string, enabled bool, text string, rng *rand.Rand) (string, string) {
	p, err := New(name, enabled)
	if err != nil {
		t.Fatal(err)
	}
	var r, c string
	for len(text) > 0 {
		n := len(text)
		if rng != nil {
			n = min(n, 1+rng.IntN(6))
		}
		a, b := p.Push(text[:n])
		r, c = r+a, c+b
		text = text[n:]
	}
	a, b := p.Finish()
	return r + a, c + b
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		enabled bool
		text    string
		r, c    string
	}{
		{"qwen3", true, "<think>\nplan it\n</think>\n\nThe answer.", "plan it", "The answer."},
		{"qwen3", true, "No block here.", "", "No block here."},
		{"qwen3", true, "<thin", "", "<thin"},
		{"qwen3", false, "<think>x</think>y", "", "<think>x</think>y"},
		{"qwen3", true, "<think>unfinished", "unfinished", ""},
		{"deepseek-r1", true, "plan\n</think>\n\nanswer", "plan", "answer"},
		{"deepseek-r1", true, "<think>\nplan</think>answer", "plan", "answer"},
		{"deepseek-r1", true, "all reasoning, cut off", "all reasoning, cut off", ""},
		{"deepseek-r1", true, "a < b </thi", "a < b </thi", ""},
		{"qwen3", true, "<think>\n\n</think>\n\nHi", "", "Hi"},
	} {
		for _, rng := range []*rand.Rand{nil, rand.New(rand.NewPCG(1, 1))} {
			r, c := split(t, tc.name, tc.enabled, tc.text, rng)
			if r != tc.r || c != tc.c {
				t.Errorf("%s %q: reasoning %q content %q; want %q %q", tc.name, tc.text, r, c, tc.r, tc.c)
			}
		}
	}
	if _, err := New("o1", true); err == nil || Valid("o1") || !Valid("qwen3") {
		t.Fatal("an unknown parser was accepted")
	}
}

// FuzzSplit checks that streaming in pieces splits as the whole text does,
// and that nothing but tags and the newlines around them is lost.
func FuzzSplit(f *testing.F) {
	f.Add("<think>\nx\n</think>\n\ny", uint64(1))
	f.Add("a</think>b<think>c", uint64(2))
	f.Fuzz(func(t *testing.T, text string, seed uint64) {
		for _, name := range Formats {
			r1, c1 := split(t, name, true, text, nil)
			r2, c2 := split(t, name, true, text, rand.New(rand.NewPCG(seed, 1)))
			if r1 != r2 || c1 != c2 {
				t.Fatalf("%s %q: whole (%q, %q), pieces (%q, %q)", name, text, r1, c1, r2, c2)
			}
			if len(r1)+len(c1) > len(text) {
				t.Fatalf("%s %q: more out than in", name, text)
			}
		}
	})
}
