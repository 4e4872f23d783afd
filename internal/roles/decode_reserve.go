package roles

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// Reserve implements the RPC: the decode door.
func (d *Decode) Reserve(ctx context.Context, req *pdv1.ReserveRequest) (*pdv1.Reservation, error) {
	if d.shuttingDown.Load() {
		return nil, status.Error(codes.Unavailable, "decode worker is shutting down")
	}
	if why := pdv1.LayoutDiff(d.o.Layout, req.Layout, "this worker", "the peer"); why != "" {
		d.o.Metrics.HandoffFailures.WithLabelValues("layout").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "KV layout mismatch between prefill and decode: %s", why)
	}
	peer := callerID(ctx)
	r := scheduler.NewRoleRequest(scheduler.RoleDecode, req.RequestId, req.Prompt, pdwire.FromPB(req.Sampling))
	held := d.peerPages(r)
	if !d.admitPeer(peer, held) {
		d.o.Log.Warn("reserve refused: the caller holds its share of the pool", "request_id", req.RequestId, "peer", peer)
		return nil, status.Error(codes.ResourceExhausted, "too many reservations held by this caller")
	}
	if err := d.o.Engine.Reserve(r); err != nil {
		d.releasePeer(peer, held)
		d.o.Log.Info("reserve refused", "request_id", req.RequestId, "err", err)
		return nil, rejectStatus(err)
	}
	key := transfer.Key{Room: r.Room(), Epoch: r.Owner().Epoch, Cap: transfer.NewCapability()}
	ps := d.o.Pool.PageSize()
	res := &reservation{r: r, key: key, writer: req.Writer, prompt: r.Pages()[:(len(req.Prompt)+ps-1)/ps],
		peer: peer, held: held}
	d.o.Metrics.ReservationsTotal.Inc()
	d.o.Metrics.ReservationsActive.Inc()
	r.Lifecycle().OnEnd(func() { d.ended(res) })
	d.mu.Lock()
	d.rooms[roomKey(key.Room, key.Epoch)] = res
	d.mu.Unlock()
	res.timer = time.AfterFunc(d.o.HandoffTimeout, func() {
		if d.abortReserved(res, "handoff timeout: no commit from prefill") {
			d.o.Metrics.HandoffFailures.WithLabelValues("timeout").Inc()
		}
	})
	d.o.Log.Info("reserved", "request_id", req.RequestId, "room", key.Room, "epoch", key.Epoch, "pages", len(r.Pages()), "prompt_pages", len(res.prompt))
	return &pdv1.Reservation{Room: key.Room, Epoch: key.Epoch, Pages: res.prompt, PromptTokens: uint32(len(req.Prompt)),
		Layout: d.o.Layout, Transport: d.transport(), TransferAddr: d.transferAddr, DecodeAddr: d.grpcAddr, Capability: key.Cap[:],
		HeldTokens: uint32(len(r.Held()) * ps)}, nil
}

// roomKey is how reservations are filed: room and epoch alone, so that a
// message naming a live room with a wrong capability is told apart from a
// late one (and counted as what it is).
func roomKey(room, epoch uint64) transfer.Key { return transfer.Key{Room: room, Epoch: epoch} }

// find returns the live reservation a message names, if the message
// carries its capability. A wrong capability for a live room is a
// stranger's guess (or a member's bug): it is counted under rpc and
// answered exactly as an unknown room is.
func (d *Decode) find(rpc string, room, epoch uint64, capability []byte) *reservation {
	d.mu.Lock()
	res := d.rooms[roomKey(room, epoch)]
	d.mu.Unlock()
	if res == nil {
		return nil
	}
	if !d.o.Guards.CapabilityMatches(res.key.Cap, capability) {
		d.authFailure(rpc)
		d.o.Log.Warn("message with a wrong capability refused", "rpc", rpc, "room", room, "epoch", epoch)
		return nil
	}
	return res
}

// findSession is find for what a transfer session reports: the session
// must also be the one admitted for the reservation.
func (d *Decode) findSession(rpc string, k transfer.Key) *reservation {
	res := d.find(rpc, k.Room, k.Epoch, k.Cap[:])
	if res == nil {
		return nil
	}
	res.mu.Lock()
	ok := res.boundTo(k.Session[:], d.o.Guards.SessionBound)
	res.mu.Unlock()
	if !ok {
		d.authFailure(rpc)
		return nil
	}
	return res
}

func (d *Decode) authFailure(rpc string) {
	d.o.Metrics.InternalAuthFailures.WithLabelValues(rpc).Inc()
}

// peerUse is what one caller of Reserve holds now.
type peerUse struct{ reservations, pages int }

// peerPages is what a request counts against its caller: the pages it
// reserves for its whole sequence.
func (d *Decode) peerPages(r *scheduler.Request) int {
	tokens := len(r.Prompt) + r.Params.MaxTokens
	if r.Params.MaxTokens <= 0 || tokens > d.o.MaxSeq {
		tokens = d.o.MaxSeq
	}
	return d.o.Pool.PagesFor(tokens)
}

// admitPeer counts pages against peer's bounds, or refuses them.
func (d *Decode) admitPeer(peer string, pages int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[peer]
	if u == nil {
		u = &peerUse{}
		d.usage[peer] = u
	}
	if d.o.Guards.OverQuota(u.reservations, u.pages, pages) {
		if u.reservations == 0 {
			delete(d.usage, peer)
		}
		return false
	}
	u.reservations++
	u.pages += pages
	return true
}

// exceedsQuota is the peer_quota check (DecodeGuards.OverQuota): one more
// reservation of pages would take a caller holding reservations and held
// pages past its bounds. It is asked under d.mu, next to the usage Reserve
// gives back on failure.
func (d *Decode) exceedsQuota(reservations, held, pages int) bool {
	return (d.o.MaxReservationsPerPeer > 0 && reservations+1 > d.o.MaxReservationsPerPeer) ||
		(d.o.MaxPagesPerPeer > 0 && held+pages > d.o.MaxPagesPerPeer)
}

// releasePeer gives back what admitPeer counted.
func (d *Decode) releasePeer(peer string, pages int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[peer]
	if u == nil {
		return
	}
	u.reservations--
	u.pages -= pages
	if u.reservations <= 0 {
		delete(d.usage, peer)
	}
}
