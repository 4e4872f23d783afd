package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/batonlm/baton/test/harness"
)

// otlpSpan is one exported span with the role of the process that sent it.
type otlpSpan struct {
	role string
	*tracepb.Span
}

func (s otlpSpan) traceID() string { return hex.EncodeToString(s.TraceId) }
func (s otlpSpan) id() string      { return hex.EncodeToString(s.SpanId) }
func (s otlpSpan) parent() string  { return hex.EncodeToString(s.ParentSpanId) }

// otlpReceiver is an OTLP/HTTP trace collector on 127.0.0.1 that keeps
// what it is sent, and every request body as it came (to look for text
// that must never be exported).
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []otlpSpan
	raw   [][]byte
}

func startOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var ex coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &ex); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.mu.Lock()
		r.raw = append(r.raw, b)
		for _, rs := range ex.ResourceSpans {
			role := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.Key == "baton.role" {
					role = a.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, sp := range ss.Spans {
					r.spans = append(r.spans, otlpSpan{role, sp})
				}
			}
		}
		r.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) trace(id string) []otlpSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []otlpSpan
	for _, s := range r.spans {
		if s.traceID() == id {
			out = append(out, s)
		}
	}
	return out
}

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
	rc := startOTLPReceiver(t)
	ep := []string{"--otlp-traces-endpoint", rc.srv.URL}
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

	spans := rc.trace(clientTrace)
	ids, roles, names := map[string]bool{}, map[string]bool{}, map[string]int{}
	for _, s := range spans {
		ids[s.id()] = true
		roles[s.role] = true
		names[s.Name]++
	}
	var roots []otlpSpan
	for _, s := range spans {
		switch {
		case s.parent() == clientSpan:
			roots = append(roots, s)
		case !ids[s.parent()]:
			t.Errorf("span %s (%s) has parent %s, which is not in the trace", s.Name, s.role, s.parent())
		}
	}
	if len(roots) != 1 || roots[0].Name != "baton.request" || roots[0].role != "router" {
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
		if s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("span %s (%s) of a request that succeeded failed: %s", s.Name, s.role, s.Status.GetMessage())
		}
	}
	if len(rc.trace(unsampled)) == 0 {
		t.Errorf("the request whose client said unsampled was not traced")
	}

	fs := rc.trace(failed)
	var why []string
	for _, s := range fs {
		if s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR {
			why = append(why, s.role+"/"+s.Name+": "+s.Status.GetMessage())
		}
	}
	if len(why) == 0 {
		t.Errorf("the failed request's trace (%d spans) has no failed span", len(fs))
	}
	t.Logf("the failed request's failed spans: %v", why)

	rc.mu.Lock()
	for _, b := range rc.raw {
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("the prompt's text was exported")
		}
	}
	rc.mu.Unlock()
	if !strings.Contains(c.Prefill[0].Stderr(), "trace_id="+clientTrace) {
		t.Errorf("prefill's log lines of the request do not name its trace id")
	}
}
