package planner

import (
	"errors"
	"fmt"
	"time"
)

// A Point is one measurement for a calibration: X what was varied (prompt
// tokens, or sequences in a decode batch), Y the time it took.
type Point struct {
	X float64
	Y time.Duration
}

// Calibration is what `baton bench calibrate` measured on a running
// fleet: the time to first token of one request alone at several prompt
// lengths, and the time per output token with several requests decoding
// at once.
type Calibration struct {
	// TTFT by prompt tokens, one request at a time: prefill, the
	// handoff and the first token's way back.
	TTFT []Point
	// TPOT by requests in flight: a decode step's time at that batch.
	TPOT []Point
	// DecodeMaxBatch and KVTokens are the decode worker's bounds, which
	// the measurements do not show.
	DecodeMaxBatch, KVTokens int
}

// Capacity fits the planner's model to the measurements: a straight line
// through each set (least squares). The TTFT line's slope is a prefill
// worker's time per prompt token and its intercept what a request costs
// besides (the handoff included: a client cannot tell them apart, so
// Handoff is zero); the TPOT line's intercept and slope are a decode
// step's base time and its time per sequence.
func (c Calibration) Capacity() (Capacity, error) {
	pa, pb, err := fitLine(c.TTFT)
	if err != nil {
		return Capacity{}, fmt.Errorf("planner: prefill: %w", err)
	}
	if pb <= 0 {
		return Capacity{}, errors.New("planner: prefill: the time to first token does not grow with the prompt; measure longer prompts")
	}
	da, db, err := fitLine(c.TPOT)
	if err != nil {
		return Capacity{}, fmt.Errorf("planner: decode: %w", err)
	}
	// A line that crosses zero below one sequence is noise on a flat
	// step time: the step is then all base.
	if db < 0 {
		da, db = mean(c.TPOT), 0
	}
	if da <= 0 {
		da = float64(time.Microsecond)
	}
	capa := Capacity{
		PrefillTokensPerSec: float64(time.Second) / pb,
		PrefillOverhead:     time.Duration(max(pa, 0)),
		DecodeStepBase:      time.Duration(da),
		DecodeStepPerSeq:    time.Duration(db),
		DecodeMaxBatch:      c.DecodeMaxBatch,
		KVTokens:            c.KVTokens,
	}
	return capa, capa.check()
}

// fitLine is the least-squares line y = a + b·x through ps (y in
// nanoseconds); it needs two distinct x.
func fitLine(ps []Point) (a, b float64, err error) {
	if len(ps) < 2 {
		return 0, 0, fmt.Errorf("%d measurements, want at least 2", len(ps))
	}
	var sx, sy, sxx, sxy float64
	for _, p := range ps {
		x, y := p.X, float64(p.Y)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	n := float64(len(ps))
	d := n*sxx - sx*sx
	if d == 0 {
		return 0, 0, errors.New("every measurement at the same size; vary it")
	}
	b = (n*sxy - sx*sy) / d
	return (sy - b*sx) / n, b, nil
}

func mean(ps []Point) float64 {
	var s float64
	for _, p := range ps {
		s += float64(p.Y)
	}
	return s / float64(len(ps))
}
