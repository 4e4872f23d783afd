package tracing

import (
	"context"
	"net/http"
	"runtime"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestOffByDefault(t *testing.T) {
	before := runtime.NumGoroutine()
	stop, err := Setup(Config{})
	if err != nil || Enabled() {
		t.Fatalf("Setup with no endpoint: enabled %v, err %v", Enabled(), err)
	}
	defer stop(context.Background())
	if DialOptions() != nil || ServerOptions() != nil {
		t.Fatal("gRPC options while tracing is off")
	}
	h := http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	ctx := Extract(context.Background(), h)
	if trace.SpanContextFromContext(ctx).IsValid() || Traceparent(ctx) != "" {
		t.Fatal("a traceparent was read while tracing is off")
	}
	allocs := testing.AllocsPerRun(100, func() {
		c, sp := Start(ctx, SpanPick)
		End(sp, nil)
		_ = With(ctx, c)
	})
	if allocs != 0 {
		t.Errorf("Start/End/With allocate %v times while tracing is off", allocs)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after Setup with no endpoint, %d before", n, before)
	}
}

func TestEndpointOptions(t *testing.T) {
	for _, ep := range []string{"collector:4318", "http://collector:4318", "https://collector/otlp/v1/traces"} {
		if _, err := endpointOptions(ep); err != nil {
			t.Errorf("%s: %v", ep, err)
		}
	}
	for _, ep := range []string{"grpc://collector:4317", "collector:4318/v1/traces", "http://"} {
		if _, err := endpointOptions(ep); err == nil {
			t.Errorf("%s: accepted", ep)
		}
	}
	if _, err := Setup(Config{Endpoint: "collector:4318", SampleRatio: 2}); err == nil {
		t.Error("a sample ratio of 2 was accepted")
	}
}

// The entry sampler draws its own decision for a remote parent, whatever
// its flags, and follows a local one.
func TestEntrySampler(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	remote := func(flags trace.TraceFlags) context.Context {
		return trace.ContextWithRemoteSpanContext(context.Background(),
			trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags, Remote: true}))
	}
	decide := func(s sdktrace.Sampler, ctx context.Context) sdktrace.SamplingDecision {
		return s.ShouldSample(sdktrace.SamplingParameters{ParentContext: ctx, TraceID: tid, Name: SpanRequest}).Decision
	}
	if decide(EntrySampler(1), remote(0)) != sdktrace.RecordAndSample {
		t.Error("an unsampled client parent switched tracing off")
	}
	if decide(EntrySampler(0), remote(trace.FlagsSampled)) != sdktrace.Drop {
		t.Error("a sampled client parent switched tracing on at ratio 0")
	}
	local := trace.ContextWithSpanContext(context.Background(),
		trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}))
	if decide(EntrySampler(0), local) != sdktrace.RecordAndSample {
		t.Error("a sampled local parent was not followed")
	}
}

// With tracing on, a malformed traceparent is ignored and a valid one
// parents the span; an error's text never reaches the span.
func TestExtractAndErrorClass(t *testing.T) {
	stop, err := Setup(Config{Endpoint: "127.0.0.1:1", SampleRatio: 1, Role: "router"})
	if err != nil {
		t.Fatal(err)
	}
	defer stop(context.Background())
	for _, tp := range []string{"", "garbage", "00-zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"} {
		ctx := Extract(context.Background(), http.Header{"Traceparent": {tp}})
		if trace.SpanContextFromContext(ctx).IsValid() {
			t.Errorf("traceparent %q was taken", tp)
		}
	}
	ctx := Extract(context.Background(), http.Header{"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}})
	ctx, sp := Start(ctx, SpanRequest)
	defer sp.End()
	if tp := Traceparent(ctx); len(tp) != 55 || tp[3:35] != "4bf92f3577b34da6a3ce929d0e0e4736" || tp[53:] != "01" {
		t.Errorf("traceparent of the request's span: %q", tp)
	}
	if c := ErrorClass(context.Canceled); c != "Canceled" {
		t.Errorf("ErrorClass(Canceled) = %q", c)
	}
	if c := ErrorClass(http.ErrBodyNotAllowed); c != "error" {
		t.Errorf("ErrorClass of a plain error = %q", c)
	}
}

// A refused internal call is a failed span of its own, a root, naming
// the call and the plane's reason; a caller's trace context is not its
// parent.
func TestRefusedIsARoot(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer SetTracerProvider(tp)()
	Refused("Reserve", "role")
	spans := rec.Ended()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	sp := spans[0]
	if sp.Name() != SpanAuth || sp.Parent().IsValid() || sp.Status().Code != codes.Error {
		t.Fatalf("span %s parent %v status %v", sp.Name(), sp.Parent(), sp.Status())
	}
	got := map[attribute.Key]string{}
	for _, kv := range sp.Attributes() {
		got[kv.Key] = kv.Value.String()
	}
	if got[AttrError] != "role" || got[AttrRPC] != "Reserve" {
		t.Fatalf("attributes %v", got)
	}
}

// Failed twice, a span keeps the first class as error.type and the last
// status: the check that saw the failure, the code its caller got.
func TestFailKeepsFirstClass(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer SetTracerProvider(tp)()
	ctx, sp := Start(context.Background(), SpanCommit)
	FailCtx(ctx, "checksum")
	End(sp, status.Error(grpccodes.FailedPrecondition, "commit refused by the checksum check: page 3 ..."))
	got := rec.Ended()[0]
	if got.Status().Description != "FailedPrecondition" {
		t.Errorf("status %q", got.Status().Description)
	}
	for _, kv := range got.Attributes() {
		if kv.Key == AttrError && kv.Value.AsString() != "checksum" {
			t.Errorf("error.type %q, want checksum", kv.Value.AsString())
		}
	}
}
