package server

import (
	"strings"
	"testing"
)

// A drain is final: a readiness report that raced it (the router's
// ticker sets readiness from its workers every 250 ms) must not turn
// /health back to 200 while new work is refused. Before, SetReady(true)
// after Drain did.
func TestSetReadyAfterDrain(t *testing.T) {
	ts, _ := newTestServer(t, Options{})
	s := srvOf(t, ts)
	s.Drain()
	s.SetReady(true)
	if code, _, b := do(t, "GET", ts.URL+"/health", "", ""); code != 503 || !strings.Contains(string(b), "draining") {
		t.Fatalf("/health after SetReady(true) while draining: %d %s", code, b)
	}
	if code, _, b := do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"hi"}`); code != 503 {
		t.Fatalf("a request while draining: %d %s", code, b)
	}
}
