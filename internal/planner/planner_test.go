package planner

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

var testCap = Capacity{
	PrefillTokensPerSec: 2000, PrefillOverhead: 5 * time.Millisecond, Handoff: 10 * time.Millisecond,
	DecodeStepBase: 10 * time.Millisecond, DecodeStepPerSeq: 500 * time.Microsecond,
	DecodeMaxBatch: 64, KVTokens: 65536,
}

func newTest(t *testing.T) *Planner {
	t.Helper()
	p, err := New(Config{SLO: SLO{TTFT: 500 * time.Millisecond, ITL: 50 * time.Millisecond}, Capacity: testCap,
		UpCooldown: time.Minute, DownCooldown: 3 * time.Minute, DownWindow: 5 * time.Minute, Max: 32})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// load is an observation of rps requests/s of 200-token prompts and
// 100-token answers, on the given fleet.
func load(rps float64, prefill, decode int) Observation {
	return Observation{Window: 30 * time.Second, PromptTokensPerSec: rps * 200, GenTokensPerSec: rps * 100,
		MeanPromptTokens: 200, MeanOutputTokens: 100, Prefill: prefill, Decode: decode}
}

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// More prompt tokens than one prefill worker can serve within the TTFT SLO
// asks for more prefill workers, and the model says so.
func TestPrefillScalesWithPromptLoad(t *testing.T) {
	p := newTest(t)
	d := p.Decide(t0, load(25, 1, 1)) // 5000 prompt tok/s at 2000 a worker
	if d.Prefill.Desired < 3 || d.Prefill.Reason != ReasonTTFTModel {
		t.Fatalf("prefill %v, want at least 3 for the TTFT model", d.Prefill)
	}
}

// TTFT over its SLO with requests queued at prefill scales prefill up even
// when the model (from a stale capacity) thinks the count enough.
func TestTTFTBreachByPrefillQueueScalesUp(t *testing.T) {
	p := newTest(t)
	o := load(1, 1, 1)
	if d := p.Decide(t0, o); d.Prefill.Desired != 1 {
		t.Fatalf("light load: prefill %v, want 1", d.Prefill)
	}
	o.TTFTP99, o.PrefillQueued = 2*time.Second, 6
	d := p.Decide(t0.Add(15*time.Second), o)
	if d.Prefill.Desired != 2 || d.Prefill.Reason != ReasonPrefillQueue {
		t.Fatalf("prefill %v, want 2 for prefill_queue", d.Prefill)
	}
	if d.Decode.Desired != 1 {
		t.Fatalf("decode %v moved for a prefill breach", d.Decode)
	}
	// TTFT over its SLO with nothing queued at prefill is not prefill's.
	p = newTest(t)
	o.PrefillQueued = 0
	if d := p.Decide(t0, o); d.Prefill.Desired != 1 {
		t.Fatalf("no prefill queue: prefill %v, want 1", d.Prefill)
	}
}

// ITL over its SLO scales decode up, and high output load does by the model.
func TestDecodeScalesUpOnITLBreach(t *testing.T) {
	p := newTest(t)
	o := load(1, 1, 1)
	o.ITLP99 = 80 * time.Millisecond
	d := p.Decide(t0, o)
	if d.Decode.Desired != 2 || d.Decode.Reason != ReasonITLBreach {
		t.Fatalf("decode %v, want 2 for itl_breach", d.Decode)
	}
	p = newTest(t)
	// 60 rps × 100 tokens = 6000 tok/s: one worker's batch cannot step
	// that fast within 40ms.
	if d := p.Decide(t0, load(60, 1, 1)); d.Decode.Desired < 2 || (d.Decode.Reason != ReasonITLModel && d.Decode.Reason != ReasonKVModel) {
		t.Fatalf("decode %v, want several by the model", d.Decode)
	}
}

// A scale-up within the up cool-down of the last waits.
func TestUpCooldownRespected(t *testing.T) {
	p := newTest(t)
	o := load(1, 1, 1)
	o.ITLP99 = 80 * time.Millisecond
	if d := p.Decide(t0, o); d.Decode.Desired != 2 {
		t.Fatalf("first breach: %v", d.Decode)
	}
	for _, dt := range []time.Duration{15 * time.Second, 30 * time.Second, 45 * time.Second} {
		d := p.Decide(t0.Add(dt), o)
		if d.Decode.Desired != 2 || d.Decode.Reason != ReasonCooldown {
			t.Fatalf("at +%s: %v, want 2 held by the cool-down", dt, d.Decode)
		}
	}
	if d := p.Decide(t0.Add(time.Minute), o); d.Decode.Desired != 3 {
		t.Fatalf("after the cool-down: %v, want 3", d.Decode)
	}
}

// Scale-down waits for the whole down window of low load; a burst inside
// it starts the window again.
func TestScaleDownOnlyAfterSustainedLowLoad(t *testing.T) {
	p := newTest(t)
	high := p.Decide(t0, load(25, 1, 1)).Prefill.Desired
	if high < 3 {
		t.Fatalf("high load: %d", high)
	}
	now := t0
	step := func(rps float64) Decision {
		now = now.Add(15 * time.Second)
		return p.Decide(now, load(rps, high, 1))
	}
	for range 12 { // 3 minutes of low load
		if d := step(1); d.Prefill.Desired != high {
			t.Fatalf("at %s: %v, scaled down before the window", now.Sub(t0), d.Prefill)
		}
	}
	step(25) // a burst: the window starts again
	for range 19 {
		if d := step(1); d.Prefill.Desired != high {
			t.Fatalf("at %s: %v, scaled down within the window after the burst", now.Sub(t0), d.Prefill)
		}
	}
	var d Decision
	for range 3 {
		if d = step(1); d.Prefill.Desired < high {
			break
		}
	}
	if d.Prefill.Desired >= high || d.Prefill.Reason != ReasonSustainedLow {
		t.Fatalf("after the window: %v, want fewer for sustained_low", d.Prefill)
	}
}

// Load that wanders ±10% around a step of the model does not flap: after
// the first scale-up nothing moves for an hour.
func TestNoFlappingUnderNoise(t *testing.T) {
	p := newTest(t)
	r := rand.New(rand.NewPCG(1, 2))
	// Find a rate at a step of the prefill model: where 1.0× asks for
	// one worker more than 0.9× does.
	rate := 1.0
	for ; rate < 100; rate += 0.25 {
		q := newTest(t)
		if q.Decide(t0, load(rate*0.9, 1, 1)).Prefill.Desired != newTest(t).Decide(t0, load(rate*1.1, 1, 1)).Prefill.Desired {
			break
		}
	}
	if rate >= 100 {
		t.Fatal("found no step of the prefill model")
	}
	changes := map[string]int{}
	last := map[string]int{}
	for i := range 240 {
		o := load(rate*(0.9+0.2*r.Float64()), last[Prefill], last[Decode])
		d := p.Decide(t0.Add(time.Duration(i)*15*time.Second), o)
		for _, rd := range []RoleDecision{d.Prefill, d.Decode} {
			if i > 0 && rd.Changed() {
				changes[rd.Role]++
				t.Logf("%s: %s", time.Duration(i)*15*time.Second, rd)
			}
			last[rd.Role] = rd.Desired
		}
	}
	for role, n := range changes {
		if n > 1 {
			t.Errorf("%s changed %d times in an hour of noisy flat load at %.2f rps", role, n, rate)
		}
	}
}

func TestWaitP99(t *testing.T) {
	// M/M/1 at ρ = 0.5: C = 0.5, P(W>t) = 0.5 e^{−0.5 t}: t = ln(50)/0.5.
	if w, want := waitP99(1, 0.5, 1), 7.824; w < want-0.01 || w > want+0.01 {
		t.Errorf("M/M/1 p99 wait %v, want %v", w, want)
	}
	if w := waitP99(4, 0.1, 1); w != 0 {
		t.Errorf("light load waits %v", w)
	}
	if w := waitP99(2, 3, 1); w <= 1e300 {
		t.Errorf("overload waits %v, want +Inf", w)
	}
}

func TestHistogramQuantile(t *testing.T) {
	h := Histogram{Bounds: []float64{0.1, 0.5, 1, math.Inf(1)}, Counts: []float64{50, 90, 100, 100}, Count: 100}
	for q, want := range map[float64]float64{0.5: 0.1, 0.7: 0.3, 0.95: 0.75, 0.99: 0.95} {
		if got := h.Quantile(q); math.Abs(got-want) > 1e-9 {
			t.Errorf("q%.2f = %v, want %v", q, got, want)
		}
	}
	prev := Histogram{Bounds: h.Bounds, Counts: []float64{50, 50, 50, 50}, Count: 50}
	if got := h.Sub(prev).Quantile(0.5); math.Abs(got-0.35) > 1e-9 { // 25th of 40 in (0.1, 0.5]
		t.Errorf("window median %v, want 0.35", got)
	}
	if (Histogram{}).Quantile(0.99) != 0 {
		t.Error("empty histogram has a quantile")
	}
}
