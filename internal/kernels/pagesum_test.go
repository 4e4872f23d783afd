package kernels

import (
	"math/rand/v2"
	"testing"
)

// PageSum changes with any unit changed, any two units swapped, and a
// page cut short, and does not depend on the order its terms are added in.
func TestPageSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	page := make([]byte, 4096)
	for i := range page {
		page[i] = byte(rng.Uint32())
	}
	base := PageSum(page)
	for range 200 {
		p := append([]byte(nil), page...)
		p[rng.IntN(len(p))] ^= 1 << rng.IntN(8)
		if PageSum(p) == base {
			t.Fatal("a flipped bit kept the sum")
		}
	}
	swapped := append([]byte(nil), page...)
	swapped[0], swapped[1], swapped[2], swapped[3] = page[2], page[3], page[0], page[1]
	if page[0] != page[2] || page[1] != page[3] {
		if PageSum(swapped) == base {
			t.Fatal("two units swapped kept the sum")
		}
	}
	zeros := make([]byte, 64)
	if PageSum(zeros) == PageSum(zeros[:62]) {
		t.Fatal("a page of zeros cut short by one unit kept the sum")
	}
	// Any order: the terms summed backwards give the same number.
	var back uint64
	for i := len(page)/2 - 1; i >= 0; i-- {
		back += SumTerm(uint64(i), uint16(page[2*i])|uint16(page[2*i+1])<<8)
	}
	if back+uint64(len(page)/2)*PageSumUnitWeight != base {
		t.Fatal("the sum depends on the order of its terms")
	}
}
