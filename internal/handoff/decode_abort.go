package handoff

import (
	"time"

	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// Abort ends the reservation a message names wherever it is (the router's
// Abort: the client left, or the router gave the reservation up). False: no
// live reservation carries its capability, or its request had ended; the
// message is counted as late.
func (d *Decode) Abort(room, epoch uint64, capability []byte, why string) bool {
	aborted, _ := call(&d.inbox, d.abortEvent(room, epoch, capability, why))
	return aborted
}

func (d *Decode) abortEvent(room, epoch uint64, capability []byte, why string) func(answer func(bool)) {
	return func(answer func(bool)) {
		res := d.find("Abort", room, epoch, capability)
		if res == nil {
			d.o.Metrics.LateDropped.WithLabelValues("abort").Inc()
			answer(false)
			return
		}
		d.on(res, func() {
			d.abort(res, why, func(ok bool) {
				if !ok {
					d.o.Metrics.LateDropped.WithLabelValues("abort").Inc()
				} else {
					res.traceAbort("abort")
				}
				answer(ok)
			})
		})
	}
}

// Finish finishes the request a message names now (a stop string matched
// at the router).
func (d *Decode) Finish(room, epoch uint64, capability []byte) {
	d.post(func() {
		if res := d.find("Finish", room, epoch, capability); res != nil {
			res.r.Stop()
		}
	})
}

// Drained is the writer's word that nothing of it is in flight.
func (d *Decode) Drained(room, epoch uint64, capability []byte, writer string) {
	call(&d.inbox, d.drainedEvent(room, epoch, capability, writer))
}

func (d *Decode) drainedEvent(room, epoch uint64, capability []byte, writer string) func(answer func(struct{})) {
	return func(answer func(struct{})) {
		res := d.find("Drained", room, epoch, capability)
		if res == nil || writer != res.writer {
			d.o.Metrics.LateDropped.WithLabelValues("drained").Inc()
			answer(struct{}{})
			return
		}
		d.on(res, func() {
			d.writerGone(res, true, "")
			answer(struct{}{})
		})
	}
}

// abort ends a reservation's request wherever it is, and then tells done
// whether it did. One in the batch is the engine's to end (its loop is the
// only goroutine that moves a request it may run, or touches its pages).
// One that had not joined is ended here, and left Draining while its
// writer holds the prompt pages: the writer is told to stop, and the pages
// stay quarantined until it says Drained or its session is proven closed.
func (d *Decode) abort(res *reservation, why string, done func(bool)) {
	if res.abortedAt.IsZero() {
		res.abortedAt = time.Now()
	}
	res.timer.Stop()
	if res.joined {
		var ok bool
		d.await(res, func() { ok = d.o.Engine.Abort(res.r, why) }, func() { done(ok) })
		return
	}
	if !res.ho.End(why, nil) {
		done(false)
		return
	}
	if res.r.State() != scheduler.StateDraining {
		done(true) // nothing held it: the writer was proven gone, or had let go
		return
	}
	res.log.Info("aborted before decode", "room", res.key.Room, "why", why)
	landed := !res.firstByte.IsZero()
	if !res.lease.isBound() || (!landed && !d.oneSided) {
		// No session was ever admitted for this reservation, so no
		// writer was given its pages; or, where the receiver writes
		// the pages itself, none of the admitted session's frames
		// landed. Either way the request is Draining now, every
		// admission and write is refused from here on, and nothing
		// can land, whether or not the writer is still reachable.
		d.writerGone(res, false, "no write landed and none is admitted from now on")
	}
	d.drain(res, why, landed, done)
}

// drain waits for the writer of an aborted reservation that still holds
// its pages: it is told to stop, and cut off by the receiver if it holds
// its session past the handoff timeout.
func (d *Decode) drain(res *reservation, why string, landed bool, done func(bool)) {
	if ev, ok := d.recv.(transfer.Evictor); ok && landed && writerHolds(res) {
		// A writer that neither drains nor closes within the handoff
		// timeout (gone wrong, or holding its connection to keep the pages
		// quarantined) is cut off by the receiver, whose goroutine's end
		// (Closed) is then the proof that nothing more lands.
		d.after(d.o.HandoffTimeout, res, func() {
			if writerHolds(res) {
				res.log.Warn("writer still holds its session after an abort; the receiver ends it", "room", res.key.Room)
				go ev.Evict(d.sessionKey(res))
			}
		})
	}
	if writerHolds(res) {
		d.o.Guards.DrainWait(func() { d.tellWriter(res, why) }, func(proof string) {
			d.post(func() { d.on(res, func() { d.writerGone(res, false, proof) }) })
		})
	}
	done(true)
}

// writerHolds says whether res's writer still holds its prompt pages: a
// function of the request's state.
func writerHolds(res *reservation) bool { return res.r.State().WriterHolds() }

// sessionKey names the session bound to res (the zero session if none
// was admitted).
func (d *Decode) sessionKey(res *reservation) transfer.Key {
	k := res.key
	res.lease.mu.Lock()
	k.Session = res.lease.session
	res.lease.mu.Unlock()
	return k
}

// waitForDrain is the drain_wait check (DecodeGuards.DrainWait): the
// writer is told to stop, and the pages stay quarantined until it answers
// Drained or its session is proven closed. The quarantine is the pool's
// and ends only through writerGone, the release the guard is handed and
// never calls.
func waitForDrain(tell func(), _ func(proof string)) { go tell() }

// writerGone records that res's writer let go of its prompt pages
// (drained: its word; else a transport's proof).
func (d *Decode) writerGone(res *reservation, drained bool, proof string) {
	if !res.ho.WriterGone(drained, proof) {
		kind := "drained"
		if !drained {
			kind = "closed"
		}
		d.o.Metrics.LateDropped.WithLabelValues(kind).Inc()
		return
	}
	if !res.abortedAt.IsZero() && res.r.State() == scheduler.StateAborted {
		d.o.Metrics.DrainWait.Observe(time.Since(res.abortedAt).Seconds())
	}
}

// tellWriter asks the prefill worker writing res to stop; it answers with
// Drained once nothing of it is in flight.
func (d *Decode) tellWriter(res *reservation, why string) {
	if d.o.Writers == nil {
		return
	}
	if err := d.o.Writers.Abort(res.writer, res.key, res.r.ID, why); err != nil {
		// The pages stay quarantined: only Drained or a transport proof frees them.
		res.log.Warn("abort to prefill failed; pages stay quarantined until the session is proven closed",
			"writer", res.writer, "err", err)
	}
}

// Reader is a reservation's one reader of its events (the router's Stream).
type Reader struct {
	d   *Decode
	res *reservation
}

// Read claims the events of the reservation a message names. A second
// reader is refused (Denied): it would split the tokens between two
// callers.
func (d *Decode) Read(room, epoch uint64, capability []byte) (*Reader, error) {
	type out struct {
		rd  *Reader
		err error
	}
	o, ok := call(&d.inbox, func(answer func(out)) {
		res := d.find("Stream", room, epoch, capability)
		switch {
		case res == nil:
			answer(out{err: refuse(NotFound, "no reservation room %d epoch %d", room, epoch)})
		case res.reader:
			d.authFailure("Stream")
			answer(out{err: refuse(Denied, "reservation room %d epoch %d is already being streamed", room, epoch)})
		default:
			res.reader = true
			answer(out{rd: &Reader{d, res}})
		}
	})
	if !ok {
		return nil, errStopped
	}
	return o.rd, o.err
}

// Request is the request whose events the reader takes.
func (rd *Reader) Request() *scheduler.Request { return rd.res.r }

// Gone ends the request: its reader went away.
func (rd *Reader) Gone(why string) {
	call(&rd.d.inbox, func(answer func(struct{})) {
		rd.d.on(rd.res, func() {
			rd.d.abort(rd.res, why, func(ok bool) {
				if ok {
					rd.res.traceAbort("reader_gone")
				}
				answer(struct{}{})
			})
		})
	})
}

// Done says the reader took the last event: the reservation is forgotten
// now if it has ended (one still Draining is forgotten by the sweep a
// minute after it ends).
func (rd *Reader) Done() {
	call(&rd.d.inbox, func(answer func(struct{})) {
		rd.d.forget(rd.res)
		answer(struct{}{})
	})
}
