package scheduler

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// workClock measures the CPU time the calling goroutine spends between
// start and the returned stop, by locking it to its thread and reading the
// thread's CPU clock: a mask's cost is the work the grammar took, not the
// time it waited for a core on a loaded machine, so a budget counted in it
// does not fail a request because its neighbours were busy.
func workClock() (stop func() time.Duration) {
	runtime.LockOSThread()
	start, ok := threadCPU()
	wall := time.Now()
	return func() time.Duration {
		defer runtime.UnlockOSThread()
		if end, ok2 := threadCPU(); ok && ok2 {
			return end - start
		}
		return time.Since(wall)
	}
}

func threadCPU() (time.Duration, bool) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0, false
	}
	return time.Duration(ts.Nano()), true
}
