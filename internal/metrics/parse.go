package metrics

import (
	"regexp"
	"strconv"
)

var sampleLine = regexp.MustCompile(`(?m)^(baton_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+|NaN)$`)

// ParseText reads the baton_ samples of a Prometheus text exposition (what
// /metrics serves). Each series is keyed by its name plus labels as printed,
// and each bare name holds the sum of its series, so callers can ask for
// either one series or a metric's total.
func ParseText(text string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range sampleLine.FindAllStringSubmatch(text, -1) {
		v, _ := strconv.ParseFloat(m[3], 64)
		if m[2] != "" {
			out[m[1]+m[2]] += v
		}
		out[m[1]] += v
	}
	return out
}
