package model

import (
	"math/rand/v2"
	"testing"
)

// A temperature too small to divide by picks the argmax: at 1e-320 the
// scaled logits overflowed to infinities and NaN, and the draw fell on
// token 0.
func TestTinyTemperatureSamplesGreedily(t *testing.T) {
	logits := []float32{-1, 0.5, 3, 2.9, -7}
	var s Sampler
	rng := rand.New(rand.NewPCG(1, 2))
	for _, temp := range []float64{1e-320, 5e-324, 1e-9, 1e-6} {
		p := Sampling{Temperature: temp, TopP: 1}
		if p.Draws() {
			t.Errorf("temperature %g draws", temp)
		}
		for range 20 {
			if got := s.Sample(logits, p, rng); got.ID != 2 {
				t.Fatalf("temperature %g: token %d, want the argmax 2", temp, got.ID)
			}
		}
		p.TopK = 3
		if got, ok := s.Verify(logits, p, rng, History{}, 2); got.ID != 2 || !ok {
			t.Errorf("temperature %g: Verify gave %d (accepted %v)", temp, got.ID, ok)
		}
	}
	if !(Sampling{Temperature: SamplingEps}).Draws() {
		t.Error("the smallest temperature that samples does not draw")
	}
}
