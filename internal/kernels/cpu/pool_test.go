package cpu

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// goid is the calling goroutine's id (tests only: it parses a stack trace).
func goid() uint64 {
	var buf [64]byte
	s := buf[:runtime.Stack(buf[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(s[:bytes.IndexByte(s, ' ')]), 10, 64)
	return id
}

// TestPoolStress: many goroutines share one pool; some of their operations
// end early because a range running on the submitting goroutine panics (a
// request aborted mid-forward, recovered above the kernels). Every
// operation must have run each range exactly once when it returns normally,
// no range of an operation may run after its run returned (its buffers
// belong to the caller again), and nothing may crash or hang.
func TestPoolStress(t *testing.T) {
	p := poolFor(4)
	const goroutines = 8
	iters := 3000
	if testing.Short() {
		iters = 500
	}
	var (
		late, wrong, panics atomic.Int64
		wg                  sync.WaitGroup
	)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			me := goid()
			for it := 0; it < iters; it++ {
				nr := 2 + rng.IntN(15)
				bounds := make([]int, nr+1)
				for i := range bounds {
					bounds[i] = i
				}
				counts := make([]atomic.Int32, nr)
				var done atomic.Bool
				abortAt := -1
				if rng.IntN(3) == 0 {
					abortAt = rng.IntN(nr)
				}
				spin := rng.IntN(2000)
				fn := func(lo, hi int) {
					if done.Load() {
						late.Add(1)
					}
					counts[lo].Add(1)
					if lo == abortAt && goid() == me {
						panic("abort")
					}
					x := 0
					for i := 0; i < spin; i++ {
						x += i
					}
					_ = x
				}
				func() {
					defer func() {
						done.Store(true)
						if r := recover(); r != nil {
							panics.Add(1)
							return
						}
						for i := range counts {
							if c := counts[i].Load(); c != 1 {
								wrong.Add(1)
							}
						}
					}()
					p.run(bounds, 4, fn)
				}()
			}
		}(uint64(g))
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(2 * time.Minute):
		t.Fatal("pool operations hung (a helper never reported done, or reported twice)")
	}
	// Give a straggling helper time to show itself.
	time.Sleep(10 * time.Millisecond)
	if n := late.Load(); n != 0 {
		t.Errorf("%d ranges ran after their operation returned", n)
	}
	if n := wrong.Load(); n != 0 {
		t.Errorf("%d operations returned with ranges not run exactly once", n)
	}
	t.Logf("%d goroutines x %d operations, %d ended by a panic on the caller", goroutines, iters, panics.Load())
}

// TestPoolHelperPanicReachesCaller: a panic in a range that a helper runs
// comes out of run on the caller's goroutine, after every helper stopped,
// and the pool keeps working.
func TestPoolHelperPanicReachesCaller(t *testing.T) {
	p := poolFor(4)
	for it := 0; it < 200; it++ {
		me := goid()
		bounds := []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
		var helped atomic.Bool
		got := func() (r any) {
			defer func() { r = recover() }()
			p.run(bounds, 4, func(lo, hi int) {
				if goid() != me {
					helped.Store(true)
					panic(fmt.Sprintf("range %d", lo))
				}
				time.Sleep(50 * time.Microsecond)
			})
			return nil
		}()
		if helped.Load() != (got != nil) {
			t.Fatalf("iteration %d: a helper panicked: %v, run panicked with %v", it, helped.Load(), got)
		}
	}
	var sum atomic.Int64
	p.run([]int{0, 10, 20, 30, 40}, 4, func(lo, hi int) { sum.Add(int64(hi - lo)) })
	if sum.Load() != 40 {
		t.Fatalf("pool after panics covered %d of 40", sum.Load())
	}
}

// TestPoolRunsWithoutAbsentHelper: a helper whose goroutine never runs (its
// thread held off the CPU) does not hold the caller once the caller has
// run every range itself, and the job it never took is not left for it to
// find later. Without the retraction run waits for that helper forever.
func TestPoolRunsWithoutAbsentHelper(t *testing.T) {
	absent := &worker{wake: make(chan struct{}, 1)} // no goroutine runs its loop
	p := &pool{workers: []*worker{absent}}
	done := make(chan int64)
	go func() {
		var sum atomic.Int64
		p.run([]int{0, 10, 20, 30, 40}, 2, func(lo, hi int) { sum.Add(int64(hi - lo)) })
		done <- sum.Load()
	}()
	select {
	case got := <-done:
		if got != 40 {
			t.Fatalf("ranges covered %d of 40", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run is still waiting for a helper that never took its job")
	}
	if j := absent.job.Load(); j != nil {
		t.Fatal("the job is still posted to the absent helper")
	}
}

// TestYielderEveryMillisecond: maybe yields on the first call and then
// once yieldEvery has passed, not before.
func TestYielderEveryMillisecond(t *testing.T) {
	var y yielder
	t0 := time.Now()
	if !y.maybe(t0) {
		t.Fatal("first call did not yield")
	}
	if y.maybe(t0.Add(yieldEvery / 2)) {
		t.Fatal("yielded within yieldEvery of the last yield")
	}
	if !y.maybe(t0.Add(yieldEvery)) {
		t.Fatal("did not yield yieldEvery after the last yield")
	}
}

// TestPoolRangesYield: a goroutine running long ranges goes through the
// scheduler between them, the caller included (the runtime preempts and
// takes the P of one that does not for 10 ms; see yieldEvery).
func TestPoolRangesYield(t *testing.T) {
	p := newPool(2)
	caller := goid()
	var helped atomic.Bool
	before := time.Now()
	p.run(cut(8, 1, 8), 2, func(lo, hi int) {
		if goid() != caller {
			helped.Store(true)
		}
		time.Sleep(2 * time.Millisecond)
	})
	if p.yield.last.Before(before) {
		t.Fatal("the caller ran 2 ms ranges without yielding")
	}
	// The helper may not have been scheduled before the caller ran every
	// range (then the job was taken back from it).
	if w := p.workers[0]; helped.Load() && w.yield.last.Before(before) {
		t.Fatal("the helper ran 2 ms ranges without yielding")
	}
	if !helped.Load() {
		t.Log("the helper took no range")
	}
}

// Parallel (host work on the pool's threads) covers [0, n) once, whatever
// n is against the ranges a pool cuts.
func TestParallelCoversEachItemOnce(t *testing.T) {
	for _, th := range []int{1, 2, 3} {
		b := New(th)
		for _, n := range []int{0, 1, 2, 5, 13, 100} {
			seen := make([]atomic.Int32, n)
			b.Parallel(n, func(lo, hi int) {
				for i := lo; i < hi; i++ {
					seen[i].Add(1)
				}
			})
			for i := range seen {
				if v := seen[i].Load(); v != 1 {
					t.Fatalf("threads %d, n %d: item %d ran %d times", th, n, i, v)
				}
			}
		}
	}
}
