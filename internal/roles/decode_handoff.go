package roles

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/handoff"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/tracing"
	"github.com/batonlm/baton/internal/transfer"
)

// deskStatus turns the desk's refusal into the RPC's status.
func deskStatus(err error) error {
	var ref *handoff.Refusal
	if !errors.As(err, &ref) {
		return rejectStatus(err)
	}
	code := map[handoff.Kind]codes.Code{handoff.NotFound: codes.NotFound, handoff.Denied: codes.PermissionDenied,
		handoff.Precondition: codes.FailedPrecondition, handoff.Exhausted: codes.ResourceExhausted, handoff.Stopped: codes.Unavailable}[ref.Kind]
	return status.Error(code, ref.Msg)
}

// Reserve implements the RPC: the decode door.
func (d *Decode) Reserve(ctx context.Context, req *pdv1.ReserveRequest) (_ *pdv1.Reservation, err error) {
	ctx, span := tracing.Start(ctx, tracing.SpanDecodeReserve, tracing.AttrPromptTokens.Int(len(req.Prompt)))
	defer traceEnd(span, &err)
	if d.shuttingDown.Load() {
		return nil, status.Error(codes.Unavailable, "decode worker is shutting down")
	}
	if why := pdv1.LayoutDiff(d.o.Layout, req.Layout, "this worker", "the peer"); why != "" {
		d.o.Metrics.HandoffFailures.WithLabelValues("layout").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "KV layout mismatch between prefill and decode: %s", why)
	}
	res, err := d.desk.Reserve(ctx, callerID(ctx), req.RequestId, req.Writer, req.Prompt, pdwire.FromPB(req.Sampling))
	if err != nil {
		return nil, deskStatus(err)
	}
	tracing.Annotate(ctx, tracing.AttrPages.Int(len(res.Pages)), tracing.AttrCachedTokens.Int(res.HeldTokens))
	return &pdv1.Reservation{Room: res.Key.Room, Epoch: res.Key.Epoch, Pages: res.Pages, PromptTokens: uint32(len(req.Prompt)),
		Layout: d.o.Layout, Transport: d.transport(), TransferAddr: d.transferAddr, DecodeAddr: d.grpcAddr, Capability: res.Key.Cap[:],
		HeldTokens: uint32(res.HeldTokens)}, nil
}

// Admit implements transfer.Sink: the desk admits the session.
func (d *Decode) Admit(k transfer.Key) ([]int32, error) { return d.desk.Admit(k) }

// Write implements transfer.Sink: the frame lands under the reservation's
// lease, on the transport's goroutine.
func (d *Decode) Write(k transfer.Key, w transfer.PageWrite) error { return d.desk.Write(k, w) }

// Closed implements transfer.Sink: the session's proof of close, for the desk.
func (d *Decode) Closed(k transfer.Key, proof string) { d.desk.Closed(k, proof) }

// Commit implements the RPC: the desk checks every claim of the handoff
// before the request may decode.
func (d *Decode) Commit(ctx context.Context, c *pdv1.CommitRequest) (_ *pdv1.Ack, err error) {
	ctx, span := tracing.Start(ctx, tracing.SpanCommit, tracing.AttrPromptTokens.Int(int(c.TokensWritten)),
		tracing.AttrPages.Int(len(c.PageChecksums)), tracing.AttrCachedTokens.Int(int(c.CachedTokens)))
	defer traceEnd(span, &err)
	hc := handoff.Commit{Room: c.Room, Epoch: c.Epoch, Capability: c.Capability, SessionID: c.SessionId, Writer: c.Writer,
		TokensWritten: int(c.TokensWritten), PageChecksums: c.PageChecksums, CachedTokens: int(c.CachedTokens),
		PromptLogprobs: func(limit int) []request.Sampled { return pdwire.TokensFromPB(c.PromptLogprobs, limit) }}
	if c.FirstToken != nil {
		first := pdwire.TokenFromPB(c.FirstToken)
		hc.FirstToken = &first
	}
	if err := d.desk.Commit(ctx, hc); err != nil {
		return nil, deskStatus(err)
	}
	return &pdv1.Ack{}, nil
}

// Abort implements the RPC: the router ends a request wherever it is (the
// client left, or the router gave the reservation up before or during its
// handoff).
func (d *Decode) Abort(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	d.desk.Abort(a.Room, a.Epoch, a.Capability, "aborted: "+a.Reason)
	return &pdv1.Ack{}, nil
}

// Finish implements the RPC (a stop string matched at the router).
func (d *Decode) Finish(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	d.desk.Finish(a.Room, a.Epoch, a.Capability)
	return &pdv1.Ack{}, nil
}

// Drained implements the RPC: the writer's word that nothing of it is in flight.
func (d *Decode) Drained(ctx context.Context, dr *pdv1.DrainedRequest) (*pdv1.Ack, error) {
	d.desk.Drained(dr.Room, dr.Epoch, dr.Capability, dr.Writer)
	return &pdv1.Ack{}, nil
}

// prefillWriters are the desk's calls to prefill, over gRPC.
type prefillWriters struct{ d *Decode }

// Abort sends Abort to the prefill worker writing key; it answers with
// Drained once nothing of it is in flight.
func (w prefillWriters) Abort(writer string, key transfer.Key, requestID, why string) error {
	cc, err := w.d.peers.get(writer)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(withRequestID(context.Background(), requestID), 10*time.Second)
	defer cancel()
	_, err = pdv1.NewPrefillClient(cc).Abort(ctx, &pdv1.AbortRequest{Room: key.Room, Epoch: key.Epoch, Reason: why,
		RequestId: requestID, DecodeAddr: w.d.grpcAddr, Capability: key.Cap[:]})
	return err
}
