// Package fleetsim is a deterministic discrete-event model of a baton
// fleet: a router, prefill workers serving prompts one after another, and
// decode workers stepping their batches, with KV reserved per request as
// decode does. It replays a trace of requests against a fixed fleet or one
// that internal/planner resizes, workers it adds starting after a delay,
// and reports how many requests met their SLOs and the worker-hours spent.
package fleetsim

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Request is one request of a trace.
type Request struct {
	Arrival time.Duration // since the trace's start
	Prompt  int           // prompt tokens
	Output  int           // tokens to generate (max_tokens, with ignore_eos)
}

// Shape is an arrival process a trace is generated from.
type Shape string

const (
	// Poisson arrives at Rate per second throughout.
	Poisson Shape = "poisson"
	// Burst arrives at Rate, with bursts of 4×Rate for a tenth of each
	// tenth of the trace.
	Burst Shape = "burst"
	// Day is a day in Duration: a cosine from a night of Rate/8 to an
	// afternoon peak of Rate, and a lunchtime bump.
	Day Shape = "day"
)

// Gen says how to generate a trace.
type Gen struct {
	Shape    Shape
	Duration time.Duration
	Rate     float64 // requests/s: the mean (poisson), base (burst), peak (day)
	// Prompt and output lengths are log-normal around their means with
	// the given coefficient of variation, cut to [1, Max].
	PromptMean, OutputMean float64
	CV                     float64
	PromptMax, OutputMax   int
	Seed                   uint64
}

// rate is the arrival rate at t.
func (g Gen) rate(t time.Duration) float64 {
	x := t.Seconds() / g.Duration.Seconds()
	switch g.Shape {
	case Burst:
		if math.Mod(x*10, 1) < 0.1 {
			return 4 * g.Rate
		}
		return g.Rate
	case Day:
		// Trough at one sixth (small hours), peak at two thirds
		// (afternoon), and a bump at lunch.
		night := g.Rate / 8
		c := 0.5 + 0.5*math.Cos(2*math.Pi*(x-2.0/3))
		lunch := 0.2 * math.Exp(-math.Pow((x-0.45)/0.03, 2))
		return night + (g.Rate-night)*math.Min(1, 0.9*c+lunch)
	default:
		return g.Rate
	}
}

// maxRate bounds rate over the trace, for thinning.
func (g Gen) maxRate() float64 {
	if g.Shape == Burst {
		return 4 * g.Rate
	}
	return g.Rate
}

// Generate makes the trace: a non-homogeneous Poisson process by thinning,
// so the same Gen always gives the same requests.
func Generate(g Gen) ([]Request, error) {
	switch g.Shape {
	case Poisson, Burst, Day:
	default:
		return nil, fmt.Errorf("fleetsim: unknown trace shape %q (poisson, burst, day)", g.Shape)
	}
	if g.Duration <= 0 || g.Rate <= 0 || g.PromptMean < 1 || g.OutputMean < 1 {
		return nil, fmt.Errorf("fleetsim: duration, rate and mean lengths must be positive")
	}
	if g.PromptMax <= 0 {
		g.PromptMax = 1 << 20
	}
	if g.OutputMax <= 0 {
		g.OutputMax = 1 << 20
	}
	r := rand.New(rand.NewPCG(g.Seed, 0x6261746f6e))
	length := func(mean float64, most int) int {
		if g.CV <= 0 {
			return min(most, max(1, int(math.Round(mean))))
		}
		s2 := math.Log(1 + g.CV*g.CV)
		v := math.Exp(math.Log(mean) - s2/2 + math.Sqrt(s2)*r.NormFloat64())
		return min(most, max(1, int(math.Round(v))))
	}
	var out []Request
	peak := g.maxRate()
	for t := 0.0; ; {
		t += r.ExpFloat64() / peak
		at := time.Duration(t * float64(time.Second))
		if at >= g.Duration {
			return out, nil
		}
		if r.Float64()*peak > g.rate(at) {
			continue
		}
		out = append(out, Request{Arrival: at, Prompt: length(g.PromptMean, g.PromptMax), Output: length(g.OutputMean, g.OutputMax)})
	}
}

// maxTraceTokens bounds one request's lengths in a trace file.
const maxTraceTokens = 1 << 24

// ParseTrace reads a trace file: CSV lines of arrival seconds, prompt
// tokens and output tokens; blank lines, lines starting with # and a
// header line (arrival,...) are skipped. Requests come back in arrival
// order.
func ParseTrace(r io.Reader) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") || (line == 1 && strings.HasPrefix(strings.ToLower(text), "arrival")) {
			continue
		}
		f := strings.Split(text, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("trace line %d: want arrival_s,prompt_tokens,output_tokens, got %d fields", line, len(f))
		}
		at, err := strconv.ParseFloat(strings.TrimSpace(f[0]), 64)
		if err != nil || math.IsNaN(at) || at < 0 || at > 1e7 {
			return nil, fmt.Errorf("trace line %d: arrival %q is not a time in seconds from 0 to 1e7", line, f[0])
		}
		var n [2]int
		for i, s := range f[1:] {
			v, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || v < 1 || v > maxTraceTokens {
				return nil, fmt.Errorf("trace line %d: token count %q is not from 1 to %d", line, s, maxTraceTokens)
			}
			n[i] = v
		}
		out = append(out, Request{Arrival: time.Duration(at * float64(time.Second)), Prompt: n[0], Output: n[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	return out, nil
}

// WriteTrace writes requests in ParseTrace's format.
func WriteTrace(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintln(bw, "arrival_s,prompt_tokens,output_tokens")
	for _, r := range reqs {
		fmt.Fprintf(bw, "%.6f,%d,%d\n", r.Arrival.Seconds(), r.Prompt, r.Output)
	}
	return bw.Flush()
}
