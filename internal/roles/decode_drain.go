package roles

import (
	"context"
	"errors"
	"sync"
)

// errHandBack is the cause that ends a stream's wait for its next event
// when the worker hands its requests back.
var errHandBack = errors.New("decode worker draining: the request is handed back to the router")

// liveStreams are the Stream calls a decode worker serves, so that a drain
// can end each with a hand-back (HandBack).
type liveStreams struct {
	mu   sync.Mutex
	set  map[*context.CancelCauseFunc]struct{}
	back bool // HandBack ran: a stream opened from now on is handed back at once
}

// watch registers one Stream call; the context it returns ends with
// errHandBack when the worker hands its requests back (or with ctx).
// Call stop when the call returns.
func (d *Decode) watch(ctx context.Context) (hctx context.Context, stop func()) {
	hctx, cancel := context.WithCancelCause(ctx)
	l := &d.live
	l.mu.Lock()
	if l.back {
		cancel(errHandBack)
	} else {
		if l.set == nil {
			l.set = map[*context.CancelCauseFunc]struct{}{}
		}
		l.set[&cancel] = struct{}{}
	}
	l.mu.Unlock()
	return hctx, func() {
		l.mu.Lock()
		delete(l.set, &cancel)
		l.mu.Unlock()
		cancel(nil)
	}
}

// HandBack ends every request this worker streams to a router, and any
// stream opened later, with a hand-back: each is aborted through the
// desk (one in the batch by its engine, Engine.Abort; one still waiting for
// its Commit by the desk, its pages waiting for the writer's drain as
// after any abort), the tokens it generated before the abort still go out,
// and its last event is finish "drain" with code 503, on which the router
// goes on on another pair from the tokens the client has. A request that
// ended before the abort took ends as it would have. It returns how many
// streams it told. A draining worker calls it once its --drain-grace is
// over, so that it exits within seconds instead of waiting for its longest
// generation; call SetShuttingDown first, or new work keeps coming.
func (d *Decode) HandBack() int {
	l := &d.live
	l.mu.Lock()
	defer l.mu.Unlock()
	l.back = true
	n := len(l.set)
	for c := range l.set {
		(*c)(errHandBack)
	}
	clear(l.set)
	return n
}
