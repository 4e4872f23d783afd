package expsum

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// sumRef is Sum as its comment defines it, in Go over ExpNeg.
func sumRef(probs []float64, logits []float32, top, inv float64) float64 {
	var s [8]float64
	for i, v := range logits {
		e := ExpNeg((float64(v) - top) * inv)
		if probs != nil {
			probs[i] = e
		}
		s[i%8] += e
	}
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))
}

// paths runs f once per path this CPU has, widest first.
func paths(t *testing.T, f func(t *testing.T)) {
	levels := map[string]int{"avx512": 2, "avx2": 1, "scalar": 0}
	defer limit(2)
	for level := levels[SIMD()]; level >= 0; level-- {
		limit(level)
		t.Run(SIMD(), f)
	}
}

// Every path gives ExpNeg's exponentials and the defined sum bit for bit,
// at every length around the vector widths, at temperatures that make
// arguments past -708, with -Inf logits (banned tokens) and NaN.
func TestSumIsExpNegBitForBit(t *testing.T) {
	if SIMD() == "scalar" {
		t.Log("no AVX2 on this CPU (or built with -DBK_NO_SIMD): only the scalar path is tested")
	}
	paths(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(3, 4))
		for _, n := range []int{1, 3, 7, 8, 9, 15, 16, 17, 31, 100, 32000} {
			for _, inv := range []float64{1, 1 / 0.7, 50} {
				logits := make([]float32, n)
				for i := range logits {
					logits[i] = float32(rng.NormFloat64() * 8)
				}
				logits[rng.IntN(n)] = float32(math.Inf(-1))
				if n > 2 {
					logits[rng.IntN(n)] = float32(math.NaN())
				}
				top := 0.0
				for _, v := range logits {
					if v == v {
						top = max(top, float64(v))
					}
				}
				want := make([]float64, n)
				wantSum := sumRef(want, logits, top, inv)
				got := make([]float64, n)
				for i := range got {
					got[i] = -1 // every element must be written
				}
				gotSum := Sum(got, logits, top, inv)
				for i := range got {
					if math.Float64bits(got[i]) != math.Float64bits(want[i]) {
						t.Fatalf("n %d inv %v: probs[%d] = %v (logit %v), want %v", n, inv, i, got[i], logits[i], want[i])
					}
				}
				if math.Float64bits(gotSum) != math.Float64bits(wantSum) {
					t.Fatalf("n %d inv %v: sum %v, want %v", n, inv, gotSum, wantSum)
				}
				if s := Sum(nil, logits, top, inv); math.Float64bits(s) != math.Float64bits(wantSum) {
					t.Fatalf("n %d inv %v: sum without probs %v, want %v", n, inv, s, wantSum)
				}
			}
		}
	})
}

// Max on every path: the largest logit wherever it lies (tails included),
// -Inf only when all are, and NaN wherever a NaN lies.
func TestMax(t *testing.T) {
	paths(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(5, 6))
		for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 33, 1000} {
			logits := make([]float32, n)
			for i := range logits {
				logits[i] = float32(-1 - rng.Float64()*100)
			}
			for at := range n {
				old := logits[at]
				logits[at] = 5
				if got := Max(logits); got != 5 {
					t.Fatalf("n %d: max %v, want 5 at %d", n, got, at)
				}
				logits[at] = float32(math.NaN())
				if got := Max(logits); got == got {
					t.Fatalf("n %d: max %v with NaN at %d", n, got, at)
				}
				logits[at] = old
			}
			inf := make([]float32, n)
			for i := range inf {
				inf[i] = float32(math.Inf(-1))
			}
			if got := Max(inf); !math.IsInf(float64(got), -1) {
				t.Fatalf("n %d: max of -Inf %v", n, got)
			}
		}
	})
}

// ExpNeg agrees with math.Exp to 1e-11 relative over the arguments a
// shifted softmax gives it, and is 0 where the exponential is subnormal or
// the argument -Inf or NaN.
func TestExpNeg(t *testing.T) {
	for i := 0; i < 7080000; i++ {
		x := -float64(i) / 10000
		want := math.Exp(x)
		if got := ExpNeg(x); math.Abs(got-want) > 1e-11*want {
			t.Fatalf("ExpNeg(%v) = %v, math.Exp %v", x, got, want)
		}
	}
	for _, x := range []float64{-708, -709, -800, math.Inf(-1), math.NaN()} {
		if got := ExpNeg(x); got != 0 {
			t.Errorf("ExpNeg(%v) = %v, want 0", x, got)
		}
	}
}

func BenchmarkSum(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 32000)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 2)
	}
	probs := make([]float64, len(logits))
	b.Run("simd", func(b *testing.B) {
		for b.Loop() {
			Sum(probs, logits, 10, 1)
		}
	})
	b.Run("go", func(b *testing.B) {
		for b.Loop() {
			sumRef(probs, logits, 10, 1)
		}
	})
}

// BATON_CPU_AVX512=0 keeps the AVX2 path, as it keeps the cpu backend's
// kernels on AVX2 (to measure what a CPU without AVX-512 would run). The
// path is chosen at package init, so a child process checks it.
func TestAVX512SwitchKeepsAVX2(t *testing.T) {
	if os.Getenv("EXPSUM_TEST_CHILD") == "1" {
		fmt.Printf("path=%s\n", SIMD())
		return
	}
	if SIMD() != "avx512" {
		t.Skipf("the widest path here is %s, not avx512", SIMD())
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestAVX512SwitchKeepsAVX2$")
	cmd.Env = append(os.Environ(), "EXPSUM_TEST_CHILD=1", "BATON_CPU_AVX512=0")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "path=avx2\n") {
		t.Fatalf("with BATON_CPU_AVX512=0: %v\n%s", err, out)
	}
}
