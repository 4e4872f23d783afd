package handoff

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
)

// The desk's failure paths each leave a failed span naming their class
// (error.type), under the span of the call that saw them or, for what
// happens after Reserve returned (the timer, an abort), under Reserve's;
// and the desk's lines about a traced request carry its trace id.

// recordSpans makes every span from here to the test's end go to a
// recorder.
func recordSpans(t *testing.T) *tracetest.SpanRecorder {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	restore := tracing.SetTracerProvider(tp)
	t.Cleanup(func() {
		restore()
		_ = tp.Shutdown(context.Background())
	})
	return rec
}

// spanNamed is the last ended span called name.
func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	ended := rec.Ended()
	for i := len(ended) - 1; i >= 0; i-- {
		if ended[i].Name() == name {
			return ended[i]
		}
	}
	t.Fatalf("no %s span; have %v", name, spanNames(ended))
	return nil
}

// countSpans counts the ended spans named name.
func countSpans(rec *tracetest.SpanRecorder, name string) int {
	n := 0
	for _, sp := range rec.Ended() {
		if sp.Name() == name {
			n++
		}
	}
	return n
}

// waitSpans waits until n spans named name have ended.
func waitSpans(t *testing.T, rec *tracetest.SpanRecorder, name string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for countSpans(rec, name) < n && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

func spanNames(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name())
	}
	return out
}

func attrOf(sp sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range sp.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// wantFailed requires sp to be failed with class in its error.type.
func wantFailed(t *testing.T, sp sdktrace.ReadOnlySpan, class string) {
	t.Helper()
	if sp.Status().Code != codes.Error || attrOf(sp, "error.type") != class {
		t.Errorf("span %s: status %v %q, error.type %q; want failed with %q", sp.Name(), sp.Status().Code, sp.Status().Description,
			attrOf(sp, "error.type"), class)
	}
}

// syncBuffer is a log sink the desk's goroutines may write at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// wantLogged requires a log line with msg that names the trace.
func wantLogged(t *testing.T, log *syncBuffer, msg string, traceID trace.TraceID) {
	t.Helper()
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "msg=\""+msg+"\"") || strings.Contains(line, "msg="+msg+" ") {
			if !strings.Contains(line, "trace_id="+traceID.String()) {
				t.Errorf("line %q does not name the trace %s", line, traceID)
			}
			return
		}
	}
	t.Errorf("no %q line in:\n%s", msg, log.String())
}

// tracedFixture is a fixture whose reservation is made under a span of
// its own (the Reserve call's, as roles makes it), logging to the buffer
// it returns.
func tracedFixture(t *testing.T, rec *tracetest.SpanRecorder, opt func(*DecodeOptions)) (*fixture, *syncBuffer, trace.Span) {
	t.Helper()
	log := &syncBuffer{}
	ctx, sp := tracing.Start(context.Background(), tracing.SpanDecodeReserve)
	f := newFixtureWith(t, ctx, func(o *DecodeOptions) {
		o.Log = slog.New(slog.NewTextHandler(log, nil))
		if opt != nil {
			opt(o)
		}
	})
	sp.End()
	wantLogged(t, log, "reserved", sp.SpanContext().TraceID())
	return f, log, sp
}

// Every check of Commit, and the refusals before them: the Commit's span
// is failed with the check's name (kept when roles fails it again with
// the code it answers), Commit's checks' span too, and the line about it
// names the trace.
func TestTraceCommitRefusals(t *testing.T) {
	rec := recordSpans(t)
	for _, tc := range []struct {
		class  string
		change func(*Commit)
	}{
		{"checksum", func(c *Commit) { c.PageChecksums = append([]uint64{c.PageChecksums[0] ^ 1}, c.PageChecksums[1:]...) }},
		{"coverage", func(c *Commit) { c.TokensWritten-- }},
		{"over_claim", func(c *Commit) { c.TokensWritten++ }},
		{"first_token", func(c *Commit) { c.FirstToken = nil }},
		{"writer", func(c *Commit) { c.Writer = "prefill:2" }},
		{"session_bind", func(c *Commit) { c.SessionID = []byte{8} }},
		{"no_reservation", func(c *Commit) { c.Capability = make([]byte, len(c.Capability)) }},
	} {
		t.Run(tc.class, func(t *testing.T) {
			f, log, rsp := tracedFixture(t, rec, nil)
			c := f.commit()
			tc.change(&c)
			ctx, sp := tracing.Start(trace.ContextWithSpanContext(context.Background(), rsp.SpanContext()), tracing.SpanCommit)
			err := f.d.Commit(ctx, c)
			if err == nil {
				t.Fatalf("a Commit failing %s was accepted", tc.class)
			}
			// What roles does with the desk's refusal.
			tracing.End(sp, status.Error(grpccodes.FailedPrecondition, err.Error()))
			commit := spanNamed(t, rec, tracing.SpanCommit)
			wantFailed(t, commit, tc.class)
			if commit.Status().Description != grpccodes.FailedPrecondition.String() {
				t.Errorf("Commit's span status %q, want the code it answered", commit.Status().Description)
			}
			if tc.class == "session_bind" || tc.class == "no_reservation" {
				return // refused before the checks
			}
			v := spanNamed(t, rec, tracing.SpanVerify)
			wantFailed(t, v, tc.class)
			if v.Parent().SpanID() != commit.SpanContext().SpanID() {
				t.Errorf("the checks' span is not the Commit's child")
			}
			if strings.Contains(attrOf(v, "error.type")+v.Status().Description, "checksum ") {
				t.Errorf("error text in the span: %q", v.Status().Description)
			}
			wantLogged(t, log, "commit refused", rsp.SpanContext().TraceID())
			f.writerGoneAndSettled()
		})
	}
}

// writerGoneAndSettled gives the writer's Drained and waits for every page.
func (f *fixture) writerGoneAndSettled() {
	drained, done := f.drainedEvent()
	f.inOrder(drained)
	wait(f.t, done)
	f.settled()
}

// The desk ends a reservation after its Reserve call returned: the
// handoff timer, the router's Abort, its stream's reader gone. Each is a
// failed handoff.abort span under the Reserve call's span, and the line
// about it names the trace.
func TestTraceAborts(t *testing.T) {
	rec := recordSpans(t)
	for _, class := range []string{"timeout", "abort", "reader_gone"} {
		t.Run(class, func(t *testing.T) {
			f, log, rsp := tracedFixture(t, rec, nil)
			r := f.request()
			before := countSpans(rec, tracing.SpanAbort)
			switch class {
			case "timeout":
				res := f.reservation()
				f.inOrder(func() { f.d.on(res, func() { f.d.timeout(res) }) })
				waitState(t, r, scheduler.StateDraining)
			case "abort":
				abort, aborted := f.abortEvent()
				f.inOrder(abort)
				if !wait(t, aborted) {
					t.Fatal("the abort did not end the request")
				}
			case "reader_gone":
				if err := f.d.Commit(context.Background(), f.commit()); err != nil {
					t.Fatal(err)
				}
				k := f.res.Key
				rd, err := f.d.Read(k.Room, k.Epoch, k.Cap[:])
				if err != nil {
					t.Fatal(err)
				}
				rd.Gone("router stream closed")
				drainEvents(t, r)
			}
			// The span ends just after the moves the cases wait for.
			waitSpans(t, rec, tracing.SpanAbort, before+1)
			sp := spanNamed(t, rec, tracing.SpanAbort)
			wantFailed(t, sp, class)
			if sp.Parent().SpanID() != rsp.SpanContext().SpanID() || sp.SpanContext().TraceID() != rsp.SpanContext().TraceID() {
				t.Errorf("handoff.abort's parent %v, want the Reserve call's span %v", sp.Parent(), rsp.SpanContext())
			}
			if class == "reader_gone" {
				if attrOf(sp, "baton.joined") != "true" {
					t.Errorf("an abort after Commit does not say it had joined the batch")
				}
				f.settled()
				return
			}
			wantLogged(t, log, "aborted before decode", rsp.SpanContext().TraceID())
			f.writerGoneAndSettled()
		})
	}
}

// Reserve refused: by the caller's quota, and by the engine (a prompt
// over the context). The Reserve call's span names the class.
func TestTraceReserveRefusals(t *testing.T) {
	rec := recordSpans(t)
	f, _, _ := tracedFixture(t, rec, func(o *DecodeOptions) { o.MaxReservationsPerPeer = 1 })
	ctx, sp := tracing.Start(context.Background(), tracing.SpanDecodeReserve)
	_, err := f.d.Reserve(ctx, "router", "second", writer, f.prompt, request.Params{MaxTokens: 4})
	sp.End()
	var ref *Refusal
	if !errors.As(err, &ref) || ref.Kind != Exhausted {
		t.Fatalf("a second reservation over the caller's bound: %v", err)
	}
	wantFailed(t, spanNamed(t, rec, tracing.SpanDecodeReserve), "peer_quota")

	ctx, sp = tracing.Start(context.Background(), tracing.SpanDecodeReserve)
	_, err = f.d.Reserve(ctx, "another", "long", writer, make([]int32, 4096), request.Params{MaxTokens: 4})
	sp.End()
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Reason == "" {
		t.Fatalf("a prompt over the context: %v", err)
	}
	wantFailed(t, spanNamed(t, rec, tracing.SpanDecodeReserve), rej.Reason)
}
