package model

import (
	"math/rand/v2"
	"testing"
)

// chiSquare001 is the chi-square critical value at p = 0.001 by degrees of
// freedom: a correct sampler fails the test once in a thousand seeds.
var chiSquare001 = map[int]float64{1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}

// chiSquare is Pearson's statistic of counts against probabilities want
// over the tokens want gives mass to, with its degrees of freedom.
func chiSquare(counts []int, want []float64, n int) (float64, int) {
	var x float64
	df := -1
	for i, w := range want {
		if w == 0 {
			continue
		}
		e := w * float64(n)
		d := float64(counts[i]) - e
		x += d * d / e
		df++
	}
	return x, df
}

// Verify under sampling returns tokens distributed exactly as the target
// distribution, whatever the draft: the likely token, an unlikely one, one
// outside top-k. Accepting the draft with probability q(d) and otherwise
// drawing from q without d gives q again; accepting it always (or drawing
// the rejection from q itself) would not, and the chi-square test sees it.
func TestVerifyKeepsTheTargetDistribution(t *testing.T) {
	logits := []float32{3, 2.5, 2, 1, 0, -1}
	const n = 40000
	all := []bool{true, true, true, true, true, true}
	top3 := []bool{true, true, true, false, false, false}
	cases := []struct {
		name  string
		p     Sampling
		keep  []bool
		draft int32
	}{
		{"likely draft", Sampling{Temperature: 1}, all, 0},
		{"unlikely draft", Sampling{Temperature: 0.7}, all, 4},
		{"draft outside top_k", Sampling{Temperature: 1, TopK: 3}, top3, 5},
		{"draft inside top_p", Sampling{Temperature: 1, TopP: 0.75}, top3, 2},
	}
	for seed, c := range cases {
		var s Sampler
		rng := rand.New(rand.NewPCG(uint64(seed+1), 99))
		counts := make([]int, len(logits))
		accepts := 0
		for range n {
			tok, ok := s.Verify(logits, c.p, rng, History{}, c.draft)
			counts[tok.ID]++
			if ok {
				accepts++
				if tok.ID != c.draft {
					t.Fatalf("%s: accepted but returned %d", c.name, tok.ID)
				}
			}
		}
		want := expected(logits, c.p.Temperature, c.keep)
		x, df := chiSquare(counts, want, n)
		if x > chiSquare001[df] {
			t.Errorf("%s: chi-square %.1f with %d degrees of freedom (limit %.1f); counts %v, want %v", c.name, x, df, chiSquare001[df], counts, want)
		}
		// The accept rate is q(d) itself.
		if got, q := float64(accepts)/n, want[c.draft]; got < q-0.01 || got > q+0.01 {
			t.Errorf("%s: accepted %.3f of drafts, want q(d) = %.3f", c.name, got, q)
		}
	}
}

// Greedy verification accepts exactly the argmax and returns it either way.
func TestVerifyGreedy(t *testing.T) {
	var s Sampler
	logits := []float32{1, 4, 2}
	if tok, ok := s.Verify(logits, Sampling{}, nil, History{}, 1); !ok || tok.ID != 1 {
		t.Fatalf("argmax draft: %d %v", tok.ID, ok)
	}
	if tok, ok := s.Verify(logits, Sampling{}, nil, History{}, 2); ok || tok.ID != 1 {
		t.Fatalf("other draft: %d %v", tok.ID, ok)
	}
	// A ban (min_tokens) moves the argmax, and the verdict with it.
	if tok, ok := s.Verify(logits, Sampling{}, nil, History{Ban: []int32{1}}, 1); ok || tok.ID != 2 {
		t.Fatalf("banned draft: %d %v", tok.ID, ok)
	}
}
