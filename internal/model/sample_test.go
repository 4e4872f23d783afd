package model

import (
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
