package e2e

import (
	"bytes"
	"net/http"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// traceOf is the trace id of a response's traceparent header.
func traceOf(t *testing.T, h http.Header) string {
	t.Helper()
	parts := strings.Split(h.Get("Traceparent"), "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		t.Fatalf("response traceparent %q", h.Get("Traceparent"))
	}
	return parts[1]
}

// One request through router, prefill and decode, each sending spans to
// one collector: one trace, one connected tree under the client's span,
// every stage of the handoff in it, no prompt text anywhere; a malformed
// traceparent is ignored and an unsampled one cannot switch tracing off;
// a request whose prefill worker is gone leaves a failed span.
func TestTracesOneTreeAcrossProcesses(t *testing.T) {
	rc := harness.StartOTLPReceiver(t)
	ep := rc.Args()
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: ep, RouterArgs: ep})

	const secret = "zebraquokka"
	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body := `{"model":"stories260K","prompt":"Once upon a time a ` + secret + `","max_tokens":8,"temperature":0}`
	code, h, b := post(t, c.Router.URL+"/v1/completions", body,
		"traceparent", "00-"+clientTrace+"-"+clientSpan+"-01", "tracestate", "vendor=opaque")
	if code != 200 {
		t.Fatalf("traced request: %d %s", code, b)
	}
	if h.Get("X-Request-Id") == "" || traceOf(t, h) != clientTrace {
		t.Fatalf("response headers: x-request-id %q traceparent %q", h.Get("X-Request-Id"), h.Get("Traceparent"))
	}

	// Hostile headers: malformed ones start a trace of the router's own;
	// an unsampled flag is the client's wish, not the router's decision.
	for _, tp := range []string{"00-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-00f067aa0ba902b7-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"ff-" + clientTrace + "-" + clientSpan + "-01", strings.Repeat("0", 4000)} {
		code, h, b := post(t, c.Router.URL+"/v1/completions", body, "traceparent", tp, "tracestate", "=;;,,a b=c,===")
		if code != 200 {
			t.Fatalf("traceparent %.40q: %d %s", tp, code, b)
		}
		if id := traceOf(t, h); id == clientTrace || strings.HasPrefix(tp, "00-"+id) {
			t.Fatalf("malformed traceparent %.40q was taken: %s", tp, h.Get("Traceparent"))
		}
	}
	const unsampled = "0af7651916cd43dd8448eb211c80319c"
	code, h, b = post(t, c.Router.URL+"/v1/completions", body, "traceparent", "00-"+unsampled+"-b7ad6b7169203331-00")
	if code != 200 || traceOf(t, h) != unsampled || !strings.HasSuffix(h.Get("Traceparent"), "-01") {
		t.Fatalf("unsampled client traceparent: %d %s %s", code, h.Get("Traceparent"), b)
	}

	// The prefill worker leaves (its spans flushed on the way out); the
	// next request fails, and says so in its trace.
	if err := c.Prefill[0].Stop(); err != nil {
		t.Fatal(err)
	}
	code, h, _ = post(t, c.Router.URL+"/v1/completions", body)
	if code == 200 {
		t.Fatalf("a request with no prefill worker succeeded")
	}
	failed := traceOf(t, h)
	for _, s := range []*harness.Server{c.Router, c.Decode[0]} {
		if err := s.Stop(); err != nil {
			t.Fatal(err)
		}
	}

	spans := rc.Trace(clientTrace)
	ids, roles, names := map[string]bool{}, map[string]bool{}, map[string]int{}
	for _, s := range spans {
		ids[s.ID()] = true
		roles[s.Role] = true
		names[s.Name]++
	}
	var roots []harness.OTLPSpan
	for _, s := range spans {
		switch {
		case s.Parent() == clientSpan:
			roots = append(roots, s)
		case !ids[s.Parent()]:
			t.Errorf("span %s (%s) has parent %s, which is not in the trace", s.Name, s.Role, s.Parent())
		}
	}
	if len(roots) != 1 || roots[0].Name != "baton.request" || roots[0].Role != "router" {
		t.Errorf("roots under the client's span: %v", roots)
	}
	for _, r := range []string{"router", "prefill", "decode"} {
		if !roles[r] {
			t.Errorf("no span from the %s", r)
		}
	}
	for _, n := range []string{"baton.request", "router.pick", "router.attempt", "router.reserve", "decode.reserve",
		"prefill", "prefill.queue", "prefill.chunk", "prefill.ship", "prefill.flush",
		"handoff.commit", "handoff.landed", "handoff.verify", "decode.stream", "decode.queue", "decode.first_token"} {
		if names[n] == 0 {
			t.Errorf("no %s span in the trace; have %v", n, names)
		}
	}
	for _, s := range spans {
		if s.Failed() {
			t.Errorf("span %s (%s) of a request that succeeded failed: %s", s.Name, s.Role, s.Status.GetMessage())
		}
	}
	if len(rc.Trace(unsampled)) == 0 {
		t.Errorf("the request whose client said unsampled was not traced")
	}

	fs := rc.Trace(failed)
	var why []string
	for _, s := range fs {
		if s.Failed() {
			why = append(why, s.Role+"/"+s.Name+": "+s.Status.GetMessage())
		}
	}
	if len(why) == 0 {
		t.Errorf("the failed request's trace (%d spans) has no failed span", len(fs))
	}
	t.Logf("the failed request's failed spans: %v", why)

	for _, b := range rc.Raw() {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("the prompt's text was exported")
		}
	}
	if !strings.Contains(c.Prefill[0].Stderr(), "trace_id="+clientTrace) {
		t.Errorf("prefill's log lines of the request do not name its trace id")
	}
	for _, line := range strings.Split(c.Decode[0].Stderr(), "\n") {
		if strings.Contains(line, "request_id=") && (strings.Contains(line, "msg=reserved") || strings.Contains(line, "msg=committed")) &&
			strings.Contains(line, "trace_id="+clientTrace) {
			return
		}
	}
	t.Errorf("decode's reserved and committed lines of the request do not name its trace id")
}
