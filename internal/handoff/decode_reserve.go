package handoff

import (
	"context"
	"errors"
	"time"

	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
	"github.com/batonlm/baton/internal/transfer"
)

// Reservation is what Reserve hands the router: where the writer puts the
// prompt's KV, and the capability every message about it must carry.
type Reservation struct {
	Key        transfer.Key
	Pages      []int32 // the prompt pages the writer fills
	HeldTokens int     // prompt tokens decode holds from its cache already
}

// Reserve is the decode door: peer's request, to be written by writer, gets
// its pages, its capability and its handoff timer, or is refused (a
// *Refusal, or the engine's *scheduler.RejectError). ctx's span (the
// Reserve call's) is the parent of the reservation's later spans, and its
// trace id is on the reservation's log lines.
func (d *Decode) Reserve(ctx context.Context, peer, id, writer string, prompt []int32, params request.Params) (Reservation, error) {
	type out struct {
		res Reservation
		err error
	}
	o, ok := call(&d.inbox, func(answer func(out)) {
		res, err := d.reserve(ctx, peer, id, writer, prompt, params)
		answer(out{res, err})
	})
	if !ok {
		return Reservation{}, errStopped
	}
	return o.res, o.err
}

func (d *Decode) reserve(ctx context.Context, peer, id, writer string, prompt []int32, params request.Params) (Reservation, error) {
	log := tracing.Log(d.o.Log.With("request_id", id), ctx)
	r := scheduler.NewRoleRequest(scheduler.RoleDecode, id, prompt, params)
	counted := d.peerPages(r)
	if !d.admitPeer(peer, counted) {
		log.Warn("reserve refused: the caller holds its share of the pool", "peer", peer)
		tracing.FailCtx(ctx, "peer_quota")
		return Reservation{}, refuse(Exhausted, "too many reservations held by this caller")
	}
	ho, err := d.o.Engine.Reserve(r)
	if err != nil {
		d.releasePeer(peer, counted)
		log.Info("reserve refused", "err", err)
		why := "engine"
		var rej *request.RejectError
		if errors.As(err, &rej) && rej.Reason != "" {
			why = rej.Reason
		}
		tracing.FailCtx(ctx, why)
		return Reservation{}, err
	}
	key := transfer.Key{Room: r.Room(), Epoch: r.Owner().Epoch, Cap: transfer.NewCapability()}
	res := &reservation{r: r, ho: ho, key: key, writer: writer, prompt: r.Pages()[:d.o.Pool.PagesFor(len(prompt))], peer: peer, counted: counted,
		log: log, tctx: tracing.Detach(ctx)}
	res.lease = &lease{r: r, cap: key.Cap, prompt: res.prompt}
	d.o.Metrics.ReservationsTotal.Inc()
	d.o.Metrics.ReservationsActive.Inc()
	r.Lifecycle().OnEnd(func() { d.post(func() { d.ended(res) }) })
	k := roomKey(key.Room, key.Epoch)
	d.rooms[k] = res
	d.leases.add(k, res.lease)
	res.timer = d.after(d.o.HandoffTimeout, res, func() { d.timeout(res) })
	log.Info("reserved", "room", key.Room, "epoch", key.Epoch, "pages", len(r.Pages()), "prompt_pages", len(res.prompt))
	return Reservation{Key: key, Pages: res.prompt, HeldTokens: len(r.Held()) * d.o.Pool.PageSize()}, nil
}

// timeout aborts a reservation whose Commit did not come in time.
func (d *Decode) timeout(res *reservation) {
	if res.joined {
		return
	}
	d.abort(res, "handoff timeout: no commit from prefill", func(aborted bool) {
		if aborted {
			d.o.Metrics.HandoffFailures.WithLabelValues("timeout").Inc()
			res.traceAbort("timeout")
		}
	})
}

// after posts ev for res once dur has passed: a timer is an event like any
// other, and waits its turn behind res's.
func (d *Decode) after(dur time.Duration, res *reservation, ev func()) *time.Timer {
	return time.AfterFunc(dur, func() { d.post(func() { d.on(res, ev) }) })
}

// roomKey is how reservations are filed: room and epoch alone, so that a
// message naming a live room with a wrong capability is told apart from a
// late one (and counted as what it is).
func roomKey(room, epoch uint64) transfer.Key { return transfer.Key{Room: room, Epoch: epoch} }

// find returns the live reservation a message names, if the message
// carries its capability. A wrong capability for a live room is a
// stranger's guess (or a member's bug): it is counted under rpc and
// answered exactly as an unknown room is. Called on the desk.
func (d *Decode) find(rpc string, room, epoch uint64, capability []byte) *reservation {
	res := d.rooms[roomKey(room, epoch)]
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
	if !res.lease.boundTo(k.Session[:], d.o.Guards.SessionBound) {
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
// reservation of pages would take a caller with reservations and counted
// pages past its bounds. The desk asks it next to the usage Reserve gives
// back on failure.
func (d *Decode) exceedsQuota(reservations, counted, pages int) bool {
	return (d.o.MaxReservationsPerPeer > 0 && reservations+1 > d.o.MaxReservationsPerPeer) ||
		(d.o.MaxPagesPerPeer > 0 && counted+pages > d.o.MaxPagesPerPeer)
}

// releasePeer gives back what admitPeer counted.
func (d *Decode) releasePeer(peer string, pages int) {
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
