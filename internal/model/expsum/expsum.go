// Package expsum computes the exponentials of a softmax over a vocabulary
// and their sum, in C with AVX-512 or AVX2 where the CPU has them: the
// sampler needs one such pass per sampled token, and in Go it was 6% of
// a 32-stream serving profile of a 32K-vocabulary model.
//
// Each exponential is bit for bit the sampler's scalar one (the same
// polynomial, the same operation order, no fused multiply-add), and the sum
// is taken in a fixed order, so a seeded draw is the same on every CPU.
package expsum

/*
#cgo CFLAGS: -O3 -std=gnu11
#include "expsum.h"
*/
import "C"

import (
	"math"
	"os"
	"unsafe"
)

// The path is chosen once, here: es_simd's first call sets it, and two
// goroutines sampling at once must not both be the first.
// BATON_CPU_AVX512=0 keeps AVX2, as it does for the cpu backend's kernels.
func init() {
	C.es_simd()
	if os.Getenv("BATON_CPU_AVX512") == "0" {
		limit(1)
	}
}

// Sum writes exp((v-top)·inv) of each logit v into probs (unless nil; it
// must then be as long as logits) and returns their sum. Arguments at or
// below -708, and NaN, give 0. Logit i is added to partial sum i mod 8 in
// increasing i, and the eight partials are added as
// ((s0+s1)+(s2+s3))+((s4+s5)+(s6+s7)).
func Sum(probs []float64, logits []float32, top, inv float64) float64 {
	if len(logits) == 0 {
		return 0
	}
	var p *C.double
	if probs != nil {
		if len(probs) < len(logits) {
			panic("expsum: probs shorter than logits")
		}
		p = (*C.double)(unsafe.Pointer(&probs[0]))
	}
	return float64(C.es_sum(p, (*C.float)(unsafe.Pointer(&logits[0])), C.int64_t(len(logits)), C.double(top), C.double(inv)))
}

// Max is the largest of logits (at least one), or NaN if one is NaN, as
// Go's max over them (a zero's sign aside).
func Max(logits []float32) float32 {
	return float32(C.es_max((*C.float)(unsafe.Pointer(&logits[0])), C.int64_t(len(logits))))
}

// SIMD names the widest path this CPU takes: "avx512", "avx2" or "scalar".
func SIMD() string {
	switch C.es_simd() {
	case 2:
		return "avx512"
	case 1:
		return "avx2"
	}
	return "scalar"
}

// limit caps the path at level (2 AVX-512, 1 AVX2, 0 scalar; a higher
// level than the CPU has is the CPU's): tests run every path on one CPU.
func limit(level int) { C.es_limit(C.int(level)) }

// ExpNeg is math.Exp for the x <= 0 (and NaN-free) arguments of a softmax
// shifted by its maximum, about twice as fast: a degree-9 polynomial on
// x - k·ln2 (|.| <= ln2/2), relative error below 1e-11, with 0 for
// arguments whose exponential would be subnormal. Sum computes each of its
// exponentials exactly so.
func ExpNeg(x float64) float64 {
	const (
		log2e = 1.4426950408889634
		ln2hi = 6.93147180369123816490e-01
		ln2lo = 1.90821492927058770002e-10
		magic = 6755399441055744.0 // 1.5·2^52: adding it rounds to an integer
	)
	if !(x > -708) { // also -Inf
		return 0
	}
	kf := x*log2e + magic
	ki := int64(math.Float64bits(kf)) - int64(math.Float64bits(magic))
	k := kf - magic
	r := x - k*ln2hi - k*ln2lo
	q := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720+r*(1.0/5040+r*(1.0/40320+r*(1.0/362880)))))))))
	return math.Float64frombits(math.Float64bits(q) + uint64(ki)<<52)
}
