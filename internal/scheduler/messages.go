package scheduler

import "errors"

// Messages to the engine loop. The loop is the only goroutine that moves a
// request it may run and the only one that touches such a request's pages
// (etcd raft's Step is the model: one place where state changes, no I/O
// inside). Every other goroutine — an HTTP reader, a decode worker's RPC
// handlers, a transport goroutine, a timer — sends a message and, where it
// needs the outcome, waits for the answer. The loop never waits on anyone:
// it takes the messages between steps (takeInbox) and answers each at once.
// An engine that has stopped answers ErrStopped.

// ErrStopped answers a message sent to an engine whose loop has returned.
var ErrStopped = errors.New("scheduler: the engine has stopped")

type msgKind int

const (
	msgCancel  msgKind = iota // abort the request wherever it is (Cancel, a decode abort)
	msgStop                   // finish it now: a stop string matched (Stop)
	msgEnqueue                // decode: a verified handover, into the batch
)

type message struct {
	kind  msgKind
	r     *Request
	why   string
	reply chan answer // nil: nobody waits
}

type answer struct {
	ok  bool
	err error
}

func (m message) answer(ok bool, err error) {
	if m.reply != nil {
		m.reply <- answer{ok, err}
	}
}

// post queues m for the loop; false when the engine has stopped.
func (e *Engine) post(m message) bool {
	e.mu.Lock()
	if e.stopped {
		e.mu.Unlock()
		return false
	}
	e.msgs = append(e.msgs, m)
	e.mu.Unlock()
	e.poke()
	return true
}

// call sends m and waits for the loop's answer. Never call it from the
// loop (OnChunk, OnEnd): the loop would wait on itself.
func (e *Engine) call(m message) answer {
	m.reply = make(chan answer, 1)
	if !e.post(m) {
		return answer{err: ErrStopped}
	}
	return <-m.reply
}

// handle acts on the messages, in the order they were sent. Stop messages
// for requests not decoding yet wait in e.deferredStops and are tried again on the
// next round.
func (e *Engine) handle(msgs []message) {
	if len(e.deferredStops) > 0 {
		msgs = append(e.deferredStops, msgs...)
		e.deferredStops = nil
	}
	for _, m := range msgs {
		switch m.kind {
		case msgCancel:
			m.answer(e.cancel(m.r, m.why), nil)
		case msgStop:
			e.stop(m)
		case msgEnqueue:
			m.answer(false, e.join(m.r))
		}
	}
}

// take removes r from *q, reporting whether it was there.
func take(q *[]*Request, r *Request) bool {
	for i, x := range *q {
		if x == r {
			*q = append((*q)[:i], (*q)[i+1:]...)
			return true
		}
	}
	return false
}

// cancel aborts r wherever it is: waiting, ready or running. It reports
// whether it ended r. A decode request not yet in the batch is not the
// loop's: its Handover's holder ends it.
func (e *Engine) cancel(r *Request, why string) bool {
	switch {
	case take(&e.waiting, r):
		e.dequeued()
		return e.abort(r, why)
	case take(&e.ready, r), take(&e.running, r):
		return e.abort(r, why)
	}
	return false // not the loop's (ended, or a prefill past its last chunk)
}

// stop finishes a decoding request now; one still waiting ends as a
// cancel does, and one running but not decoding yet (re-admitted after a
// preemption, or a decode request before it joins) keeps the message.
func (e *Engine) stop(m message) {
	r := m.r
	switch {
	case take(&e.waiting, r):
		e.dequeued()
		e.abort(r, "client cancelled")
	case take(&e.ready, r):
		e.abort(r, "client cancelled")
	case r.life.State() == StateDecoding && take(&e.running, r):
		e.finish(r, FinishStop)
	case r.life.Live():
		e.deferredStops = append(e.deferredStops, m)
	}
}

// join puts a verified decode request into the batch: its prompt KV is in
// its pages and r.first is the token prefill sampled (Handover.Verified).
func (e *Engine) join(r *Request) error {
	if r.first == nil {
		return errors.New("scheduler: a handed-over request joins only once verified")
	}
	if err := r.life.Move([]State{StateVerifying}, StateCommitted, ""); err != nil {
		return err
	}
	r.seq = append([]int32(nil), r.Prompt...)
	r.computed = len(r.Prompt)
	// The same stream as prefill's, past the draw its first token took, so
	// a seeded request answers as it would standalone.
	r.rng = requestRNG(r.Params.Seed)
	if r.Params.Sampling.Draws() {
		r.rng.Float64()
	}
	e.ready = append(e.ready, r)
	return nil
}

// Abort ends r wherever it is in the engine and reports whether it did: it
// is torn down between steps. False: r had ended already, was never the
// engine's (a decode request before Enqueue: its Handover ends it), or the
// engine has stopped.
func (e *Engine) Abort(r *Request, why string) bool {
	return e.call(message{kind: msgCancel, r: r, why: why}).ok
}
