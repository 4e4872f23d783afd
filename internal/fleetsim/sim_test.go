package fleetsim

import (
	"reflect"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/planner"
)

var testCap = planner.Capacity{
	PrefillTokensPerSec: 20000, PrefillOverhead: time.Millisecond, Handoff: 2 * time.Millisecond,
	DecodeStepBase: 5 * time.Millisecond, DecodeStepPerSeq: 200 * time.Microsecond,
	DecodeMaxBatch: 64, KVTokens: 32768,
}

var testSLO = planner.SLO{TTFT: 100 * time.Millisecond, ITL: 15 * time.Millisecond}

func trace(t *testing.T, shape Shape, seed uint64) []Request {
	t.Helper()
	reqs, err := Generate(Gen{Shape: shape, Duration: 10 * time.Minute, Rate: 60, PromptMean: 200, OutputMean: 60, CV: 0.5,
		PromptMax: 1024, OutputMax: 256, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// The same seed gives the same trace and the same result, planner and all.
func TestDeterministic(t *testing.T) {
	a, b := trace(t, Day, 7), trace(t, Day, 7)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("same seed, different traces")
	}
	if reflect.DeepEqual(a, trace(t, Day, 8)) {
		t.Fatal("different seeds, same trace")
	}
	cfg := Config{Capacity: testCap, SLO: testSLO, Prefill: 1, Decode: 1, StartupDelay: 30 * time.Second,
		Planner: &planner.Config{UpCooldown: 30 * time.Second, DownWindow: 2 * time.Minute, DownCooldown: time.Minute}}
	r1, err := Run(cfg, a)
	if err != nil {
		t.Fatal(err)
	}
	r2, _ := Run(cfg, b)
	if !reflect.DeepEqual(r1, r2) {
		t.Fatalf("same input, different results:\n%+v\n%+v", r1, r2)
	}
	if r1.Requests != len(a) || len(r1.Changes) == 0 {
		t.Fatalf("%d requests of %d, %d changes: the planner never acted", r1.Requests, len(a), len(r1.Changes))
	}
}

// More workers never make the SLO attainment worse on the same trace; more
// decode workers never make ITL worse, more prefill workers never TTFT.
func TestMoreWorkersNotWorse(t *testing.T) {
	reqs := trace(t, Burst, 3)
	fleets := [][2]int{{1, 1}, {1, 2}, {2, 2}, {2, 4}, {4, 4}, {4, 8}, {6, 8}}
	var prev Result
	for i, f := range fleets {
		r, err := Run(Config{Capacity: testCap, SLO: testSLO, Prefill: f[0], Decode: f[1]}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d:%d attainment %.4f TTFT p99 %.1fms ITL p99 %.2fms hours %.2f", f[0], f[1], r.Attainment(), 1000*r.TTFTP99, 1000*r.ITLP99, r.WorkerHours)
		if i > 0 && r.Attainment() < prev.Attainment() {
			t.Errorf("%d:%d meets the SLOs for fewer requests than the smaller fleet: %.4f < %.4f", f[0], f[1], r.Attainment(), prev.Attainment())
		}
		if i > 0 && f[1] > fleets[i-1][1] && r.ITLP99 > prev.ITLP99*1.001 {
			t.Errorf("%d:%d: more decode workers, ITL p99 %v > %v", f[0], f[1], r.ITLP99, prev.ITLP99)
		}
		if r.WorkerHours <= prev.WorkerHours {
			t.Errorf("%d:%d costs %.3f worker-hours, no more than the smaller fleet's %.3f", f[0], f[1], r.WorkerHours, prev.WorkerHours)
		}
		prev = r
	}
	if prev.Attainment() < 0.99 {
		t.Errorf("6:8 meets the SLOs for %.3f of requests only", prev.Attainment())
	}
}

// An overloaded single pair misses, and the planner grows the fleet to meet
// the SLOs on the same trace.
func TestPlannerMeetsWhatOnePairMisses(t *testing.T) {
	reqs := trace(t, Poisson, 5)
	fixed, _ := Run(Config{Capacity: testCap, SLO: testSLO, Prefill: 1, Decode: 1}, reqs)
	planned, err := Run(Config{Capacity: testCap, SLO: testSLO, Prefill: 1, Decode: 1, StartupDelay: 10 * time.Second,
		Planner: &planner.Config{}}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("1:1 %.4f, planner %.4f (max %d:%d, %.2f worker-hours)", fixed.Attainment(), planned.Attainment(), planned.MaxPrefill, planned.MaxDecode, planned.WorkerHours)
	if fixed.Attainment() > 0.9 {
		t.Fatalf("the trace does not overload one pair (%.3f)", fixed.Attainment())
	}
	if planned.Attainment() < 0.9 || planned.MaxDecode < 2 {
		t.Fatalf("planner: %.3f with at most %d decode workers", planned.Attainment(), planned.MaxDecode)
	}
}
