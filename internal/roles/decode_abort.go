package roles

import (
	"context"
	"time"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// testHookAbort, when set by a test, runs inside abortReserved just before
// it tries to end the request, so a test can order another goroutine's
// moves (a Commit, the engine taking the request) into that moment.
var testHookAbort func(*reservation)

// abortReserved ends a reservation's request wherever it is, through the
// engine loop (the only goroutine that moves a request it may run, or
// touches its pages). A request that had not joined the batch is left
// Draining while its writer holds the prompt pages: the writer is told to
// stop, and the pages stay quarantined until it says Drained or its
// session is proven closed.
func (d *Decode) abortReserved(res *reservation, why string) bool {
	res.mu.Lock()
	if res.abortedAt.IsZero() {
		res.abortedAt = time.Now()
	}
	res.mu.Unlock()
	res.timer.Stop()
	if testHookAbort != nil {
		testHookAbort(res)
	}
	if !d.o.Engine.Abort(res.r, why) {
		return false
	}
	if res.r.State() != scheduler.StateDraining {
		return true // freed by the engine: committed, or the writer was proven gone
	}
	d.o.Log.Info("aborted before decode", "request_id", res.r.ID, "room", res.key.Room, "why", why)
	res.mu.Lock()
	bound, landed := res.bound, !res.firstByte.IsZero()
	res.mu.Unlock()
	if !bound || (!landed && !d.oneSided) {
		// No session was ever admitted for this reservation, so no writer
		// was given its pages; or, where the receiver writes the pages
		// itself, none of the admitted session's frames landed. Either way
		// the request is Draining now, every admission and write is refused
		// from here on, and nothing can land, whether or not the writer is
		// still reachable.
		d.writerGone(res, false, "no write landed and none is admitted from now on")
	}
	if ev, ok := d.recv.(transfer.Evictor); ok && landed && d.writerHolds(res) {
		// A writer that neither drains nor closes within the handoff
		// timeout (gone wrong, or holding its connection to keep the pages
		// quarantined) is cut off by the receiver, whose goroutine's end
		// (Closed) is then the proof that nothing more lands.
		time.AfterFunc(d.o.HandoffTimeout, func() {
			if d.writerHolds(res) {
				d.o.Log.Warn("writer still holds its session after an abort; the receiver ends it", "request_id", res.r.ID, "room", res.key.Room)
				ev.Evict(res.sessionKey())
			}
		})
	}
	if d.writerHolds(res) {
		d.o.Guards.DrainWait(func() { d.tellWriter(res, why) }, func(proof string) { d.writerGone(res, false, proof) })
	}
	return true
}

// writerHolds says whether res's writer still holds its prompt pages: a
// function of the request's state.
func (d *Decode) writerHolds(res *reservation) bool { return res.r.State().WriterHolds() }

// waitForDrain is the drain_wait check (DecodeGuards.DrainWait): the
// writer is told to stop, and the pages stay quarantined until it answers
// Drained or its session is proven closed. The quarantine is the engine's
// and ends only through writerGone, the release the guard is handed and
// never calls.
func waitForDrain(tell func(), _ func(proof string)) { go tell() }

func (d *Decode) writerGone(res *reservation, drained bool, proof string) {
	if !d.o.Engine.WriterGone(res.r, drained, proof) {
		kind := "drained"
		if !drained {
			kind = "closed"
		}
		d.o.Metrics.LateDropped.WithLabelValues(kind).Inc()
		return
	}
	res.mu.Lock()
	if !res.abortedAt.IsZero() && res.r.State() == scheduler.StateAborted {
		d.o.Metrics.DrainWait.Observe(time.Since(res.abortedAt).Seconds())
	}
	res.mu.Unlock()
}

// tellWriter sends Abort to the prefill worker writing res; it answers with
// Drained once nothing of it is in flight.
func (d *Decode) tellWriter(res *reservation, why string) {
	cc, err := d.peers.get(res.writer)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(withRequestID(context.Background(), res.r.ID), 10*time.Second)
	defer cancel()
	_, err = pdv1.NewPrefillClient(cc).Abort(ctx, &pdv1.AbortRequest{Room: res.key.Room, Epoch: res.key.Epoch, Reason: why,
		RequestId: res.r.ID, DecodeAddr: d.grpcAddr, Capability: res.key.Cap[:]})
	if err != nil {
		// The pages stay quarantined: only Drained or a transport proof frees them.
		d.o.Log.Warn("abort to prefill failed; pages stay quarantined until the session is proven closed",
			"request_id", res.r.ID, "writer", res.writer, "err", err)
	}
}

// Abort implements the RPC: the router ends a request wherever it is (the
// client left, or the router gave the reservation up before or during its
// handoff).
func (d *Decode) Abort(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	res := d.find("Abort", a.Room, a.Epoch, a.Capability)
	if res == nil || !d.abortReserved(res, "aborted: "+a.Reason) {
		d.o.Metrics.LateDropped.WithLabelValues("abort").Inc()
	}
	return &pdv1.Ack{}, nil
}

// Finish implements the RPC (a stop string matched at the router).
func (d *Decode) Finish(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	if res := d.find("Finish", a.Room, a.Epoch, a.Capability); res != nil {
		res.r.Stop()
	}
	return &pdv1.Ack{}, nil
}

// Drained implements the RPC: the writer's word that nothing of it is in flight.
func (d *Decode) Drained(ctx context.Context, dr *pdv1.DrainedRequest) (*pdv1.Ack, error) {
	res := d.find("Drained", dr.Room, dr.Epoch, dr.Capability)
	if res == nil || dr.Writer != res.writer {
		d.o.Metrics.LateDropped.WithLabelValues("drained").Inc()
		return &pdv1.Ack{}, nil
	}
	d.writerGone(res, true, "")
	return &pdv1.Ack{}, nil
}
