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
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/scheduler"
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

// Prefill implements the RPC.
func (p *Prefill) Prefill(ctx context.Context, req *pdv1.PrefillRequest) (*pdv1.PrefillReply, error) {
	id := requestID(ctx, req.RequestId)
	res := req.Reservation
	if res == nil {
		return nil, status.Error(codes.InvalidArgument, "prefill without a reservation")
	}
	capability, ok := transfer.CapabilityFrom(res.Capability)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "reservation without a capability")
	}
	key := transfer.Key{Room: res.Room, Epoch: res.Epoch, Cap: capability}
	p.learnDecode(res.DecodeAddr)
	if p.shuttingDown.Load() {
		p.drained(id, res, key)
		return nil, status.Error(codes.Unavailable, "prefill worker is shutting down")
	}
	log := p.o.Log.With("request_id", id, "room", key.Room, "epoch", key.Epoch)
	if why := pdv1.LayoutDiff(p.o.Layout, res.Layout, "this worker", "the peer"); why != "" {
		p.o.Metrics.HandoffFailures.WithLabelValues("layout").Inc()
		p.drained(id, res, key)
		return nil, status.Errorf(codes.FailedPrecondition, "KV layout mismatch between prefill and decode: %s", why)
	}
	if res.Transport != "" && res.Transport != p.transport() {
		p.drained(id, res, key)
		return nil, status.Errorf(codes.FailedPrecondition, "decode reserved over transport %q, this prefill worker speaks %q", res.Transport, p.transport())
	}
	if ht := int(res.HeldTokens); ht%p.o.Pool.PageSize() != 0 || ht >= len(req.Prompt) {
		p.drained(id, res, key)
		return nil, status.Errorf(codes.InvalidArgument, "reservation holds %d tokens of a %d-token prompt in pages of %d", ht, len(req.Prompt), p.o.Pool.PageSize())
	}
	if int(res.PromptTokens) != len(req.Prompt) || len(res.Pages) != p.o.Pool.PagesFor(len(req.Prompt)) {
		p.drained(id, res, key)
		return nil, status.Errorf(codes.InvalidArgument, "reservation covers %d tokens in %d pages; the prompt has %d tokens",
			res.PromptTokens, len(res.Pages), len(req.Prompt))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.mu.Lock()
	p.active[key] = cancel
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.active, key)
		p.mu.Unlock()
	}()

	r := scheduler.NewRoleRequest(scheduler.RolePrefill, id, req.Prompt, pdwire.FromPB(req.Sampling))
	// The door first: a request this worker cannot hold is rejected before
	// any session to decode exists.
	if err := p.o.Engine.CheckDoor(r); err != nil {
		log.Info("prefill refused", "err", err)
		p.drained(id, res, key)
		return nil, rejectStatus(err)
	}
	sess, err := p.o.Sender.Open(ctx, res.TransferAddr, key)
	if err != nil {
		p.end(id, r, nil, res, key, "transport open failed")
		return nil, status.Errorf(codes.Unavailable, "cannot reach decode transport %s: %v", res.TransferAddr, err)
	}
	p.o.Metrics.TransferSessions.Inc()
	ship := newShipper(res, p.o.Pool.PageSize(), len(req.Prompt), sess)
	r.OnChunk = ship.onChunk
	if err := p.o.Engine.Submit(r); err != nil {
		_ = sess.Close()
		_ = ship.finish()
		p.drained(id, res, key)
		return nil, rejectStatus(err)
	}
	start := time.Now()

	ev, ok := r.Next(ctx)
	for ok && ev.Finish == "" {
		ev, ok = r.Next(ctx)
	}
	if !ok || ev.Finish != scheduler.FinishPrefilled {
		why := "prefill aborted"
		if ok && ev.Err != nil {
			why = ev.Err.Error()
		}
		if !ok {
			// The caller left before the engine ended r: ask it to, and
			// wait until it has let go (no more pages will be queued).
			// A last event read above already says it has.
			r.Cancel()
			p.wait(r)
		}
		_ = sess.Close()
		_ = ship.finish()
		p.end(id, r, nil, res, key, why)
		if !ok {
			return nil, status.Error(codes.Canceled, why)
		}
		return nil, failStatus(ev.Err, why)
	}
	// Every write must have landed before Commit claims it did.
	err = ship.finish()
	if err == nil {
		err = sess.Flush(ctx)
	}
	if err != nil {
		p.o.Metrics.HandoffFailures.WithLabelValues("transfer").Inc()
		p.end(id, r, sess, res, key, err.Error())
		return nil, status.Errorf(codes.Unavailable, "KV transfer failed: %v", err)
	}
	bytes := sess.Bytes()
	_ = sess.Close()
	p.o.Metrics.TransferBytes.Add(float64(bytes))
	p.o.Metrics.TransferSeconds.Observe(time.Since(ship.firstAt).Seconds())

	cc, err := p.peers.get(res.DecodeAddr)
	if err == nil {
		cctx, ccancel := context.WithTimeout(withRequestID(ctx, id), 30*time.Second)
		sid := sess.ID()
		_, err = pdv1.NewDecodeClient(cc).Commit(cctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(req.Prompt)),
			PageChecksums: ship.checksums, FirstToken: pdwire.TokenToPB(ev.Token), Writer: p.grpcAddr, Capability: res.Capability, SessionId: sid[:],
			PromptLogprobs: pdwire.TokensToPB(ev.Prompt), CachedTokens: uint32(ev.CachedTokens)})
		ccancel()
	}
	if err != nil {
		p.o.Metrics.HandoffFailures.WithLabelValues("commit").Inc()
		p.end(id, r, nil, res, key, "commit refused")
		log.Warn("commit refused", "err", err)
		return nil, status.Errorf(status.Code(err), "commit refused by decode: %v", status.Convert(err).Message())
	}
	if err := r.Lifecycle().To(scheduler.StateSent, ""); err != nil {
		p.o.Metrics.IllegalMoves.Inc()
		log.Error("prefill request not Sent", "err", err)
		return nil, status.Error(codes.Internal, err.Error())
	}
	p.o.Metrics.Outcome("sent")
	log.Info("prefilled and committed", "tokens", len(req.Prompt), "bytes", bytes, "seconds", time.Since(start).Seconds())
	return &pdv1.PrefillReply{TokensWritten: uint32(len(req.Prompt)), FirstToken: ev.Token.ID}, nil
}

// wait reads r's events until its last (the engine has torn it down).
func (p *Prefill) wait(r *scheduler.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ev, ok := r.Next(ctx)
		if !ok || ev.Finish != "" {
			return
		}
	}
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
