package handoff

import "fmt"

// Kind is why the desk refused a message, for the wire adapter to turn
// into its status code.
type Kind int

const (
	// NotFound: no live reservation carries the message's room, epoch and
	// capability.
	NotFound Kind = iota
	// Denied: the message is not from the one who may send it (another
	// session, a second reader).
	Denied
	// Precondition: the reservation is no longer in a state for it, or a
	// check of the handoff failed.
	Precondition
	// Exhausted: the caller holds its share of the pool.
	Exhausted
	// Stopped: the desk has stopped.
	Stopped
	// Unavailable: a peer could not be reached, or a transfer failed.
	Unavailable
	// Canceled: the caller left, or an Abort cancelled the prefill.
	Canceled
	// Failed: the engine failed the request (Err says why).
	Failed
	// Refused: decode refused the Commit (Err is its answer).
	Refused
	// Internal: a move the lifecycle refused.
	Internal
)

// Refusal is the desk's answer to a message it did not act on.
type Refusal struct {
	Kind Kind
	Msg  string
	Err  error // the cause, for Failed and Refused
}

func (r *Refusal) Error() string { return r.Msg }

func (r *Refusal) Unwrap() error { return r.Err }

func refuse(k Kind, format string, args ...any) *Refusal {
	return &Refusal{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

var errStopped = &Refusal{Kind: Stopped, Msg: "the decode worker is stopping"}
