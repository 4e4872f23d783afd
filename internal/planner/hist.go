package planner

import "math"

// Histogram is a latency histogram as Prometheus exposes one: cumulative
// counts at upper bounds (seconds), the last bound +Inf or implied.
type Histogram struct {
	Bounds []float64
	Counts []float64 // cumulative: Counts[i] observations ≤ Bounds[i]
	Count  float64
}

// Sub is the window between prev and h, as rate() and increase() take it:
// the same bounds, counts less prev's. A reset (counts going down) gives h.
func (h Histogram) Sub(prev Histogram) Histogram {
	if len(prev.Counts) != len(h.Counts) || prev.Count > h.Count {
		return h
	}
	out := Histogram{Bounds: h.Bounds, Counts: make([]float64, len(h.Counts)), Count: h.Count - prev.Count}
	for i := range h.Counts {
		out.Counts[i] = h.Counts[i] - prev.Counts[i]
	}
	return out
}

// Add adds o's counts, whose bounds must be h's (the same metric on
// another worker); different bounds leave h as it is.
func (h *Histogram) Add(o Histogram) {
	if len(h.Bounds) == 0 {
		h.Bounds, h.Counts = o.Bounds, make([]float64, len(o.Counts))
	}
	if len(o.Counts) != len(h.Counts) {
		return
	}
	for i := range o.Counts {
		h.Counts[i] += o.Counts[i]
	}
	h.Count += o.Count
}

// Quantile is Prometheus' histogram_quantile: linear within the bucket
// that holds the q-th observation; 0 when empty; the highest finite bound
// when it falls in the +Inf bucket.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count <= 0 || len(h.Bounds) == 0 {
		return 0
	}
	rank := q * h.Count
	lower, below := 0.0, 0.0
	for i, ub := range h.Bounds {
		if h.Counts[i] >= rank {
			if math.IsInf(ub, 1) {
				return lower
			}
			in := h.Counts[i] - below
			if in <= 0 {
				return ub
			}
			return lower + (ub-lower)*(rank-below)/in
		}
		lower, below = ub, h.Counts[i]
	}
	return lower
}
