//go:build faults

package scheduler

import "github.com/batonlm/baton/internal/faults"

func init() {
	// With BATON_GUARDS_OFF=load_wait a request steps while its pages
	// still load; only the read gate (load_ready) stands in the way.
	if !faults.On(faults.GuardLoadWait) {
		loadsEnded = func(*Engine, *Request) bool { return true }
	}
}
