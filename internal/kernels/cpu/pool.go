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
//
// Every operation is its own job value, handed to a worker through one
// atomic pointer that the worker empties when it takes it, so nothing a
// worker does after finishing one operation can touch the next one. run
// never returns, by a panic or otherwise, while a helper still works on its
// job: before, a caller whose range panicked (and was recovered above it)
// released the pool while a helper was still inside the old operation; the
// next operation's task was then overwritten by that helper's clean-up, and
// the helper called a nil function.
type pool struct {
	mu      sync.Mutex // held by the one caller dispatching on the pool
	workers []*worker
	yield   yielder // the caller's, under mu
}

type job struct {
	fn      func(lo, hi int)
	bounds  []int
	next    atomic.Int64 // next range to hand out
	pending atomic.Int32 // helpers that have not finished
	failed  atomic.Pointer[workerPanic]
}

// workerPanic carries a panic raised in a helper to the caller, which
// raises it again on its own goroutine (where it can be recovered) instead
// of the helper taking the whole process down.
type workerPanic struct{ v any }

type worker struct {
	job    atomic.Pointer[job] // posted, not yet taken
	parked atomic.Bool
	wake   chan struct{}
	yield  yielder
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
	p := newPool(threads)
	pools[threads] = p
	return p
}

func newPool(threads int) *pool {
	p := &pool{}
	for i := 1; i < threads; i++ {
		w := &worker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		go w.loop()
	}
	return p
}

func (w *worker) loop() {
	for {
		j := w.wait()
		j.help(&w.yield)
	}
}

// help runs ranges of j until none is left, then says it is done (also when
// a range panicked: the panic goes to the caller).
func (j *job) help(y *yielder) {
	defer func() {
		if r := recover(); r != nil {
			j.failed.CompareAndSwap(nil, &workerPanic{r})
			j.next.Store(int64(len(j.bounds))) // the others stop early
		}
		j.pending.Add(-1)
	}()
	j.work(y)
}

func (j *job) work(y *yielder) {
	n := len(j.bounds) - 1
	for {
		i := int(j.next.Add(1)) - 1
		if i >= n {
			return
		}
		j.fn(j.bounds[i], j.bounds[i+1])
		y.maybe(time.Now())
	}
}

// yieldEvery: a goroutine running ranges goes through the scheduler
// (runtime.Gosched) at least this often. The runtime's sysmon thread
// treats a goroutine that has not been rescheduled for 10 ms as hogging
// its P: it preempts it (a signal), takes the P while the goroutine is in
// C, and drops back to polling every 20 µs. A worker that finds the next
// job in its spin never reschedules, so during a prefill sysmon woke 1800
// times a second and each wake-up took a core from a gemm thread (perf
// sched: sysmon's usleep in 45% of the context switches). F16, 512 rows,
// 2 threads, medians of four interleaved rounds (BenchmarkMatMul1B):
// 2048x2048 241 -> 333 GFLOP/s, 256x2048 245 -> 281.
const yieldEvery = time.Millisecond

// yielder remembers when one goroutine (a worker, or the callers of a
// pool, one at a time under its mutex) last went through the scheduler.
type yielder struct{ last time.Time }

// maybe yields if yieldEvery has passed since the last time.
func (y *yielder) maybe(now time.Time) bool {
	if now.Sub(y.last) < yieldEvery {
		return false
	}
	runtime.Gosched()
	y.last = now
	return true
}

// spinChecks: the spinning loops (a worker waiting for a job, a caller
// for its helpers) test their atomic this many times between calls to
// runtime.Gosched. Each Gosched goes through the scheduler (its locks, the
// global run queue): called on every test, it was a tenth of a serving
// run's CPU profile; a few hundred nanoseconds of plain loads between
// calls still let other goroutines run within a microsecond or so.
const spinChecks = 64

// wait returns the next job posted to w.
func (w *worker) wait() *job {
	start := time.Now()
	for i := 0; ; i++ {
		for range spinChecks {
			if w.job.Load() != nil {
				break
			}
		}
		if j := w.job.Swap(nil); j != nil {
			return j
		}
		if i&15 == 15 && time.Since(start) > spinFor {
			break
		}
		runtime.Gosched()
	}
	for {
		w.parked.Store(true)
		if w.job.Load() != nil && w.parked.Swap(false) {
			// A job came before we parked; nobody will send.
		} else {
			<-w.wake // the poster cleared parked and sends exactly once
		}
		if j := w.job.Swap(nil); j != nil {
			return j
		}
	}
}

func (w *worker) post(j *job) {
	w.job.Store(j)
	if w.parked.Swap(false) {
		w.wake <- struct{}{}
	}
}

// run calls fn on each range bounds[i]..bounds[i+1], on the caller and up
// to threads-1 workers. If another operation holds the pool, everything
// runs on the caller, in order. A panic in any range is raised again on the
// caller once every helper has stopped.
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
	j := &job{fn: fn, bounds: bounds}
	j.pending.Store(int32(helpers))
	defer func() {
		// Runs on a panic too: the helpers must be out of this job before
		// the pool (and the caller's buffers) are handed to anyone else.
		if r := recover(); r != nil {
			j.next.Store(int64(n))
			j.retract(p.workers[:helpers])
			j.join()
			panic(r)
		}
		j.retract(p.workers[:helpers])
		j.join()
		if f := j.failed.Load(); f != nil {
			panic(f.v)
		}
	}()
	for _, w := range p.workers[:helpers] {
		w.post(j)
	}
	j.work(&p.yield)
}

// retract takes j back from the workers that have not taken it yet, so
// the caller, having run every range itself, does not wait for a helper
// whose thread the OS has not run since the job was posted (on a 2-core
// machine a kernel thread holding the other core for milliseconds made
// such waits a decode step's tail). A worker that took j finishes it.
func (j *job) retract(ws []*worker) {
	for _, w := range ws {
		if w.job.CompareAndSwap(j, nil) {
			j.pending.Add(-1)
		}
	}
}

func (j *job) join() {
	for j.pending.Load() != 0 {
		for i := 0; i < spinChecks && j.pending.Load() != 0; i++ {
		}
		if j.pending.Load() != 0 {
			runtime.Gosched()
		}
	}
}
