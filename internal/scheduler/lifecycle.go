package scheduler

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Role is the part a worker plays for a request; each role has its own
// state machine (DESIGN.md, "The request lifecycle: one state machine").
type Role int

// Roles.
const (
	RoleStandalone Role = iota // prefill and decode in one process, no transport
	RolePrefill                // computes the prompt's KV and writes it into a decode worker's pages
	RoleDecode                 // reserves pages, receives the prompt's KV, generates
)

func (r Role) String() string {
	switch r {
	case RoleStandalone:
		return "standalone"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// State is where a request is in its lifecycle. The zero value is not a
// state: a Lifecycle not made by NewLifecycle accepts no move at all, rather
// than silently starting somewhere.
type State int

// States. Which ones a request passes through depends on its Role; the
// terminal ones are Rejected, Finished, Aborted, Sent and Drained.
const (
	StateReceived   State = iota + 1 // validation and capacity checks happen here, nothing held
	StateRejected                    // terminal: refused in Received, allocated nothing
	StateAdmitted                    // standalone, prefill: passed admission, waiting for compute
	StatePrefilling                  // standalone, prefill: prompt chunks being computed
	StateSending                     // prefill: last chunk done, writes flushing, Commit being sent
	StateSent                        // prefill, terminal: Commit sent after every write completed
	StateReserved                    // decode: pages reserved for the prompt
	StateReceiving                   // decode: a writer has the pages' addresses and is writing
	StateCommitted                   // decode: Commit verified, waiting to join the decode batch
	StateDecoding                    // standalone, decode: generating tokens
	StateFinished                    // terminal: generation ended normally
	StateAborting                    // tearing down; no new work, no new messages accepted
	StateDraining                    // decode: aborted, waiting for the writer to prove no write is in flight
	StateAborted                     // standalone, decode, terminal: torn down, pages released
	StateDrained                     // prefill, terminal: torn down after in-flight writes completed and decode was told
	StatePreempted                   // standalone: taken off the batch, waiting for re-admission; see Lifecycle
	StateVerifying                   // decode: Commit arrived (the writer's word that it is done); no write lands while its claims are checked
	StateSealed                      // decode: the writer's session closed before Commit; what it wrote stays, nothing more lands
	StateAbandoned                   // decode: the writer said Drained without a Commit; its hold ended, the request waits for its abort
	numStates
)

var stateNames = [numStates]string{
	StateReceived:   "Received",
	StateRejected:   "Rejected",
	StateAdmitted:   "Admitted",
	StatePrefilling: "Prefilling",
	StateSending:    "Sending",
	StateSent:       "Sent",
	StateReserved:   "Reserved",
	StateReceiving:  "Receiving",
	StateCommitted:  "Committed",
	StateDecoding:   "Decoding",
	StateFinished:   "Finished",
	StateAborting:   "Aborting",
	StateDraining:   "Draining",
	StateAborted:    "Aborted",
	StateDrained:    "Drained",
	StatePreempted:  "Preempted",
	StateVerifying:  "Verifying",
	StateSealed:     "Sealed",
	StateAbandoned:  "Abandoned",
}

func (s State) String() string {
	if s > 0 && s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Terminal reports whether s is an end state. A terminal request holds no
// pages, no transport session and no queue slot.
func (s State) Terminal() bool {
	switch s {
	case StateRejected, StateFinished, StateAborted, StateSent, StateDrained:
		return true
	}
	return false
}

// Live reports whether s is on a request's forward path: not terminal and
// not being torn down. Only a live request can be aborted, and only a live
// request's messages (writes, commits) may touch its pages.
func (s State) Live() bool {
	return s > 0 && s < numStates && !s.Terminal() && s != StateAborting && s != StateDraining
}

// WriterHolds reports whether, in state s, a decode request's transfer
// writer still holds its prompt pages: from Reserve until Commit (the
// writer's word that it is done), and while an abort waits for its proof
// (Draining). Sealed counts: the session's close is proven, but the pool
// still names the writer until the request is committed or torn down;
// Abandoned does not (the writer's Drained ended its hold). It
// is a function of the state alone, so there is no second field to drift.
func (s State) WriterHolds() bool {
	switch s {
	case StateReserved, StateReceiving, StateSealed, StateDraining:
		return true
	}
	return false
}

// ErrIllegalTransition is what every refused move matches with errors.Is.
var ErrIllegalTransition = errors.New("scheduler: illegal lifecycle transition")

// ErrNoReason: a move to Rejected or Aborting needs a reason, because the
// client is answered with it.
var ErrNoReason = errors.New("scheduler: reject or abort without a reason")

// TransitionError is a refused move; it names the role and both states.
type TransitionError struct {
	Role     Role
	From, To State
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("scheduler: %s request: illegal move %s → %s", e.Role, e.From, e.To)
}

// Is makes a TransitionError match ErrIllegalTransition.
func (e *TransitionError) Is(target error) bool { return target == ErrIllegalTransition }

// moves lists each role's legal moves, as DESIGN.md draws them, plus the
// preemption moves described on Lifecycle. It is the only place legality is
// decided, and it depends on the state alone.
var moves = map[Role][][2]State{
	RoleStandalone: {
		{StateReceived, StateRejected},
		{StateReceived, StateAdmitted},
		{StateAdmitted, StatePrefilling},
		{StatePrefilling, StateDecoding},
		{StateDecoding, StateFinished},
		// Preemption and re-admission (see Lifecycle).
		{StatePrefilling, StatePreempted},
		{StateDecoding, StatePreempted},
		{StatePreempted, StateAdmitted},
		{StateReceived, StateAborting},
		{StateAdmitted, StateAborting},
		{StatePrefilling, StateAborting},
		{StateDecoding, StateAborting},
		{StatePreempted, StateAborting},
		{StateAborting, StateAborted},
	},
	RolePrefill: {
		{StateReceived, StateRejected},
		{StateReceived, StateAdmitted},
		{StateAdmitted, StatePrefilling},
		{StatePrefilling, StateSending},
		{StateSending, StateSent},
		{StateReceived, StateAborting},
		{StateAdmitted, StateAborting},
		{StatePrefilling, StateAborting},
		{StateSending, StateAborting},
		{StateAborting, StateDrained},
	},
	RoleDecode: {
		{StateReceived, StateRejected},
		{StateReceived, StateReserved},
		{StateReserved, StateReceiving},
		{StateReserved, StateVerifying},
		{StateReceiving, StateVerifying},
		{StateReceiving, StateSealed},
		{StateSealed, StateVerifying},
		{StateReserved, StateAbandoned},
		{StateReceiving, StateAbandoned},
		{StateSealed, StateAbandoned},
		{StateVerifying, StateCommitted},
		{StateCommitted, StateDecoding},
		{StateDecoding, StateFinished},
		{StateReceived, StateAborting},
		{StateReserved, StateAborting},
		{StateReceiving, StateAborting},
		{StateSealed, StateAborting},
		{StateAbandoned, StateAborting},
		{StateVerifying, StateAborting},
		{StateCommitted, StateAborting},
		{StateDecoding, StateAborting},
		{StateAborting, StateDraining},
		{StateAborting, StateAborted},
		{StateDraining, StateAborted},
	},
}

// legal[role][from] is a bit set of the states from may move to.
var legal = func() (t [3][numStates]uint32) {
	for role, ms := range moves {
		for _, m := range ms {
			t[role][m[0]] |= 1 << m[1]
		}
	}
	return t
}()

// Lifecycle is a request's one state field and the only function that
// changes it, so that every gate (admission, batch building, transfer,
// release) asks the same question of the same field. There is no second
// "pending" field: a reject or abort is a move, visible at once to everyone.
//
// Preemption (standalone only). A running request taken off the batch to
// make room moves Prefilling or Decoding → Preempted and waits in the queue;
// re-admission moves it Preempted → Admitted, and from there it runs again
// like any admitted request (Prefilling, then Decoding). It keeps
// its room, its tokens (prompt and generated so far) and its sampler state;
// whether it also keeps its pages or recomputes its KV is the engine's
// choice. Preempted is a state rather than something guessed from what the
// request holds: it cannot be rejected (Rejected is reachable only from
// Received), and the admission gate tells a re-admission from a new request
// by this state alone.
//
// Prefill and decode roles have no preemption: a prefill is writing into
// another worker's pages, and decode's reservation is sized by the router;
// add the moves here when a decode engine needs them.
//
// Methods are safe for concurrent use: the engine loop moves the state while
// HTTP handlers read it.
type Lifecycle struct {
	role Role

	mu          sync.Mutex
	state       State
	reason      string
	preemptions int
	onEnd       func()
	// committed and started are when a decode request's Commit was
	// verified (Committed) and when the engine first took the request
	// into its batch (Admitted, or Decoding on decode): the edges of its
	// queue wait, read for tracing once the request has gone past them.
	committed, started time.Time
}

// NewLifecycle starts a request of the given role in Received.
func NewLifecycle(role Role) *Lifecycle {
	return &Lifecycle{role: role, state: StateReceived}
}

// Role is the role the lifecycle was made for.
func (l *Lifecycle) Role() Role { return l.role }

// State is the current state.
func (l *Lifecycle) State() State {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// OnEnd names f to run once, right after the move into a terminal state,
// on the goroutine that made it (outside the lock; f must not block). A
// worker counts a request as over there, instead of keeping its own
// "ended" flag beside the state. If the request has already ended, f runs
// now.
func (l *Lifecycle) OnEnd(f func()) {
	l.mu.Lock()
	ended := l.state.Terminal()
	if !ended {
		l.onEnd = f
	}
	l.mu.Unlock()
	if ended {
		f()
	}
}

// Terminal reports whether the request has ended (and must hold nothing).
func (l *Lifecycle) Terminal() bool { return l.State().Terminal() }

// Live reports whether the request is on its forward path; see State.Live.
func (l *Lifecycle) Live() bool { return l.State().Live() }

// Reason is why the request was rejected or aborted; empty otherwise.
func (l *Lifecycle) Reason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reason
}

// Times are when a decode request's Commit was verified and when the
// engine first took the request into its batch; zero until it has.
func (l *Lifecycle) Times() (committed, started time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.committed, l.started
}

// Requeued reports whether the request is waiting for re-admission after a
// preemption (state Preempted): admission must resume it, not treat it as
// new. It reads the state field; there is no separate flag to drift.
func (l *Lifecycle) Requeued() bool { return l.State() == StatePreempted }

// Preemptions counts how many times the request was preempted.
func (l *Lifecycle) Preemptions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.preemptions
}

// To moves the request to next, or returns an error (matching
// ErrIllegalTransition or ErrNoReason) and leaves everything unchanged.
// reason is required for Rejected and Aborting and kept; on other moves it
// is ignored, so that a later move cannot overwrite why a request ended.
func (l *Lifecycle) To(next State, reason string) error {
	l.mu.Lock()
	err := l.moveLocked(next, reason)
	return l.unlockAfter(err)
}

// Move is To from one of the states in from only: compare and move under
// the lifecycle's lock, so that two goroutines that both saw a state and
// both want to leave it cannot both act on it. Anything outside from is
// refused like an illegal move.
func (l *Lifecycle) Move(from []State, next State, reason string) error {
	l.mu.Lock()
	for _, f := range from {
		if l.state == f {
			return l.unlockAfter(l.moveLocked(next, reason))
		}
	}
	err := &TransitionError{Role: l.role, From: l.state, To: next}
	l.mu.Unlock()
	return err
}

// unlockAfter releases the lock after a move and, when the move ended the
// request, runs the OnEnd function (once: no move leaves a terminal state).
func (l *Lifecycle) unlockAfter(err error) error {
	var f func()
	if err == nil && l.state.Terminal() {
		f, l.onEnd = l.onEnd, nil
	}
	l.mu.Unlock()
	if f != nil {
		f()
	}
	return err
}

func (l *Lifecycle) moveLocked(next State, reason string) error {
	from := l.state
	if !l.allowed(from, next) {
		return &TransitionError{Role: l.role, From: from, To: next}
	}
	if (next == StateRejected || next == StateAborting) && reason == "" {
		return fmt.Errorf("%w: %s request: %s → %s", ErrNoReason, l.role, from, next)
	}
	switch next {
	case StateRejected, StateAborting:
		l.reason = reason
	case StatePreempted:
		l.preemptions++
	case StateCommitted:
		l.committed = time.Now()
	case StateAdmitted, StateDecoding:
		if l.started.IsZero() {
			l.started = time.Now()
		}
	}
	l.state = next
	return nil
}

func (l *Lifecycle) allowed(from, to State) bool {
	if l.role < RoleStandalone || l.role > RoleDecode || from <= 0 || from >= numStates || to <= 0 || to >= numStates {
		return false
	}
	return legal[l.role][from]&(1<<to) != 0
}
