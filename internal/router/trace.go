package router

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/trace"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/tracing"
)

// The router's spans of one request (internal/tracing): the queue wait,
// the pair choice, each attempt with its reservation, and every retry and
// migration, all children of the request's span (the server's, which the
// stream's tctx holds). An attempt's span rides in md to the workers, so
// that their spans are its children. With tracing off each of these is a
// few nil checks.

// traceBegin ties the stream to ctx's span: the parent of its spans and,
// through md, of the workers'.
func (s *stream) traceBegin(ctx context.Context) {
	s.tctx = ctx
	s.md = tracing.With(s.md, ctx)
}

func (s *stream) traceCtx() context.Context {
	if s.tctx == nil {
		return context.Background()
	}
	return s.tctx
}

// tracePick starts the pair choice's span; tracePicked ends it.
func (s *stream) tracePick() trace.Span {
	if !tracing.Enabled() {
		return nil
	}
	_, sp := tracing.Start(s.traceCtx(), tracing.SpanPick, tracing.AttrPromptTokens.Int(len(s.prompt)))
	return sp
}

func tracePicked(sp trace.Span, pr pair, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		var rej *request.RejectError
		why := "no pair"
		if errors.As(err, &rej) {
			why = rej.Reason
		}
		tracing.Fail(sp, why)
	} else {
		sp.SetAttributes(tracing.AttrDecode.String(pr.d.url), tracing.AttrPrefill.String(pr.p.name()), tracing.AttrLocal.Bool(pr.local))
	}
	sp.End()
}

// traceAttempt starts an attempt's span and makes it the parent of the
// attempt's worker calls; the function it returns ends it with the
// attempt's failure, if any, and gives md back its request span.
func (s *stream) traceAttempt(pr pair) func(f **failure) {
	if !tracing.Enabled() {
		return func(**failure) {}
	}
	s.attempts++
	ctx, sp := tracing.Start(s.traceCtx(), tracing.SpanAttempt, tracing.AttrAttempt.Int(s.attempts),
		tracing.AttrDecode.String(pr.d.url), tracing.AttrPrefill.String(pr.p.name()), tracing.AttrLocal.Bool(pr.local),
		tracing.AttrPromptTokens.Int(len(s.prompt)), tracing.AttrMigrations.Int(s.migrations))
	md := s.md
	s.md = tracing.With(md, ctx)
	return func(f **failure) {
		s.md = md
		if fl := *f; fl != nil {
			sp.SetAttributes(tracing.AttrStage.String(fl.stage))
			if fl.code != 0 {
				sp.SetAttributes(tracing.AttrRPCCode.Int(int(fl.code)))
			}
			if fl.midStream != "" {
				sp.SetAttributes(tracing.AttrReason.String(fl.midStream))
			}
			tracing.Fail(sp, fl.stage)
		}
		sp.End()
	}
}

// traceReserve starts the Reserve call's span under ctx; traceReserved
// ends it.
func traceReserve(ctx context.Context) (context.Context, trace.Span) {
	return tracing.Start(ctx, tracing.SpanReserve)
}

func traceReserved(sp trace.Span, res *pdv1.Reservation, err error) {
	if err == nil && sp.IsRecording() {
		sp.SetAttributes(tracing.AttrPages.Int(len(res.Pages)), tracing.AttrCachedTokens.Int(int(res.HeldTokens)))
	}
	tracing.End(sp, err)
}

// traceQueued starts the span of the request's wait in the queue;
// traceLeft ends it, failed when the wait ended the request.
func (s *stream) traceQueued() {
	if tracing.Enabled() {
		_, s.qspan = tracing.Start(s.traceCtx(), tracing.SpanQueue)
	}
}

func (s *stream) traceLeft(err error) {
	if s.qspan == nil {
		return
	}
	if err != nil {
		why := "queue"
		var rej *request.RejectError
		if errors.As(err, &rej) {
			why = rej.Reason
		} else if errors.Is(err, errClientLeft) {
			why = "client left"
		}
		tracing.Fail(s.qspan, why)
	}
	s.qspan.End()
	s.qspan = nil
}

// traceRetry records an attempt that failed before the first token and
// is tried again on another pair: failed with the stage it failed in
// (the request may still succeed; the span says what it recovered from).
func (s *stream) traceRetry(f *failure) {
	if !tracing.Enabled() {
		return
	}
	_, sp := tracing.Start(s.traceCtx(), tracing.SpanRetry, tracing.AttrStage.String(f.stage), tracing.AttrAttempt.Int(s.attempts))
	tracing.Fail(sp, f.stage)
	sp.End()
}

// traceMigrate records a request going on elsewhere after its decode
// worker failed it mid-stream: failed with the migration's reason
// (decode_gone, spec_anomaly, ...).
func (s *stream) traceMigrate(f *failure) {
	if !tracing.Enabled() {
		return
	}
	_, sp := tracing.Start(s.traceCtx(), tracing.SpanMigrate, tracing.AttrReason.String(f.midStream),
		tracing.AttrStage.String(f.stage), tracing.AttrOutputTokens.Int(len(s.sent)), tracing.AttrMigrations.Int(s.migrations))
	tracing.Fail(sp, f.midStream)
	sp.End()
}
