package roles

import (
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/scheduler"
)

// Stream implements the RPC: the generated tokens, to the router.
func (d *Decode) Stream(req *pdv1.StreamRequest, out pdv1.Decode_StreamServer) error {
	res := d.find("Stream", req.Room, req.Epoch, req.Capability)
	if res == nil {
		return status.Errorf(codes.NotFound, "no reservation room %d epoch %d", req.Room, req.Epoch)
	}
	if !res.claimStream() {
		// One reader per reservation: a second Stream would split the
		// tokens between two callers.
		d.authFailure("Stream")
		return status.Errorf(codes.FailedPrecondition, "reservation room %d epoch %d is already being streamed", req.Room, req.Epoch)
	}
	ctx := out.Context()
	for {
		ev, ok := res.r.Next(ctx)
		if !ok { // the router went away: the request has no reader left
			d.abortReserved(res, "router stream closed")
			return ctx.Err()
		}
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
		if err := out.Send(te); err != nil {
			d.abortReserved(res, "router stream broken")
			return err
		}
		if ev.Finish != "" {
			// Forgotten now if it has ended; one still Draining is
			// forgotten by the sweep a minute after it ends.
			d.forget(res)
			return nil
		}
	}
}

// claimStream marks res as having its one reader.
func (res *reservation) claimStream() bool {
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.reader {
		return false
	}
	res.reader = true
	return true
}

func errString(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}
