package harness

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// OTLPSpan is one exported span with the role of the process that sent it.
type OTLPSpan struct {
	Role string
	*tracepb.Span
}

func (s OTLPSpan) TraceID() string { return hex.EncodeToString(s.TraceId) }
func (s OTLPSpan) ID() string      { return hex.EncodeToString(s.SpanId) }
func (s OTLPSpan) Parent() string  { return hex.EncodeToString(s.ParentSpanId) }

// Failed reports whether the span's status is an error.
func (s OTLPSpan) Failed() bool { return s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR }

// Attr is the span's attribute key as text (a string, a number or a
// bool), empty when it has none.
func (s OTLPSpan) Attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key != key {
			continue
		}
		v := a.GetValue()
		switch v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			return v.GetStringValue()
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.GetIntValue(), 10)
		case *commonpb.AnyValue_BoolValue:
			return strconv.FormatBool(v.GetBoolValue())
		case *commonpb.AnyValue_DoubleValue:
			return strconv.FormatFloat(v.GetDoubleValue(), 'g', -1, 64)
		}
	}
	return ""
}

// OTLPReceiver is an OTLP/HTTP trace collector on 127.0.0.1 that keeps
// what it is sent, and every request body as it came (to look for text
// that must never be exported). URL is what --otlp-traces-endpoint takes.
type OTLPReceiver struct {
	URL   string
	srv   *httptest.Server
	mu    sync.Mutex
	spans []OTLPSpan
	raw   [][]byte
}

// StartOTLPReceiver starts a receiver that stops when the test ends.
func StartOTLPReceiver(t testing.TB) *OTLPReceiver {
	r := &OTLPReceiver{}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	r.URL = r.srv.URL
	t.Cleanup(r.srv.Close)
	return r
}

// Args are the flags that send a process's spans here.
func (r *OTLPReceiver) Args() []string { return []string{"--otlp-traces-endpoint", r.URL} }

func (r *OTLPReceiver) serve(w http.ResponseWriter, req *http.Request) {
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
				r.spans = append(r.spans, OTLPSpan{role, sp})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Spans is every span received so far.
func (r *OTLPReceiver) Spans() []OTLPSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]OTLPSpan(nil), r.spans...)
}

// Trace is the spans of one trace (its id in hex).
func (r *OTLPReceiver) Trace(id string) []OTLPSpan {
	var out []OTLPSpan
	for _, s := range r.Spans() {
		if s.TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// Raw is every export request's body as it came.
func (r *OTLPReceiver) Raw() [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]byte(nil), r.raw...)
}
