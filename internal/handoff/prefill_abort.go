package handoff

import (
	"errors"

	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// end tears a failed prefill down in the order the page rules need: close
// the session (after which nothing of it is in flight), then tell decode
// Drained, then Drained here. The moves are the desk's.
func (d *Prefill) end(id string, r *scheduler.Request, sess transfer.Session, t Ticket, why string) {
	if sess != nil {
		_ = sess.Close()
	}
	// Refused when the engine tore the request down first, which leaves it
	// Aborting just the same; anywhere else it is a bug.
	d.call(func() {
		if err := r.Lifecycle().Move(prefillLive, scheduler.StateAborting, why); err != nil && r.State() != scheduler.StateAborting {
			d.o.Metrics.IllegalMoves.Inc()
			d.o.Log.Error("prefill request not Aborting", "request_id", id, "err", err)
		}
	})
	d.drained(id, t.DecodeAddr, t.Key)
	d.call(func() {
		if err := r.Lifecycle().To(scheduler.StateDrained, ""); err != nil {
			d.o.Metrics.IllegalMoves.Inc()
			d.o.Log.Error("prefill request not Drained", "request_id", id, "err", err)
		}
	})
	d.o.Metrics.Outcome("drained")
}

// prefillLive are the states a prefill request is on its way in.
var prefillLive = []scheduler.State{scheduler.StateReceived, scheduler.StateAdmitted, scheduler.StatePrefilling, scheduler.StateSending}

// Refuse tells decode Drained for a reservation this worker refused before
// its request existed (shutting down, or the reservation does not fit).
func (d *Prefill) Refuse(id string, t Ticket) { d.drained(id, t.DecodeAddr, t.Key) }

// drained tells decode this worker has no write in flight for key and will
// issue none (on the caller's goroutine: it waits on decode).
func (d *Prefill) drained(id, decodeAddr string, key transfer.Key) {
	if err := d.o.Decoders.Drained(decodeAddr, id, key); err != nil {
		d.o.Log.Warn("drained not delivered; decode keeps the pages quarantined until the session is proven closed", "request_id", id, "err", err)
	}
}

// Abort stops writing for a room: a prefill in progress is cancelled and
// says Drained itself once its session is closed; for a room with nothing
// in progress, Drained goes at once, but only to a decode worker the router
// paired this worker with.
func (d *Prefill) Abort(requestID string, key transfer.Key, decodeAddr string) error {
	var err error
	ran := d.call(func() {
		if cancel, ok := d.active[key]; ok {
			cancel()
			return
		}
		if decodeAddr == "" {
			err = errors.New("abort without a decode address to answer")
			return
		}
		if !d.o.Guards.DialKnown(decodeAddr) {
			// The answer goes only where the router sent this worker
			// before; an address taken from the request alone is never
			// dialled.
			d.o.Metrics.InternalAuthFailures.WithLabelValues("Abort").Inc()
			err = refuse(Denied, "abort from a decode worker this prefill worker was never paired with")
			return
		}
		go d.drained(requestID, decodeAddr, key)
	})
	if !ran {
		return refuse(Stopped, "the prefill worker is stopping")
	}
	return err
}
