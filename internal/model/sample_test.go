package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
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

// expNeg agrees with math.Exp to 1e-11 relative over the arguments a
// shifted softmax gives it, and is 0 where the exponential is subnormal or
// the argument -Inf.
func TestExpNeg(t *testing.T) {
	for i := 0; i < 7080000; i++ {
		x := -float64(i) / 10000
		want := math.Exp(x)
		if got := expNeg(x); math.Abs(got-want) > 1e-11*want {
			t.Fatalf("expNeg(%v) = %v, math.Exp %v", x, got, want)
		}
	}
	for _, x := range []float64{-709, -800, math.Inf(-1)} {
		if got := expNeg(x); got != 0 {
			t.Errorf("expNeg(%v) = %v, want 0", x, got)
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

// expSum's result is the same bit for bit however many goroutines ran its
// spans, so a seeded draw does not depend on the machine's cores.
func TestExpSumIndependentOfProcs(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	logits := normalLogits(rng, 3*expSpan+123, 4)
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	var want float64
	for i, procs := range []int{1, 2, 3, 8} {
		runtime.GOMAXPROCS(procs)
		probs := make([]float64, len(logits))
		got := expSum(probs, logits, 10, 1/0.7)
		if i == 0 {
			want = got
		}
		if got != want {
			t.Fatalf("GOMAXPROCS %d: sum %v, with 1: %v", procs, got, want)
		}
		for j := range probs {
			if e := expNeg((float64(logits[j]) - 10) * (1 / 0.7)); probs[j] != e {
				t.Fatalf("probs[%d] = %v, want %v", j, probs[j], e)
			}
		}
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
