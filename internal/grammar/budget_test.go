package grammar

import (
	"errors"
	"testing"
)

// A grammar whose every position is a state of its own (a long bounded
// repetition) keeps a context mask per position it meets; past the budget
// of context bytes the matcher gives up with ErrTooComplex, allowing only
// the end from then on, instead of growing without bound. Under the budget
// the same grammar is followed.
func TestTooManyStatesGivesUp(t *testing.T) {
	tok := loadTok(t, "stories260K")
	follow := func(budget int) (accepted int, err error) {
		defer func(b int) { contextBudget = b }(contextBudget)
		contextBudget = budget
		g, err := FromRegex(`[a-z]{300}`)
		if err != nil {
			t.Fatal(err)
		}
		c := mustCompile(t, g, tok)
		m := c.NewMatcher()
		mask := make([]uint64, c.MaskWords())
		a, ok := tok.TokenID("a") // one letter, so each token is one position
		if !ok {
			t.Fatal("no token for \"a\"")
		}
		for range 200 {
			m.FillMask(mask)
			if m.Err() != nil {
				return accepted, m.Err()
			}
			if mask[a>>6]&(1<<(a&63)) == 0 {
				t.Fatalf("after %d letters, %q is not allowed", accepted, "a")
			}
			if err := m.Accept(a); err != nil {
				t.Fatal(err)
			}
			accepted++
		}
		return accepted, nil
	}
	if n, err := follow(64 << 20); err != nil || n != 200 {
		t.Fatalf("under the default budget: %d letters, %v", n, err)
	}
	n, err := follow(16 << 10)
	if !errors.Is(err, ErrTooComplex) || n >= 200 {
		t.Fatalf("a 16 KiB budget: %d letters, err %v; want ErrTooComplex before 200", n, err)
	}
}
