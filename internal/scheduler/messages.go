package scheduler

import (
	"errors"
	"fmt"

	"github.com/batonlm/baton/internal/model"
)

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
	msgCancel     msgKind = iota // abort the request wherever it is (Cancel, a decode abort)
	msgStop                      // finish it now: a stop string matched (Stop)
	msgFail                      // decode: fail a request that has not joined the batch
	msgCommit                    // decode: Commit arrived, its claims are about to be checked
	msgJoin                      // decode: Commit verified, into the batch
	msgWriterGone                // decode: the writer said Drained, or its session was proven closed
)

type message struct {
	kind    msgKind
	r       *Request
	why     string
	err     error
	first   model.Sampled
	drained bool
	proof   string
	reply   chan answer // nil: nobody waits
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

// preCommit are the decode states of a request that has not joined the
// batch. The loop ends such a request by a compare-and-move from them; the
// reserving worker moves it only forward among them (Reserved → Receiving
// on the first write).
var preCommit = []State{StateReserved, StateReceiving, StateLanded, StateAbandoned, StateVerifying}

// handle acts on the messages, in the order they were sent. Stop messages
// for requests not decoding yet wait in e.held and are tried again on the
// next round.
func (e *Engine) handle(msgs []message) {
	if len(e.held) > 0 {
		msgs = append(e.held, msgs...)
		e.held = nil
	}
	for _, m := range msgs {
		switch m.kind {
		case msgCancel:
			m.answer(e.cancel(m.r, m.why), nil)
		case msgStop:
			e.stop(m)
		case msgFail:
			m.answer(e.endPreCommit(m.r, m.err.Error(), m.err), nil)
		case msgCommit:
			m.answer(false, e.commitArrived(m.r))
		case msgJoin:
			m.answer(false, e.join(m.r, m.first))
		case msgWriterGone:
			m.answer(e.writerGone(m.r, m.drained, m.proof), nil)
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

// cancel aborts r wherever it is: waiting, ready, running or (decode) not
// yet in the batch. It reports whether it ended r.
func (e *Engine) cancel(r *Request, why string) bool {
	switch {
	case take(&e.waiting, r):
		e.dequeued()
		return e.abort(r, why)
	case take(&e.ready, r), take(&e.running, r):
		return e.abort(r, why)
	case r.life.Role() == RoleDecode:
		return e.endPreCommit(r, why, nil)
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
		e.held = append(e.held, m)
	}
}

// endPreCommit ends a decode request that has not joined the batch:
// Aborting, release, then Draining while its writer holds the prompt
// pages, else Aborted. err, if set, is what its client sees (a failed
// handoff check); otherwise it is an abort.
func (e *Engine) endPreCommit(r *Request, why string, err error) bool {
	from := r.life.State()
	if mv := r.life.Move(preCommit, StateAborting, why); mv != nil {
		return false // joined or ended already: not a request this can end
	}
	// A write may have moved it Reserved → Receiving since from was read:
	// the writer holds the pages in both, so from still answers.
	e.releaseAborting(r, from, why)
	if err != nil {
		e.m.Outcome("error")
		r.emit(Event{Finish: FinishError, Err: err})
	} else {
		e.m.Outcome("aborted")
		r.emit(Event{Finish: FinishAbort, Err: errors.New(why)})
	}
	return true
}

// commitArrived moves r to Verifying: no write lands from here on. Commit
// is the writer's word that everything it wrote has landed and it writes no
// more, so its hold on the prompt pages ends here, as a Drained would end
// it; a failed check then releases the pages at once.
func (e *Engine) commitArrived(r *Request) error {
	if err := r.life.Move([]State{StateReserved, StateReceiving, StateLanded}, StateVerifying, ""); err != nil {
		return err
	}
	e.poolErr(r, e.pool.WriterDrained(r.owner, r.promptPages))
	return nil
}

// join puts a verified decode request into the batch: its prompt KV is in
// its pages and first is the token prefill sampled.
func (e *Engine) join(r *Request, first model.Sampled) error {
	if err := r.life.Move([]State{StateVerifying}, StateCommitted, ""); err != nil {
		return err
	}
	r.seq = append([]int32(nil), r.Prompt...)
	r.first = &first
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

// writerGone acts on a writer letting go of r's prompt pages: its word
// (Drained) or a transport's proof that no further write can land. It
// reports false for a message that found no hold to end (a late one).
func (e *Engine) writerGone(r *Request, drained bool, proof string) bool {
	switch st := r.life.State(); {
	case st == StateDraining:
		if drained {
			e.poolErr(r, e.pool.WriterDrained(r.owner, r.promptPages))
		} else {
			e.poolErr(r, e.pool.WriterClosed(r.owner, r.promptPages, proof))
		}
		e.must(r, r.life.Move([]State{StateDraining}, StateAborted, ""))
		return true
	case !drained && st == StateReceiving:
		// The session closed before its Commit (a tcp writer closes, then
		// commits): what it wrote is in, and nothing more lands. The hold
		// ends at Commit, or with the abort, by this proof.
		e.must(r, r.life.Move([]State{StateReceiving}, StateLanded, ""))
		return true
	case drained && (st == StateReserved || st == StateReceiving || st == StateLanded):
		// The writer stopped without a Commit (a prefill that failed or
		// refused): its hold ends by its word. The request waits for the
		// router, which was told why, to abort it.
		if r.life.Move([]State{StateReserved, StateReceiving, StateLanded}, StateAbandoned, "") != nil {
			return false
		}
		e.poolErr(r, e.pool.WriterDrained(r.owner, r.promptPages))
		return true
	case !drained && (st == StateVerifying || st == StateCommitted || st == StateDecoding || st == StateFinished):
		// The writer let go at Commit; its session's close is expected.
		return true
	}
	return false
}

// Abort ends r wherever it is and reports whether it did: a decode request
// not yet in the batch is released here (its prompt pages wait in
// quarantine while the writer holds them, State Draining), one in the batch
// is torn down between steps. False: r had ended already, or the engine
// has stopped.
func (e *Engine) Abort(r *Request, why string) bool {
	return e.call(message{kind: msgCancel, r: r, why: why}).ok
}

// Fail fails a decode request that has not joined the batch with an error
// its client sees (a failed handoff check). False: it had joined or ended.
func (e *Engine) Fail(r *Request, err error) bool {
	return e.call(message{kind: msgFail, r: r, err: err}).ok
}

// CommitArrived moves a decode request to Verifying (no write lands from
// now on) and ends its writer's hold on the prompt pages: the Commit is
// the writer's word that it is done. An error: the request is no longer
// open for a Commit.
func (e *Engine) CommitArrived(r *Request) error {
	if r.life.Role() != RoleDecode || e.cfg.Role != RoleDecode {
		return fmt.Errorf("scheduler: CommitArrived is for decode requests on a decode engine")
	}
	return e.call(message{kind: msgCommit, r: r}).err
}

// Join puts a verified decode request (Verifying) into the batch: its
// prompt KV is in its pages and first is the token prefill sampled.
func (e *Engine) Join(r *Request, first model.Sampled) error {
	return e.call(message{kind: msgJoin, r: r, first: first}).err
}

// WriterGone records that r's writer let go of its prompt pages, with its
// word (drained: Drained) or a transport proof that no further write can
// land. A Draining request's pages leave quarantine and it is Aborted; a
// request still receiving is Landed (session closed) or, on a Drained
// without a Commit, Abandoned (the hold ends by that word). False: there was no hold to end (a late
// message).
func (e *Engine) WriterGone(r *Request, drained bool, proof string) bool {
	return e.call(message{kind: msgWriterGone, r: r, drained: drained, proof: proof}).ok
}
