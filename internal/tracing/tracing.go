// Package tracing is baton's OpenTelemetry tracing: the provider and its
// OTLP/HTTP exporter (Setup), the W3C trace context carried from a
// client's HTTP headers and over the internal plane's gRPC metadata, and
// the names of the spans and attributes every role records.
//
// Tracing is off unless Setup is given an endpoint: then Start returns the
// caller's context and a no-op span, the gRPC options are empty, and no
// goroutine runs. Spans carry counts (tokens, cached tokens, pages, bytes)
// and where a request went (workers, stages, reasons), never prompt text
// or token ids, and an error's status names its class, never the error's
// text (a door's message may quote a token).
package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Span names: one trace per request, rooted at the router's (or a
// standalone server's) Request span.
const (
	SpanRequest = "baton.request" // the HTTP generation, router or standalone; parent: the client's traceparent

	SpanQueue   = "router.queue"   // a wait in the router's queue for a decode worker with room
	SpanPick    = "router.pick"    // choosing a prefill/decode pair
	SpanAttempt = "router.attempt" // one try on a pair (handoff, or decode alone)
	SpanReserve = "router.reserve" // the Decode.Reserve call
	SpanRetry   = "router.retry"   // an attempt failed before the first token; another pair is tried
	SpanMigrate = "router.migrate" // decode failed after tokens; the request goes on elsewhere

	SpanDecodeReserve = "decode.reserve" // decode's door: pages reserved for the prompt
	SpanPrefill       = "prefill"        // the Prefill RPC: door, session, chunks, ship, flush, Commit
	SpanPrefillQueue  = "prefill.queue"  // enqueued to taken into the prefill batch
	SpanPrefillChunk  = "prefill.chunk"  // one chunk of the prompt computed
	SpanPrefillShip   = "prefill.ship"   // first page queued to the last handed to the session
	SpanPrefillFlush  = "prefill.flush"  // the session's flush: every write landed
	SpanCommit        = "handoff.commit" // decode's Commit: the writer's claim checked
	SpanLanded        = "handoff.landed" // decode: the first frame landed to the Commit that closed the writes
	SpanVerify        = "handoff.verify" // decode: Commit's checks (coverage, checksums, first token)
	SpanDecodeStream  = "decode.stream"  // decode's token stream to the router
	SpanDecodeQueue   = "decode.queue"   // verified (or enqueued) to taken into the decode batch
	SpanFirstToken    = "decode.first_token"
	SpanGenerate      = "decode.generate"  // a prompt decode computes itself (no handoff)
	SpanAbort         = "handoff.abort"    // decode: a reservation ended before it joined the batch (timeout, the router's abort, its reader gone)
	SpanAuth          = "internal.refused" // a worker refused an internal call's credentials or role (a root of its own)
)

// Attribute keys.
const (
	AttrRequestID    = attribute.Key("baton.request_id")
	AttrRole         = attribute.Key("baton.role")
	AttrPromptTokens = attribute.Key("baton.prompt_tokens")
	AttrCachedTokens = attribute.Key("baton.cached_tokens")
	AttrOutputTokens = attribute.Key("baton.output_tokens")
	AttrPages        = attribute.Key("baton.pages")
	AttrBytes        = attribute.Key("baton.bytes")
	AttrChunkFrom    = attribute.Key("baton.chunk.from") // first prompt position of a chunk
	AttrChunkTo      = attribute.Key("baton.chunk.to")   // one past its last
	AttrAttempt      = attribute.Key("baton.attempt")
	AttrMigrations   = attribute.Key("baton.migrations")
	AttrStage        = attribute.Key("baton.stage")  // where an attempt failed: pick, reserve, stream, prefill, decode, ...
	AttrReason       = attribute.Key("baton.reason") // a migration's reason, a check's name
	AttrDecode       = attribute.Key("baton.decode") // a decode worker's URL
	AttrPrefill      = attribute.Key("baton.prefill")
	AttrLocal        = attribute.Key("baton.local") // the prompt is computed on decode alone
	AttrFinish       = attribute.Key("baton.finish")
	AttrLanded       = attribute.Key("baton.landed") // an aborted reservation had pages land
	AttrJoined       = attribute.Key("baton.joined") // an aborted reservation had joined the batch
	AttrStatus       = attribute.Key("http.response.status_code")
	AttrRPCCode      = attribute.Key("rpc.grpc.status_code")
	AttrRoute        = attribute.Key("http.route")
	// AttrError is the failure class of a failed span (OpenTelemetry's
	// error.type): the same fixed word as its status, a check's name, a
	// gRPC code's name or a queue's reason; never an error's text.
	AttrError = attribute.Key("error.type")
	AttrRPC   = attribute.Key("rpc.method") // the internal call a refusal answered
)

// Config is what serve's flags say about tracing.
type Config struct {
	// Endpoint is the OTLP/HTTP collector: host:port (plain HTTP, path
	// /v1/traces) or an http:// or https:// URL (its path, or /v1/traces).
	// Empty: tracing is off.
	Endpoint string
	// SampleRatio is the share of requests traced, decided where a request
	// enters (the router, a standalone server); the workers follow it.
	SampleRatio float64
	// Role names the process in the resource (baton.role).
	Role string
	// Version goes into service.version when set.
	Version string
}

// state is the process's tracing, set once by Setup.
type state struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

var cur atomic.Pointer[state]

// Enabled reports whether Setup turned tracing on.
func Enabled() bool { return cur.Load() != nil }

// endpointOptions turns the flag into the exporter's options.
func endpointOptions(ep string) ([]otlptracehttp.Option, error) {
	if !strings.Contains(ep, "://") {
		if strings.ContainsAny(ep, "/?#") {
			return nil, fmt.Errorf("--otlp-traces-endpoint %q: give host:port or an http(s):// URL", ep)
		}
		return []otlptracehttp.Option{otlptracehttp.WithEndpoint(ep), otlptracehttp.WithInsecure()}, nil
	}
	u, err := url.Parse(ep)
	if err != nil {
		return nil, fmt.Errorf("--otlp-traces-endpoint: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--otlp-traces-endpoint %q: give host:port or an http(s):// URL", ep)
	}
	path := u.Path
	if path == "" || path == "/" {
		path = "/v1/traces"
	}
	opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(u.Host), otlptracehttp.WithURLPath(path)}
	if u.Scheme == "http" {
		opts = append(opts, otlptracehttp.WithInsecure())
	}
	return opts, nil
}

// Setup turns tracing on when c names an endpoint. The returned function
// flushes the spans not yet exported and stops the exporter; it is safe to
// call when tracing is off. An entry role (router, standalone) samples
// SampleRatio of its requests whatever the client's traceparent says; a
// worker follows the sampling of the call's parent.
func Setup(c Config) (shutdown func(context.Context) error, err error) {
	off := func(context.Context) error { return nil }
	if c.Endpoint == "" {
		return off, nil
	}
	if c.SampleRatio < 0 || c.SampleRatio > 1 {
		return off, fmt.Errorf("--otlp-traces-sample-ratio %v: must be between 0 and 1", c.SampleRatio)
	}
	opts, err := endpointOptions(c.Endpoint)
	if err != nil {
		return off, err
	}
	exp, err := otlptracehttp.New(context.Background(), append(opts, otlptracehttp.WithTimeout(5*time.Second))...)
	if err != nil {
		return off, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", "baton"), AttrRole.String(c.Role)}
	if c.Version != "" {
		attrs = append(attrs, attribute.String("service.version", c.Version))
	}
	var sampler sdktrace.Sampler
	switch c.Role {
	case "prefill", "decode":
		sampler = sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))
	default:
		sampler = EntrySampler(c.SampleRatio)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(resource.NewSchemaless(attrs...)),
	)
	cur.Store(&state{tracer: tp.Tracer("github.com/batonlm/baton"), prop: propagation.TraceContext{}})
	return func(ctx context.Context) error {
		cur.Store(nil)
		return tp.Shutdown(ctx)
	}, nil
}

// EntrySampler decides where a request enters: a span whose parent is
// this process's follows it; any other (a client's traceparent, or none)
// is sampled with probability ratio, drawn here. A client's sampled flag
// can thus neither switch tracing off for its requests nor force it on,
// and a trace id chosen to fall under the ratio buys nothing.
func EntrySampler(ratio float64) sdktrace.Sampler { return entrySampler{ratio} }

type entrySampler struct{ ratio float64 }

func (s entrySampler) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	psc := trace.SpanContextFromContext(p.ParentContext)
	var sample bool
	if psc.IsValid() && !psc.IsRemote() {
		sample = psc.IsSampled()
	} else {
		sample = s.ratio >= 1 || (s.ratio > 0 && rand.Float64() < s.ratio)
	}
	d := sdktrace.Drop
	if sample {
		d = sdktrace.RecordAndSample
	}
	return sdktrace.SamplingResult{Decision: d, Tracestate: psc.TraceState()}
}

func (s entrySampler) Description() string { return fmt.Sprintf("EntrySampler{%g}", s.ratio) }

// Start starts a span under ctx's. With tracing off it returns ctx and
// a span that records nothing.
func Start(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	st := cur.Load()
	if st == nil {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return st.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// StartAt is Start for a span whose start (and end) the caller measured
// earlier, cheaply, where it could not make spans (the engine loop).
func StartAt(ctx context.Context, name string, at time.Time, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	st := cur.Load()
	if st == nil {
		return ctx, trace.SpanFromContext(context.Background())
	}
	return st.tracer.Start(ctx, name, trace.WithTimestamp(at), trace.WithAttributes(attrs...))
}

// Span records a span that already happened, from start to end; nothing
// when either time is unknown.
func Span(ctx context.Context, name string, start, end time.Time, attrs ...attribute.KeyValue) {
	if cur.Load() == nil || start.IsZero() || end.IsZero() {
		return
	}
	if end.Before(start) {
		end = start
	}
	_, sp := StartAt(ctx, name, start, attrs...)
	sp.End(trace.WithTimestamp(end))
}

// End ends sp; a non-nil err marks it failed with err's class (its gRPC
// code, or "error"), not err's text.
func End(sp trace.Span, err error) {
	if err != nil && sp.IsRecording() {
		Fail(sp, ErrorClass(err))
	}
	sp.End()
}

// Fail marks sp failed and names the failure's class in its error.type
// attribute; why must be a fixed word or a check's name, never text that
// may quote the request. A span failed twice keeps the first class as
// error.type (the most specific: the check that saw it) and takes the
// later status (the code its caller was answered).
func Fail(sp trace.Span, why string) {
	if !sp.IsRecording() {
		return
	}
	if ro, ok := sp.(sdktrace.ReadOnlySpan); !ok || !hasAttr(ro, AttrError) {
		sp.SetAttributes(AttrError.String(why))
	}
	sp.SetStatus(codes.Error, why)
}

// hasAttr reports whether sp already carries key.
func hasAttr(sp sdktrace.ReadOnlySpan, key attribute.Key) bool {
	for _, kv := range sp.Attributes() {
		if kv.Key == key {
			return true
		}
	}
	return false
}

// FailCtx marks ctx's span failed with why (Fail).
func FailCtx(ctx context.Context, why string) { Fail(trace.SpanFromContext(ctx), why) }

// Detach is a context carrying only ctx's span, for spans made later
// under it (a reservation's timer, its abort) once ctx itself is done.
// With no valid span in ctx, context.Background.
func Detach(ctx context.Context) context.Context {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithSpanContext(context.Background(), sc)
}

// Event records a failure that happened at one moment, outside any call
// (a timer, an abort): a span of no length named name under ctx's span,
// failed with why.
func Event(ctx context.Context, name, why string, attrs ...attribute.KeyValue) {
	if cur.Load() == nil {
		return
	}
	_, sp := Start(ctx, name, attrs...)
	Fail(sp, why)
	sp.End()
}

// Refused records a worker's refusal of an internal call's or transfer
// session's credentials or role (rpc: the call's short name, "transfer"
// or "tls"; reason: the plane's fixed word for it) as a failed span of
// its own. It is a root: nothing a caller who failed to prove itself
// sent may name its parent.
func Refused(rpc, reason string) {
	Event(context.Background(), SpanAuth, reason, AttrRPC.String(rpc))
}

// SetTracerProvider makes tp the provider of every span from now on (a
// test's span recorder) and returns what puts the previous state back.
// Setup is how a process turns tracing on.
func SetTracerProvider(tp trace.TracerProvider) (restore func()) {
	prev := cur.Swap(&state{tracer: tp.Tracer("github.com/batonlm/baton"), prop: propagation.TraceContext{}})
	return func() { cur.Store(prev) }
}

// ErrorClass is what a span says of err: the gRPC code's name when err
// carries one.
func ErrorClass(err error) string {
	if err == nil {
		return ""
	}
	if st, ok := status.FromError(err); ok && st.Code() != grpccodes.Unknown {
		return st.Code().String()
	}
	if err == context.Canceled {
		return grpccodes.Canceled.String()
	}
	return "error"
}

// Annotate sets attributes on ctx's span, when it records.
func Annotate(ctx context.Context, attrs ...attribute.KeyValue) {
	if sp := trace.SpanFromContext(ctx); sp.IsRecording() {
		sp.SetAttributes(attrs...)
	}
}

// With returns dst carrying the span of src: worker calls made with dst
// (the router's request-id metadata context) then name src's span as
// their parent. With tracing off, or no span in src, dst itself.
func With(dst, src context.Context) context.Context {
	sc := trace.SpanContextFromContext(src)
	if !sc.IsValid() {
		return dst
	}
	return trace.ContextWithSpanContext(dst, sc)
}

// Extract is ctx under the trace context of an incoming HTTP request's
// traceparent and tracestate headers. A malformed header is ignored (the
// request starts a trace of its own); nothing else in the headers is read.
func Extract(ctx context.Context, h http.Header) context.Context {
	st := cur.Load()
	if st == nil {
		return ctx
	}
	return st.prop.Extract(ctx, propagation.HeaderCarrier(h))
}

// Traceparent is the W3C traceparent of ctx's span, for a response
// header; empty when tracing is off or the span is not sampled.
func Traceparent(ctx context.Context) string {
	st := cur.Load()
	if st == nil {
		return ""
	}
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	c := propagation.MapCarrier{}
	st.prop.Inject(ctx, c)
	return c.Get("traceparent")
}

// TraceID is ctx's trace id in hex; empty when tracing is off or no span
// is sampled.
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() || !sc.IsSampled() {
		return ""
	}
	return sc.TraceID().String()
}

// Log adds the trace id of ctx's span to log (trace_id), when traced.
func Log(log *slog.Logger, ctx context.Context) *slog.Logger {
	if id := TraceID(ctx); id != "" {
		return log.With("trace_id", id)
	}
	return log
}
