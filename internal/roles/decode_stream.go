package roles

import (
	"errors"
	"net/http"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/handoff"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
)

// Stream implements the RPC: the generated tokens, to the router.
func (d *Decode) Stream(req *pdv1.StreamRequest, out pdv1.Decode_StreamServer) (err error) {
	tr := traceStream(out.Context(), tracing.SpanDecodeStream)
	defer tr.end(&err)
	rd, err := d.desk.Read(req.Room, req.Epoch, req.Capability)
	if err != nil {
		var ref *handoff.Refusal
		if errors.As(err, &ref) && ref.Kind == handoff.Denied {
			// One reader per reservation: a second Stream would split the
			// tokens between two callers.
			return status.Error(codes.FailedPrecondition, ref.Msg)
		}
		return deskStatus(err)
	}
	ctx := out.Context()
	// next ends early when the worker hands its requests back (HandBack).
	next, unwatch := d.watch(ctx)
	defer unwatch()
	handedBack := false
	for {
		ev, ok := rd.Request().Next(next)
		if !ok && ctx.Err() == nil {
			// Handed back: the desk aborts it, and its last event, after
			// whatever it generated before the abort, says so.
			rd.Gone(errHandBack.Error())
			handedBack, next = true, ctx
			continue
		}
		if !ok { // the router went away: the request has no reader left
			rd.Gone("router stream closed")
			return ctx.Err()
		}
		if err := d.send(out, ev, handedBack); err != nil {
			rd.Gone("router stream broken")
			return err
		}
		tr.sent(rd.Request(), ev)
		if ev.Finish != "" {
			// Forgotten now if it has ended; one still Draining is
			// forgotten by the sweep a minute after it ends.
			rd.Done()
			return nil
		}
	}
}

// send sends ev to the router as tokenEvent makes it, with the abort of a
// request the worker handed back (HandBack) said to be one, and counted:
// not the router's doing, so it goes on elsewhere (an older router reads
// the 503 as decode's own failure, and goes on all the same).
func (d *Decode) send(out grpc.ServerStreamingServer[pdv1.TokenEvent], ev scheduler.Event, handedBack bool) error {
	te := tokenEvent(ev)
	if handedBack && ev.Finish == scheduler.FinishAbort {
		te.Finish, te.Error, te.Code = request.FinishDrain, errHandBack.Error(), http.StatusServiceUnavailable
		d.o.Metrics.HandedBack.Inc()
	}
	return out.Send(te)
}

// tokenEvent is an engine event as the router reads it: a token, or the
// last event with its finish or its error (code an HTTP status).
func tokenEvent(ev scheduler.Event) *pdv1.TokenEvent {
	te := &pdv1.TokenEvent{Token: pdwire.TokenToPB(ev.Token), PromptLogprobs: pdwire.TokensToPB(ev.Prompt), CachedTokens: uint32(ev.CachedTokens)}
	if c := ev.Spec; c != nil {
		te.SpecDraftTokens, te.SpecAcceptedTokens, te.SpecVerifySteps = uint32(c.Drafted), uint32(c.Accepted), uint32(c.Steps)
	}
	switch ev.Finish {
	case "":
	case scheduler.FinishStop, scheduler.FinishLength:
		te.Finish = ev.Finish
	case scheduler.FinishSpecAnomaly:
		// Its own finish, not an error: the router retries it on
		// another pair from the tokens the client already has.
		te.Finish, te.Error, te.Code = ev.Finish, errString(ev.Err), 503
	case scheduler.FinishAbort:
		te.Error, te.Code = "request aborted: "+errString(ev.Err), 499
	default:
		te.Error, te.Code = errString(ev.Err), 500
		var hs interface{ HTTPStatus() int }
		if errors.As(ev.Err, &hs) && hs.HTTPStatus() == http.StatusBadRequest {
			te.Code = http.StatusBadRequest // the request's own fault: the router says so
		}
	}
	return te
}

func errString(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}
