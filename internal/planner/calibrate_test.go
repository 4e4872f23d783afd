package planner

import (
	"strings"
	"testing"
	"time"
)

// The fit recovers a model's figures from what the model predicts, and
// refuses measurements it cannot fit.
func TestCalibrationCapacity(t *testing.T) {
	want := Capacity{PrefillTokensPerSec: 20000, PrefillOverhead: 3 * time.Millisecond,
		DecodeStepBase: 400 * time.Microsecond, DecodeStepPerSeq: 90 * time.Microsecond, DecodeMaxBatch: 64, KVTokens: 8192}
	c := Calibration{DecodeMaxBatch: 64, KVTokens: 8192}
	for _, n := range []float64{32, 128, 512} {
		c.TTFT = append(c.TTFT, Point{n, want.PrefillTime(n)})
	}
	for _, b := range []float64{1, 4, 16} {
		c.TPOT = append(c.TPOT, Point{b, want.StepTime(b)})
	}
	got, err := c.Capacity()
	if err != nil {
		t.Fatal(err)
	}
	near := func(a, b float64) bool { return a > b*0.999 && a < b*1.001 }
	if !near(got.PrefillTokensPerSec, want.PrefillTokensPerSec) || !near(float64(got.PrefillOverhead), float64(want.PrefillOverhead)) ||
		!near(float64(got.DecodeStepBase), float64(want.DecodeStepBase)) || !near(float64(got.DecodeStepPerSeq), float64(want.DecodeStepPerSeq)) ||
		got.DecodeMaxBatch != 64 || got.KVTokens != 8192 || got.Handoff != 0 {
		t.Fatalf("fitted %+v, want %+v", got, want)
	}

	// A step time flat in the batch (noise sloping down) is all base.
	c.TPOT = []Point{{1, 500 * time.Microsecond}, {8, 480 * time.Microsecond}}
	if got, err := c.Capacity(); err != nil || got.DecodeStepPerSeq != 0 || got.DecodeStepBase != 490*time.Microsecond {
		t.Fatalf("flat decode: %+v %v", got, err)
	}

	for _, bad := range []struct {
		name string
		c    Calibration
		says string
	}{
		{"one prompt length", Calibration{TTFT: c.TTFT[:1], TPOT: c.TPOT, DecodeMaxBatch: 1, KVTokens: 1}, "at least 2"},
		{"one size twice", Calibration{TTFT: []Point{{64, time.Millisecond}, {64, 2 * time.Millisecond}}, TPOT: c.TPOT, DecodeMaxBatch: 1, KVTokens: 1}, "same size"},
		{"prefill not growing", Calibration{TTFT: []Point{{64, 2 * time.Millisecond}, {512, time.Millisecond}}, TPOT: c.TPOT, DecodeMaxBatch: 1, KVTokens: 1}, "does not grow"},
		{"no decode bounds", Calibration{TTFT: c.TTFT, TPOT: c.TPOT}, "batch and KV"},
	} {
		if _, err := bad.c.Capacity(); err == nil || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("%s: %v, want an error saying %q", bad.name, err, bad.says)
		}
	}
}
