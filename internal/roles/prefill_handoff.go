package roles

import (
	"context"
	"errors"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/handoff"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/tracing"
	"github.com/batonlm/baton/internal/transfer"
)

func requestID(ctx context.Context, fallback string) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("x-request-id"); len(v) > 0 {
			return v[0]
		}
	}
	return fallback
}

// Prefill implements the RPC: the reservation's own checks, then the desk
// runs the prefill and hands it over.
func (p *Prefill) Prefill(ctx context.Context, req *pdv1.PrefillRequest) (_ *pdv1.PrefillReply, err error) {
	ctx, span := tracing.Start(ctx, tracing.SpanPrefill, tracing.AttrPromptTokens.Int(len(req.Prompt)),
		tracing.AttrPages.Int(len(req.GetReservation().GetPages())), tracing.AttrCachedTokens.Int(int(req.GetReservation().GetHeldTokens())))
	defer traceEnd(span, &err)
	id := requestID(ctx, req.RequestId)
	res := req.Reservation
	if res == nil {
		return nil, status.Error(codes.InvalidArgument, "prefill without a reservation")
	}
	capability, ok := transfer.CapabilityFrom(res.Capability)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "reservation without a capability")
	}
	t := handoff.Ticket{Key: transfer.Key{Room: res.Room, Epoch: res.Epoch, Cap: capability}, DecodeAddr: res.DecodeAddr,
		TransferAddr: res.TransferAddr, Pages: res.Pages, HeldTokens: int(res.HeldTokens)}
	p.desk.Learn(res.DecodeAddr)
	if p.shuttingDown.Load() {
		p.desk.Refuse(id, t)
		return nil, status.Error(codes.Unavailable, "prefill worker is shutting down")
	}
	if why := pdv1.LayoutDiff(p.o.Layout, res.Layout, "this worker", "the peer"); why != "" {
		p.o.Metrics.HandoffFailures.WithLabelValues("layout").Inc()
		p.desk.Refuse(id, t)
		return nil, status.Errorf(codes.FailedPrecondition, "KV layout mismatch between prefill and decode: %s", why)
	}
	if res.Transport != "" && res.Transport != p.transport() {
		p.desk.Refuse(id, t)
		return nil, status.Errorf(codes.FailedPrecondition, "decode reserved over transport %q, this prefill worker speaks %q", res.Transport, p.transport())
	}
	if ht := int(res.HeldTokens); ht%p.o.Pool.PageSize() != 0 || ht >= len(req.Prompt) {
		p.desk.Refuse(id, t)
		return nil, status.Errorf(codes.InvalidArgument, "reservation holds %d tokens of a %d-token prompt in pages of %d", ht, len(req.Prompt), p.o.Pool.PageSize())
	}
	if int(res.PromptTokens) != len(req.Prompt) || len(res.Pages) != p.o.Pool.PagesFor(len(req.Prompt)) {
		p.desk.Refuse(id, t)
		return nil, status.Errorf(codes.InvalidArgument, "reservation covers %d tokens in %d pages; the prompt has %d tokens",
			res.PromptTokens, len(res.Pages), len(req.Prompt))
	}
	sent, err := p.desk.Run(ctx, id, t, req.Prompt, pdwire.FromPB(req.Sampling))
	if err != nil {
		return nil, prefillStatus(err)
	}
	return &pdv1.PrefillReply{TokensWritten: uint32(sent.TokensWritten), FirstToken: sent.FirstToken}, nil
}

// prefillStatus turns the prefill desk's refusal into the RPC's status.
func prefillStatus(err error) error {
	var ref *handoff.Refusal
	if !errors.As(err, &ref) {
		return rejectStatus(err)
	}
	switch ref.Kind {
	case handoff.Unavailable:
		return status.Error(codes.Unavailable, ref.Msg)
	case handoff.Canceled:
		return status.Error(codes.Canceled, ref.Msg)
	case handoff.Failed:
		return failStatus(ref.Err, ref.Msg)
	case handoff.Refused:
		return status.Errorf(status.Code(ref.Err), "commit refused by decode: %v", status.Convert(ref.Err).Message())
	case handoff.Internal:
		return status.Error(codes.Internal, ref.Msg)
	}
	return deskStatus(err)
}

// failStatus is the status of a prefill the engine failed: the request's
// own fault (a constraint that admits no token) is InvalidArgument, which
// the router answers with 400 and the message; anything else is Internal.
func failStatus(err error, why string) error {
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) && hs.HTTPStatus() == http.StatusBadRequest {
		return status.Error(codes.InvalidArgument, why)
	}
	return status.Error(codes.Internal, why)
}

// Abort implements the RPC: stop writing for a room (the desk cancels a
// prefill in progress, or answers Drained at once).
func (p *Prefill) Abort(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	capability, _ := transfer.CapabilityFrom(a.Capability)
	key := transfer.Key{Room: a.Room, Epoch: a.Epoch, Cap: capability}
	if err := p.desk.Abort(a.RequestId, key, a.DecodeAddr); err != nil {
		var ref *handoff.Refusal
		if !errors.As(err, &ref) {
			return nil, err
		}
		return nil, deskStatus(err)
	}
	return &pdv1.Ack{}, nil
}

// decodeWorkers are the prefill desk's calls to decode, over gRPC.
type decodeWorkers struct{ p *Prefill }

// Commit sends the claim to the decode worker that reserved it.
func (w decodeWorkers) Commit(ctx context.Context, decodeAddr, id string, c handoff.Claim) error {
	cc, err := w.p.peers.get(decodeAddr)
	if err != nil {
		return err
	}
	cctx, ccancel := context.WithTimeout(withRequestID(ctx, id), 30*time.Second)
	defer ccancel()
	_, err = pdv1.NewDecodeClient(cc).Commit(cctx, &pdv1.CommitRequest{Room: c.Key.Room, Epoch: c.Key.Epoch, TokensWritten: uint32(c.TokensWritten),
		PageChecksums: c.PageChecksums, FirstToken: pdwire.TokenToPB(c.First), Writer: w.p.grpcAddr, Capability: c.Key.Cap[:], SessionId: c.Session[:],
		PromptLogprobs: pdwire.TokensToPB(c.Prompt), CachedTokens: uint32(c.CachedTokens)})
	return err
}

// Drained tells decode this worker has no write in flight for key and will
// issue none; a decode worker it cannot dial is not told.
func (w decodeWorkers) Drained(decodeAddr, id string, key transfer.Key) error {
	cc, err := w.p.peers.get(decodeAddr)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(withRequestID(context.Background(), id), 10*time.Second)
	defer cancel()
	_, err = pdv1.NewDecodeClient(cc).Drained(ctx, &pdv1.DrainedRequest{Room: key.Room, Epoch: key.Epoch, Writer: w.p.grpcAddr, Capability: key.Cap[:]})
	return err
}
