package roles

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
)

// streamTrace is the span of a decode worker's token stream (Stream or
// Generate): its queue wait and first token as child spans, its tokens
// as attributes. The engine loop makes none of it: the times come from
// the request's lifecycle, read here after the events that follow them.
type streamTrace struct {
	ctx    context.Context
	span   trace.Span
	start  time.Time
	tokens int
	last   scheduler.Event
}

// traceStream starts name's span under ctx's (the router's attempt, from
// the call's metadata); nil when tracing is off.
func traceStream(ctx context.Context, name string) *streamTrace {
	if !tracing.Enabled() {
		return nil
	}
	ctx, sp := tracing.Start(ctx, name)
	if !sp.IsRecording() {
		sp.End()
		return nil
	}
	return &streamTrace{ctx: ctx, span: sp, start: time.Now()}
}

// sent notes an event r's stream delivered.
func (t *streamTrace) sent(r *scheduler.Request, ev scheduler.Event) {
	if t == nil {
		return
	}
	if ev.Token != nil {
		if t.tokens == 0 {
			committed, started := r.Lifecycle().Times()
			if committed.IsZero() {
				committed = t.start // Generate: enqueued when the call began
			}
			tracing.Span(t.ctx, tracing.SpanDecodeQueue, committed, started)
			tracing.Span(t.ctx, tracing.SpanFirstToken, t.start, time.Now(), tracing.AttrCachedTokens.Int(ev.CachedTokens))
			t.span.SetAttributes(tracing.AttrPromptTokens.Int(len(r.Prompt)), tracing.AttrCachedTokens.Int(ev.CachedTokens))
		}
		t.tokens++
	}
	if ev.Finish != "" {
		t.last = ev
	}
}

// end ends the stream's span with the call's error, or the failure its
// last event reported.
func (t *streamTrace) end(err *error) {
	if t == nil {
		return
	}
	t.span.SetAttributes(tracing.AttrOutputTokens.Int(t.tokens))
	if f := t.last.Finish; f != "" {
		t.span.SetAttributes(tracing.AttrFinish.String(f))
		if t.last.Err != nil && *err == nil {
			tracing.Fail(t.span, f)
		}
	}
	tracing.End(t.span, *err)
}

// traceEnd ends a handler's span with its error (deferred with the
// address of the handler's named result).
func traceEnd(sp trace.Span, err *error) { tracing.End(sp, *err) }
