package server

import (
	"context"
	"net/http"

	"github.com/batonlm/baton/internal/tracing"
)

// traced answers with the request's id (x-request-id) and, when tracing
// is on, starts the generation's span (tracing.SpanRequest) under the
// client's traceparent, if it sent a valid one, and answers its own
// (traceparent). The context it returns carries the span to the
// generator: the router's spans and the workers' are its children.
func (g *generation) traced(w http.ResponseWriter, r *http.Request) context.Context {
	w.Header().Set("X-Request-Id", g.id)
	ctx := r.Context()
	if !tracing.Enabled() {
		return ctx
	}
	prompt := 0
	for _, p := range g.batch {
		prompt += len(p)
	}
	ctx, g.span = tracing.Start(tracing.Extract(ctx, r.Header), tracing.SpanRequest, tracing.AttrRequestID.String(g.id),
		tracing.AttrPromptTokens.Int(prompt), tracing.AttrRoute.String(r.URL.Path))
	if tp := tracing.Traceparent(ctx); tp != "" {
		w.Header().Set("Traceparent", tp)
	}
	return ctx
}

// traceEnd ends the generation's span, failed when status is an error;
// once (later calls do nothing).
func (g *generation) traceEnd(status int) {
	sp := g.span
	if sp == nil {
		return
	}
	g.span = nil
	if sp.IsRecording() {
		tokens := 0
		for _, c := range g.choices {
			tokens += c.tokens
		}
		sp.SetAttributes(tracing.AttrOutputTokens.Int(tokens), tracing.AttrCachedTokens.Int(g.cached))
		if status != 0 {
			sp.SetAttributes(tracing.AttrStatus.Int(status))
		}
		if status >= 400 {
			tracing.Fail(sp, http.StatusText(status))
		}
	}
	sp.End()
}
