package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

// sampleFreq draws n tokens from logits under p and returns each id's
// frequency.
func sampleFreq(logits []float32, p Sampling, n int) []float64 {
	var s Sampler
	rng := rand.New(rand.NewPCG(7, 11))
	freq := make([]float64, len(logits))
	for range n {
		freq[s.Sample(logits, p, rng).ID]++
	}
	for i := range freq {
		freq[i] /= float64(n)
	}
	return freq
}

// expected is softmax(logits/temperature) restricted to keep and
// renormalised: what an exact sampler draws.
func expected(logits []float32, temperature float64, keep []bool) []float64 {
	out := make([]float64, len(logits))
	var sum float64
	for i, v := range logits {
		if keep[i] {
			out[i] = math.Exp(float64(v) / temperature)
			sum += out[i]
		}
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// checkDraws requires every token outside keep never drawn and each
// frequency within 6 standard errors of the exact probability.
func checkDraws(t *testing.T, name string, got, want []float64, keep []bool, n int) {
	t.Helper()
	for i := range got {
		if !keep[i] && got[i] > 0 {
			t.Errorf("%s: token %d is outside the kept set and was drawn (%.4f)", name, i, got[i])
			continue
		}
		if se := math.Sqrt(want[i]*(1-want[i])/float64(n)) + 1e-9; math.Abs(got[i]-want[i]) > 6*se+1e-3 {
			t.Errorf("%s: token %d drawn %.4f of the time, want %.4f", name, i, got[i], want[i])
		}
	}
}

// The sampler draws from exactly the distribution each control defines:
// temperature rescales, top_k keeps the k best, top_p the smallest prefix
// reaching p, min_p those at least min_p times the best; nothing outside is
// ever drawn, and the kept tokens keep their relative odds.
func TestSamplerDistribution(t *testing.T) {
	logits := []float32{3, 2.5, 2, 1, 0, -1}
	const n = 40000
	all := []bool{true, true, true, true, true, true}
	for _, temp := range []float64{0.5, 1, 2} {
		got := sampleFreq(logits, Sampling{Temperature: temp}, n)
		checkDraws(t, "temperature", got, expected(logits, temp, all), all, n)
	}
	top2 := []bool{true, true, false, false, false, false}
	checkDraws(t, "top_k 2", sampleFreq(logits, Sampling{Temperature: 1, TopK: 2}, n), expected(logits, 1, top2), top2, n)

	// At temperature 1 the probabilities are about .42 .25 .15 .06 .02 .01:
	// the nucleus of 0.6 is the first two, of 0.75 the first three.
	checkDraws(t, "top_p 0.6", sampleFreq(logits, Sampling{Temperature: 1, TopP: 0.6}, n), expected(logits, 1, top2), top2, n)
	top3 := []bool{true, true, true, false, false, false}
	checkDraws(t, "top_p 0.75", sampleFreq(logits, Sampling{Temperature: 1, TopP: 0.75}, n), expected(logits, 1, top3), top3, n)

	// min_p 0.3 keeps p >= 0.3 * p_max: e^-0.5 = .61 and e^-1 = .37 pass, e^-2 = .14 does not.
	checkDraws(t, "min_p 0.3", sampleFreq(logits, Sampling{Temperature: 1, MinP: 0.3}, n), expected(logits, 1, top3), top3, n)

	// Temperature 0 is greedy whatever else is set.
	if got := sampleFreq(logits, Sampling{TopP: 0.1, TopK: 3}, 100); got[0] != 1 {
		t.Errorf("temperature 0 drew %v, want token 0 always", got)
	}
}
