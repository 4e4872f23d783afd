package roles

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
)

// Generate implements the RPC: a request whose prompt this worker computes
// itself, as a standalone server would (the router sends short prompts, or
// ones this worker's prefix cache mostly holds, so that they pay no
// handoff). Its pages are the engine's alone from admission to release:
// no reservation, no writer, so none of the handoff's gates is involved.
// The call's end (the router gone, or the client) ends the request; a
// draining worker hands it back as it does a handed-over one (HandBack).
func (d *Decode) Generate(req *pdv1.GenerateRequest, out pdv1.Decode_GenerateServer) (err error) {
	tr := traceStream(out.Context(), tracing.SpanGenerate)
	defer tr.end(&err)
	if d.shuttingDown.Load() {
		return status.Error(codes.Unavailable, "decode worker is shutting down")
	}
	r := scheduler.NewRequest(req.RequestId, req.Prompt, pdwire.FromPB(req.Sampling))
	if err := d.o.Engine.Enqueue(r); err != nil {
		return rejectStatus(err)
	}
	ctx := out.Context()
	next, unwatch := d.watch(ctx)
	defer unwatch()
	handedBack := false
	for {
		ev, ok := r.Next(next)
		if !ok && ctx.Err() == nil {
			// Handed back: its last event, after whatever it generated
			// before the abort, says so.
			d.o.Engine.Abort(r, errHandBack.Error())
			handedBack, next = true, ctx
			continue
		}
		if !ok {
			d.o.Engine.Abort(r, "router stream closed")
			return ctx.Err()
		}
		if err := d.send(out, ev, handedBack); err != nil {
			d.o.Engine.Abort(r, "router stream broken")
			return err
		}
		tr.sent(r, ev)
		if ev.Finish != "" {
			return nil
		}
	}
}
