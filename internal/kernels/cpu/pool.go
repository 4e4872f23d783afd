package cpu

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// A pool runs the ranges of one parallel operation on threads-1 worker
// goroutines plus the caller, each range being one cgo call. Ranges are
// handed out dynamically (an atomic counter), and an operation is cut into
// a few ranges per thread, so a thread that the OS schedules late (other
// processes, other goroutines) just takes fewer of them.
//
// Workers spin (yielding with runtime.Gosched, so other goroutines still
// run) for spinFor after each task before parking on a channel. Waking a
// parked goroutine's thread costs 20-100 µs on the VMs this was measured
// on, more than a whole decode-sized MatMul; with workers spinning between
// the back-to-back operations of a forward pass, a 2-way split pays from a
// few µs of work on.
type pool struct {
	mu      sync.Mutex // held by the one caller dispatching on the pool
	workers []*worker
	pending atomic.Int32 // helpers still working
	next    atomic.Int64 // next range to hand out
}

type worker struct {
	seq    atomic.Uint64 // bumped to post a task
	parked atomic.Bool
	wake   chan struct{}
	fn     func()
	p      *pool
}

const spinFor = 200 * time.Microsecond

var (
	poolsMu sync.Mutex
	pools   = map[int]*pool{}
)

// poolFor returns the shared pool for the given thread count.
func poolFor(threads int) *pool {
	poolsMu.Lock()
	defer poolsMu.Unlock()
	if p := pools[threads]; p != nil {
		return p
	}
	p := &pool{}
	for i := 1; i < threads; i++ {
		w := &worker{wake: make(chan struct{}, 1), p: p}
		p.workers = append(p.workers, w)
		go w.loop()
	}
	pools[threads] = p
	return p
}

func (w *worker) loop() {
	var seen uint64
	for {
		w.wait(seen)
		seen = w.seq.Load()
		w.fn()
		w.fn = nil
		w.p.pending.Add(-1)
	}
}

// wait returns once seq differs from seen.
func (w *worker) wait(seen uint64) {
	start := time.Now()
	for i := 0; ; i++ {
		if w.seq.Load() != seen {
			return
		}
		if i&63 == 63 && time.Since(start) > spinFor {
			break
		}
		runtime.Gosched()
	}
	w.parked.Store(true)
	if w.seq.Load() != seen && w.parked.Swap(false) {
		return // a task came before we parked; nobody will send
	}
	<-w.wake // the poster cleared parked and sends exactly once
}

func (w *worker) post(fn func()) {
	w.fn = fn
	w.seq.Add(1)
	if w.parked.Swap(false) {
		w.wake <- struct{}{}
	}
}

// run calls fn on each range bounds[i]..bounds[i+1], on the caller and up
// to threads-1 workers. If another operation holds the pool, everything
// runs on the caller, in order.
func (p *pool) run(bounds []int, threads int, fn func(lo, hi int)) {
	n := len(bounds) - 1
	helpers := min(threads-1, n-1, len(p.workers))
	if helpers <= 0 || !p.mu.TryLock() {
		for i := 0; i < n; i++ {
			fn(bounds[i], bounds[i+1])
		}
		return
	}
	defer p.mu.Unlock()
	p.next.Store(0)
	p.pending.Store(int32(helpers))
	task := func() {
		for {
			i := int(p.next.Add(1)) - 1
			if i >= n {
				return
			}
			fn(bounds[i], bounds[i+1])
		}
	}
	for _, w := range p.workers[:helpers] {
		w.post(task)
	}
	task()
	for p.pending.Load() != 0 {
		runtime.Gosched()
	}
}
