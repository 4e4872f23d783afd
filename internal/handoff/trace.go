package handoff

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
)

// chunkMark is a prompt chunk the engine loop handed to the shipper, and
// when: the loop only takes the time, the spans are made afterwards on
// the RPC's goroutine.
type chunkMark struct {
	from, to int
	at       time.Time
}

// trace records a prefill's queue wait (enqueued at start, to the engine
// taking it into its batch) and its chunks under ctx's span, once the
// engine sent the request's last event (ok) and wrote no more marks. A
// chunk runs from the previous one's end (the first from admission) to
// its own.
func (s *shipper) trace(ctx context.Context, start time.Time, r *scheduler.Request, ok bool) {
	if !s.traced || !ok {
		return
	}
	_, admitted := r.Lifecycle().Times()
	tracing.Span(ctx, tracing.SpanPrefillQueue, start, admitted)
	prev := admitted
	for _, m := range s.marks {
		from := prev
		if from.IsZero() || from.After(m.at) {
			from = m.at
		}
		tracing.Span(ctx, tracing.SpanPrefillChunk, from, m.at, tracing.AttrChunkFrom.Int(m.from), tracing.AttrChunkTo.Int(m.to))
		prev = m.at
	}
}

// traceShipped records the shipping of the pages, from the first queued
// to the last handed to the session.
func (s *shipper) traceShipped(ctx context.Context, err error) {
	if !s.traced || s.firstAt.IsZero() {
		return
	}
	_, sp := tracing.StartAt(ctx, tracing.SpanPrefillShip, s.firstAt, tracing.AttrPages.Int(len(s.pages)-s.heldPages))
	tracing.End(sp, err)
}

// traceAbort records that the desk ended res's request (why: timeout,
// abort, reader_gone) as a failed span under its Reserve call's.
func (res *reservation) traceAbort(why string) {
	tracing.Event(res.tctx, tracing.SpanAbort, why, tracing.AttrReason.String(why), tracing.AttrPages.Int(len(res.prompt)),
		tracing.AttrLanded.Bool(!res.firstByte.IsZero()), tracing.AttrJoined.Bool(res.joined))
}

// traceVerified ends the span of Commit's checks, failed with the name
// of the check that failed.
func traceVerified(sp trace.Span, reason string, err error) {
	if err != nil {
		tracing.Fail(sp, reason)
		sp.SetAttributes(tracing.AttrReason.String(reason))
	}
	sp.End()
}
