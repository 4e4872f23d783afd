package metrics

import (
	"regexp"
	"strconv"
	"strings"
)

var sampleLine = regexp.MustCompile(`(?m)^(baton_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+|NaN)$`)

// modelLabel is the model_name label a process puts on every series: one
// value per process, so it tells callers nothing they could ask by.
var modelLabel = regexp.MustCompile(`model_name="(?:[^"\\]|\\.)*",?`)

// ParseText reads the baton_ samples of a Prometheus text exposition (what
// /metrics serves). Each series is keyed by its name plus labels as printed,
// less model_name, and each bare name holds the sum of its series, so
// callers can ask for either one series or a metric's total.
func ParseText(text string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range sampleLine.FindAllStringSubmatch(text, -1) {
		v, _ := strconv.ParseFloat(m[3], 64)
		if labels := strings.TrimSuffix(modelLabel.ReplaceAllString(m[2], ""), ",}"); labels != "" && labels != "{}" {
			if !strings.HasSuffix(labels, "}") {
				labels += "}"
			}
			out[m[1]+labels] += v
		}
		out[m[1]] += v
	}
	return out
}
