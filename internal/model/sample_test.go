package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestTopKOrder: topK (window selection for small k, radix sort for large
// k) orders ids by logit, highest first, ties by lower id, as a stable
// comparison sort does; with ties, ±0, infinities and negative values.
func TestTopKOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	var s Sampler
	for _, n := range []int{1, 7, 100, 32000} {
		for trial := 0; trial < 5; trial++ {
			logits := make([]float32, n)
			for i := range logits {
				switch rng.IntN(10) {
				case 0:
					logits[i] = float32(rng.IntN(5)) // ties
				case 1:
					logits[i] = float32(math.Copysign(0, -1))
				case 2:
					logits[i] = 0
				case 3:
					logits[i] = float32(math.Inf(2*rng.IntN(2) - 1))
				default:
					logits[i] = float32(rng.NormFloat64() * 10)
				}
			}
			want := make([]int32, n)
			for i := range want {
				want[i] = int32(i)
			}
			slices.SortStableFunc(want, func(a, b int32) int {
				switch {
				case logits[a] > logits[b]:
					return -1
				case logits[a] < logits[b]:
					return 1
				}
				return 0
			})
			for _, k := range []int{1, 5, n/8 + 1, n} {
				got := s.topK(logits, k)
				if !slices.Equal(got, want[:min(k, n)]) {
					t.Fatalf("n=%d k=%d: got %v..., want %v...", n, k, got[:min(k, 8)], want[:min(k, 8)])
				}
			}
		}
	}
}

// A sampled token's logprob is that of the raw logits, whatever the
// temperature, bias or truncation of the draw: the same as Score gives.
func TestSampledLogprobIsRaw(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 9))
	logits := normalLogits(rng, 5000, 3)
	var s Sampler
	for _, p := range []Sampling{
		{Temperature: 1},
		{Temperature: 0.7},
		{Temperature: 1, MinP: 0.05},
		{Temperature: 1, TopP: 0.9},
		{Temperature: 1, TopK: 20},
		{Temperature: 1, LogitBias: map[int32]float64{3: 5, 9: -2}},
		{},
	} {
		for range 20 {
			got := s.Sample(logits, p, rng)
			want := s.Score(logits, got.ID, 0)
			if got.Logprob != want.Logprob {
				t.Fatalf("%+v: token %d logprob %v, Score says %v", p, got.ID, got.Logprob, want.Logprob)
			}
		}
	}
}

// BenchmarkSample: one token from a 32K vocabulary at temperature 1 (the
// OpenAI default, no truncation), what each sequence of a decode step costs.
func BenchmarkSample(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := normalLogits(rng, 32000, 2)
	var s Sampler
	for _, p := range []Sampling{{Temperature: 1}, {Temperature: 0.8, TopK: 40, TopP: 0.95, MinP: 0.05}, {}} {
		b.Run(fmt.Sprintf("t%g-k%d-p%g", p.Temperature, p.TopK, p.TopP), func(b *testing.B) {
			for range b.N {
				s.Sample(logits, p, rng)
			}
		})
	}
}

// normalLogits is n logits drawn from a normal distribution of sd sd.
func normalLogits(rng *rand.Rand, n int, sd float64) []float32 {
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * sd)
	}
	return logits
}
