package router

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/request"
)

// queue holds the requests that fit the decode pool but not what is free
// of it now: they wait here, in arrival order, instead of being refused.
// Only the head tries the workers again, so that a burst of waiters does
// not turn every freed page into a storm of Reserve calls, and the oldest
// request gets the room first.
type queue struct {
	max     int // most waiters; a request beyond them gets 429
	timeout time.Duration

	mu      sync.Mutex
	waiters []*waiter
}

type waiter struct {
	wake chan struct{} // one pending wake-up at most
	// deadline is when the request gives up: its first refusal plus the
	// queue timeout, however often it was woken meanwhile.
	deadline time.Time
	// poll is the head's next polling interval, doubled at each poll and
	// reset by a wake-up.
	poll time.Duration
}

const (
	// The head polls as well as waits for wake-ups: decode frees a page
	// only once its writer drained, some time after the stream that held
	// it ended, and other routers free pages this one hears nothing of.
	pollFirst = 20 * time.Millisecond
	pollMax   = time.Second
)

// join puts a request at the back of the queue; nil means it is full.
func (q *queue) join() *waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) >= q.max {
		return nil
	}
	w := &waiter{wake: make(chan struct{}, 1), deadline: time.Now().Add(q.timeout), poll: pollFirst}
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		w.signal()
	}
	return w
}

// leave takes w out of the queue and wakes the next head, which may fit
// in what is left.
func (q *queue) leave(w *waiter) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			break
		}
	}
	if len(q.waiters) > 0 {
		q.waiters[0].signal()
	}
}

// kick wakes the head: something that may have freed room happened.
func (q *queue) kick() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.waiters) > 0 {
		q.waiters[0].signal()
	}
}

func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}

func (q *queue) isHead(w *waiter) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters) > 0 && q.waiters[0] == w
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// mayFreeUp says whether waiting can help a request decode d refused for
// room. A full pool frees up as requests end. A refusal for the router's
// share of d does only if the router holds other reservations there: with
// none but this attempt's, the request alone is over the share, and waiting
// would only delay its 429.
func (r *Router) mayFreeUp(d *worker, f *failure) bool {
	if !f.perPeer() {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return d.inflight > 1
}

// Why a queued request gave up.
var (
	errQueueFull = func(max int) *request.RejectError {
		return &request.RejectError{Status: 429, Reason: "queue_full", RetryAfter: 1,
			Message: fmt.Sprintf("the router's queue is full (%d requests wait for decode KV cache); retry later", max)}
	}
	errQueueTimeout = func(d time.Duration) *request.RejectError {
		return &request.RejectError{Status: 429, Reason: "queue_timeout", RetryAfter: 1,
			Message: fmt.Sprintf("no decode worker had room for this request within the router's queue timeout (%s); retry later", d)}
	}
	// errClientLeft ends a wait whose client went away: nothing is
	// reserved, so nothing needs telling.
	errClientLeft   = errors.New("the client went away")
	errRouterClosed = &request.RejectError{Status: 503, Reason: "no_workers", Message: "the router is shutting down", RetryAfter: 1}
)

// await waits for the request's turn: woken as the head, polled at a
// growing interval while at the head, until its deadline, the client
// leaving or the router closing. nil means: try the workers again.
func (s *stream) await(w *waiter) error {
	q := &s.r.queue
	for {
		now := time.Now()
		if !now.Before(w.deadline) {
			return errQueueTimeout(q.timeout)
		}
		wait := w.deadline.Sub(now)
		head := q.isHead(w)
		if head {
			wait = min(wait, w.poll)
		}
		t := time.NewTimer(wait)
		select {
		case <-w.wake:
			t.Stop()
			if q.isHead(w) {
				w.poll = pollFirst
				return nil
			}
		case <-t.C:
			if head {
				w.poll = min(2*w.poll, pollMax)
				return nil
			}
		case <-s.quit:
			t.Stop()
			return errClientLeft
		case <-s.r.done:
			t.Stop()
			return errRouterClosed
		}
	}
}
