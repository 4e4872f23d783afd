package roles

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// end tears a failed prefill down in the order the page rules need: close
// the session (after which nothing of it is in flight), then tell decode
// Drained, then Drained here.
func (p *Prefill) end(id string, r *scheduler.Request, sess transfer.Session, res *pdv1.Reservation, key transfer.Key, why string) {
	if sess != nil {
		_ = sess.Close()
	}
	// Refused when the engine tore the request down first, which leaves it
	// Aborting just the same; anywhere else it is a bug.
	if err := r.Lifecycle().Move(prefillLive, scheduler.StateAborting, why); err != nil && r.State() != scheduler.StateAborting {
		p.o.Metrics.IllegalMoves.Inc()
		p.o.Log.Error("prefill request not Aborting", "request_id", id, "err", err)
	}
	p.drained(id, res, key)
	if err := r.Lifecycle().To(scheduler.StateDrained, ""); err != nil {
		p.o.Metrics.IllegalMoves.Inc()
		p.o.Log.Error("prefill request not Drained", "request_id", id, "err", err)
	}
	p.o.Metrics.Outcome("drained")
}

// prefillLive are the states a prefill request is on its way in.
var prefillLive = []scheduler.State{scheduler.StateReceived, scheduler.StateAdmitted, scheduler.StatePrefilling, scheduler.StateSending}

// drained tells decode this worker has no write in flight for key and will
// issue none.
func (p *Prefill) drained(id string, res *pdv1.Reservation, key transfer.Key) {
	cc, err := p.peers.get(res.DecodeAddr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(withRequestID(context.Background(), id), 10*time.Second)
	defer cancel()
	if _, err := pdv1.NewDecodeClient(cc).Drained(ctx, &pdv1.DrainedRequest{Room: key.Room, Epoch: key.Epoch, Writer: p.grpcAddr, Capability: key.Cap[:]}); err != nil {
		p.o.Log.Warn("drained not delivered; decode keeps the pages quarantined until the session is proven closed", "request_id", id, "err", err)
	}
}

// Abort implements the RPC: stop writing for a room. A prefill in progress
// is cancelled and says Drained itself once its session is closed; for a
// room with nothing in progress, Drained goes at once.
func (p *Prefill) Abort(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	capability, _ := transfer.CapabilityFrom(a.Capability)
	key := transfer.Key{Room: a.Room, Epoch: a.Epoch, Cap: capability}
	p.mu.Lock()
	cancel, ok := p.active[key]
	p.mu.Unlock()
	if ok {
		cancel()
		return &pdv1.Ack{}, nil
	}
	if a.DecodeAddr == "" {
		return nil, errors.New("abort without a decode address to answer")
	}
	if !p.o.Guards.DialKnown(a.DecodeAddr) {
		// The answer goes only where the router sent this worker before;
		// an address taken from the request alone is never dialled.
		p.o.Metrics.InternalAuthFailures.WithLabelValues("Abort").Inc()
		return nil, status.Error(codes.PermissionDenied, "abort from a decode worker this prefill worker was never paired with")
	}
	go p.drained(a.RequestId, &pdv1.Reservation{DecodeAddr: a.DecodeAddr}, key)
	return &pdv1.Ack{}, nil
}
