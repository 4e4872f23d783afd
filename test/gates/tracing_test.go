package gates

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// The failure paths the gates drive, traced: each process that sees one
// sends a failed span naming its class (error.type) to the collector. A
// Commit refused by the checksum check (every frame corrupted in flight),
// a handoff timeout (a writer slower than --handoff-timeout), a full or
// timed-out router queue, a migration after a decode worker is killed,
// and, for the path no failure takes, decode.generate for a prompt the
// router leaves to decode.

// stopAll stops every process of c (each sends the spans it holds on the
// way out), the router first.
func stopAll(t *testing.T, c *harness.Cluster) {
	t.Helper()
	for _, s := range append([]*harness.Server{c.Router}, c.Workers()...) {
		select {
		case <-s.Exited():
			continue
		default:
		}
		if err := s.Stop(); err != nil {
			t.Logf("stopping %s: %v", s.URL, err)
		}
	}
}

// wantFailedSpan requires a failed span called name from role whose
// error.type is class (any class, but one, when class is empty).
func wantFailedSpan(t *testing.T, rc *harness.OTLPReceiver, role, name, class string) {
	t.Helper()
	var seen []string
	for _, s := range rc.Spans() {
		if s.Role != role || s.Name != name {
			continue
		}
		if s.Failed() && (s.Attr("error.type") == class || class == "" && s.Attr("error.type") != "") {
			return
		}
		seen = append(seen, fmt.Sprintf("failed %v error.type %q status %q", s.Failed(), s.Attr("error.type"), s.Status.GetMessage()))
	}
	t.Errorf("no failed %s span from the %s with error.type %q; its %s spans: %v", name, role, class, name, seen)
}

func TestGateTracesChecksumAndGenerate(t *testing.T) {
	rc := harness.StartOTLPReceiver(t)
	c := startCluster(t, setup{prefillFaults: "seed=3,corrupt=1", workerArgs: rc.Args(),
		routerArgs: append(rc.Args(), "--disagg-prefill-threshold", "256")})
	// Under the threshold: decode computes the prompt itself.
	code, _, b := harness.Post(t, c.Router.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":4,"temperature":0}`)
	if code != 200 {
		t.Fatalf("a short prompt: %d %s", code, b)
	}
	// Over it: handed over, every frame corrupted, refused at Commit.
	long := strings.Repeat("Once upon a time there was a little dog. ", 28)
	code, _, b = harness.Post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":4,"temperature":0}`, long))
	if code == 200 {
		t.Fatalf("a prompt whose KV was corrupted in flight got 200: %s", b)
	}
	stopAll(t, c)
	generated := false
	for _, s := range rc.Spans() {
		generated = generated || (s.Role == "decode" && s.Name == "decode.generate" && !s.Failed())
	}
	if !generated {
		t.Errorf("no decode.generate span for the short prompt")
	}
	wantFailedSpan(t, rc, "decode", "handoff.verify", "checksum")
	wantFailedSpan(t, rc, "decode", "handoff.commit", "checksum")
	wantFailedSpan(t, rc, "router", "router.attempt", "")
}

func TestGateTracesTimeoutAndQueue(t *testing.T) {
	rc := harness.StartOTLPReceiver(t)
	// A 4-token prompt and 56 to generate take 15 of the decode pool's 16
	// pages: one request at a time, the others wait in the router's queue
	// and leave it after a millisecond. The writer waits 400 ms before each
	// frame, past decode's handoff timeout.
	c := startCluster(t, setup{prefillFaults: "seed=5,slow_writer=400ms", workerArgs: append(rc.Args(), "--page-size", "4"),
		decodeArgs: []string{"--max-total-tokens", "64", "--handoff-timeout", "150ms"},
		routerArgs: append(rc.Args(), "--queue-timeout", "1ms", "--max-queued-requests", "1")})
	var wg sync.WaitGroup
	codes := make([]int, 4)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], _, _ = harness.Post(t, c.Router.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a","max_tokens":56,"ignore_eos":true}`)
		}()
	}
	wg.Wait()
	t.Logf("statuses %v", codes)
	stopAll(t, c)
	wantFailedSpan(t, rc, "decode", "handoff.abort", "timeout")
	wantFailedSpan(t, rc, "router", "router.queue", "")
}

func TestGateTracesMigration(t *testing.T) {
	rc := harness.StartOTLPReceiver(t)
	c := startCluster(t, setup{decode: 2, workerArgs: rc.Args(), routerArgs: rc.Args()})
	resp, err := http.Post(c.Router.URL+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":480,"temperature":0,"ignore_eos":true,"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	chunks, killed := 0, false
	for sc.Scan() {
		if !strings.HasPrefix(sc.Text(), "data: {") {
			continue
		}
		if chunks++; chunks == 3 {
			// The decode worker generating it: the one that reserved.
			for _, d := range c.Decode {
				if harness.Metrics(t, d)["baton_kv_reservations_total"] > 0 {
					_ = d.Signal(syscall.SIGKILL)
					<-d.Exited()
					killed = true
					break
				}
			}
		}
	}
	if !killed {
		t.Fatal("no decode worker was generating the request")
	}
	stopAll(t, c)
	wantFailedSpan(t, rc, "router", "router.migrate", "decode_gone")
	failedAttempt := false
	for _, s := range rc.Spans() {
		failedAttempt = failedAttempt || (s.Role == "router" && s.Name == "router.attempt" && s.Failed() && s.Attr("baton.reason") == "decode_gone")
	}
	if !failedAttempt {
		t.Errorf("no failed router.attempt naming decode_gone")
	}
}

// The spec guard's trip, traced: the flattened worker's stream ends as a
// failed decode.stream naming spec_anomaly, and the router's continuation
// on the healthy worker is a failed router.migrate naming spec_guard.
func TestGateTracesSpecGuard(t *testing.T) {
	rc := harness.StartOTLPReceiver(t)
	c := startSpecCluster(t, 2, "on", rc.Args()...)
	ref, ids := loadReference(t), pieces(t)
	tripped := false
	for i := 0; i < 6 && !tripped; i++ {
		a := askSpec(t, c.Router.URL, strconv.Quote(ref.Prompt), specGuardTokens, false, ids)
		if a.code != 200 {
			t.Fatalf("status %d: %.300s", a.code, a.body)
		}
		tripped = harness.Metrics(t, c.Decode[0])["baton_spec_anomalies_total"] > 0
	}
	if !tripped {
		t.Fatal("the spec guard stopped no request")
	}
	stopAll(t, c)
	wantFailedSpan(t, rc, "decode", "decode.stream", "spec_anomaly")
	wantFailedSpan(t, rc, "router", "router.migrate", "spec_guard")
}
