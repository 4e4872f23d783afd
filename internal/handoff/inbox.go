package handoff

import (
	"sync"
	"time"
)

// inbox is a desk's queue of events and the one goroutine (serve) that runs
// them, in the order they were posted. Both desks are one: RPC handlers,
// transport goroutines and timers post; only the desk's goroutine moves
// what it owns.
type inbox struct {
	mu   sync.Mutex // guards evs and the closing of stop
	evs  []func()
	wake chan struct{}
	stop chan struct{}
	done chan struct{} // closed when serve has returned
}

func newInbox() inbox {
	return inbox{wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// post queues ev for the desk; false once the desk has stopped.
func (b *inbox) post(ev func()) bool {
	b.mu.Lock()
	select {
	case <-b.stop:
		b.mu.Unlock()
		return false
	default:
	}
	b.evs = append(b.evs, ev)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return true
}

// queued is how many events wait to run (tests hold the desk and count).
func (b *inbox) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.evs)
}

// Close stops the desk's goroutine and waits for it. Events posted after
// it are dropped.
func (b *inbox) Close() {
	b.mu.Lock()
	select {
	case <-b.stop:
	default:
		close(b.stop)
	}
	b.mu.Unlock()
	<-b.done
}

// serve is the desk's goroutine: it runs the events as they come and, when
// every is positive, tick every that long.
func (b *inbox) serve(every time.Duration, tick func()) {
	defer close(b.done)
	var ticks <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		ticks = t.C
	}
	for {
		select {
		case <-b.stop:
			return
		case <-ticks:
			tick()
		case <-b.wake:
		}
		b.mu.Lock()
		evs := b.evs
		b.evs = nil
		b.mu.Unlock()
		for _, ev := range evs {
			ev()
		}
	}
}

// call runs ev on the desk and waits until it answers: an event may answer
// later, from an event of its own (after the engine loop answered). Never
// call it from the desk. False: the desk stopped, and no answer came.
func call[T any](b *inbox, ev func(answer func(T))) (T, bool) {
	reply := make(chan T, 1)
	if !b.post(func() { ev(func(v T) { reply <- v }) }) {
		var zero T
		return zero, false
	}
	select {
	case v := <-reply:
		return v, true
	case <-b.done:
		// The desk stopped with the event queued or waiting: no answer.
		select {
		case v := <-reply:
			return v, true
		default:
			var zero T
			return zero, false
		}
	}
}
