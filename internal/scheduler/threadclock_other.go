//go:build !linux

package scheduler

import "time"

// workClock measures the wall time between start and the returned stop
// where no thread CPU clock is at hand (see threadclock_linux.go).
func workClock() (stop func() time.Duration) {
	start := time.Now()
	return func() time.Duration { return time.Since(start) }
}
