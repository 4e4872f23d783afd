package grammar

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// exercise runs a few random steps of a grammar that built, so fuzzing
// reaches the matcher as well as the front ends.
func exercise(t *testing.T, g *Grammar) {
	c, err := Compile(g, loadTok(t, "stories260K"))
	if errors.Is(err, ErrAmbiguous) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	m := c.NewMatcher()
	mask := make([]uint64, c.MaskWords())
	rng := rand.New(rand.NewPCG(1, 2))
	for range 8 {
		m.FillMask(mask)
		allowed := maskList(mask)
		if len(allowed) == 0 {
			return
		}
		if err := m.Accept(allowed[rng.IntN(len(allowed))]); err != nil {
			// Following the token may cost more than the mask did; then
			// the matcher gives up, and says so.
			if errors.Is(err, ErrAmbiguous) && errors.Is(m.Err(), ErrAmbiguous) {
				return
			}
			t.Fatalf("masked token refused: %v", err)
		}
		if m.IsTerminated() {
			return
		}
	}
}

func FuzzJSONSchema(f *testing.F) {
	for _, s := range testSchemas {
		f.Add(s)
	}
	f.Add(`{"type":["integer","array"],"items":{"$ref":"#"},"maxItems":2}`)
	f.Add(`{"additionalProperties":{"enum":[{"a":[]}]},"minLength":3}`)
	f.Fuzz(func(t *testing.T, s string) {
		g, err := FromJSONSchema(s)
		if err != nil {
			return
		}
		exercise(t, g)
	})
}

func FuzzGBNF(f *testing.F) {
	f.Add(arithmeticGBNF)
	f.Add(`root ::= "[" item ("," " "? item){0,4} "]"
item ::= "\"" [a-zA-Z_ ]{1,10} "\"" | ("yes" | "no")`)
	f.Add(`root ::= [^\n]+ "\n" | "\u00e9"* x
x ::= .? "z"{2,}`)
	f.Fuzz(func(t *testing.T, s string) {
		g, err := FromGBNF(s)
		if err != nil {
			return
		}
		exercise(t, g)
	})
}

func FuzzRegex(f *testing.F) {
	for _, p := range []string{`[a-z]+@[a-z]+\.(com|org)`, `(ab|a)*c{2,3}`, `(?i)x.y\d{1,3}$`, `^[^\x00-\x7f]?`} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, err := FromRegex(s)
		if err != nil {
			return
		}
		exercise(t, g)
	})
}
