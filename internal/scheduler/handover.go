package scheduler

import (
	"errors"

	"github.com/batonlm/baton/internal/model"
)

// A Handover is a decode request between Reserve and Enqueue: the engine
// set its pages aside, but its prompt KV comes from a writer on another
// worker, and until every claim about it is checked the request is not the
// engine's. Its holder (the decode desk, internal/handoff) is the one
// goroutine that makes its moves, from Reserved to Verifying or to its
// end; the engine loop never sees it before Enqueue, so no move of it
// waits on a step. The transport's goroutines move it only forward, and
// only Reserved → Receiving on the first write (a compare-and-move, which
// every move here is too).
//
// The pool calls here are the pool's own (it locks); the request's events
// and the engine's counters are safe from any goroutine.
type Handover struct {
	r *Request
	e *Engine
}

// unjoined are the decode states of a request that has not joined the
// batch: the states a Handover may end.
var unjoined = []State{StateReserved, StateReceiving, StateSealed, StateAbandoned, StateVerifying}

// Request is the handed-over request.
func (h *Handover) Request() *Request { return h.r }

// CommitArrived moves the request to Verifying: no write lands from here
// on. Commit is the writer's word that everything it wrote has landed and
// it writes no more, so its hold on the prompt pages ends here, as a
// Drained would end it; a failed check then releases the pages at once.
// An error: the request is no longer open for a Commit.
func (h *Handover) CommitArrived() error {
	r, e := h.r, h.e
	if err := r.life.Move([]State{StateReserved, StateReceiving, StateSealed}, StateVerifying, ""); err != nil {
		return err
	}
	e.poolErr(r, e.pool.WriterDone(r.owner, r.promptPages))
	return nil
}

// Verified records the token prefill sampled, once Commit's checks have
// passed; Enqueue then puts the request into the batch.
func (h *Handover) Verified(first model.Sampled) error {
	if st := h.r.life.State(); st != StateVerifying {
		return errors.New("scheduler: a handed-over request is verified only in Verifying, not " + st.String())
	}
	h.r.first = &first
	return nil
}

// End ends a request that has not joined the batch: Aborting, release,
// then Draining while its writer holds the prompt pages, else Aborted.
// err, if set, is what its client sees (a failed handoff check);
// otherwise it is an abort. False: it had joined or ended already.
func (h *Handover) End(why string, err error) bool {
	r, e := h.r, h.e
	from := r.life.State()
	if mv := r.life.Move(unjoined, StateAborting, why); mv != nil {
		return false
	}
	// A write may have moved it Reserved → Receiving since from was read:
	// the writer holds the pages in both, so from still answers.
	owner, prompt := r.owner, r.promptPages
	_ = e.pool.Release(r.owner, r.pages) // a refusal is counted by the pool, which keeps the pages
	r.pages = nil
	switch {
	case from == StateSealed:
		// The writer's session was proven closed before the abort: nothing
		// more lands, so its hold ends now, by that proof.
		e.poolErr(r, e.pool.WriterClosed(owner, prompt, "the writer's session closed before the abort"))
		e.must(r, r.life.To(StateAborted, why))
	case from.WriterHolds():
		e.poolErr(r, nil)
		e.must(r, r.life.To(StateDraining, why))
	default:
		e.poolErr(r, nil)
		e.must(r, r.life.To(StateAborted, why))
	}
	if err != nil {
		e.m.Outcome("error")
		r.emit(Event{Finish: FinishError, Err: err})
	} else {
		e.m.Outcome("aborted")
		r.emit(Event{Finish: FinishAbort, Err: errors.New(why)})
	}
	return true
}

// WriterGone acts on the writer letting go of the prompt pages: its word
// (drained: Drained) or a transport's proof that no further write can
// land. A Draining request's pages leave quarantine and it is Aborted; one
// still receiving is Sealed (session closed) or, on a Drained without a
// Commit, Abandoned (the hold ends by that word, and the request waits for
// the abort). False: there was no hold to end (a late message).
func (h *Handover) WriterGone(drained bool, proof string) bool {
	r, e := h.r, h.e
	switch st := r.life.State(); {
	case st == StateDraining:
		if drained {
			e.poolErr(r, e.pool.WriterDone(r.owner, r.promptPages))
		} else {
			e.poolErr(r, e.pool.WriterClosed(r.owner, r.promptPages, proof))
		}
		e.must(r, r.life.Move([]State{StateDraining}, StateAborted, ""))
		return true
	case !drained && st == StateReceiving:
		// The session closed before its Commit (a tcp writer closes, then
		// commits): what it wrote is in, and nothing more lands. The hold
		// ends at Commit, or with the abort, by this proof.
		e.must(r, r.life.Move([]State{StateReceiving}, StateSealed, ""))
		return true
	case drained && (st == StateReserved || st == StateReceiving || st == StateSealed):
		// The writer stopped without a Commit (a prefill that failed or
		// refused): its hold ends by its word.
		if r.life.Move([]State{StateReserved, StateReceiving, StateSealed}, StateAbandoned, "") != nil {
			return false
		}
		e.poolErr(r, e.pool.WriterDone(r.owner, r.promptPages))
		return true
	case !drained && (st == StateVerifying || st == StateCommitted || st == StateDecoding || st == StateFinished):
		// The writer let go at Commit; its session's close is expected.
		return true
	}
	return false
}
