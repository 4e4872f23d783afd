//go:build faults

package scheduler

import "github.com/batonlm/baton/internal/faults"

// With BATON_GUARDS_OFF=door every request passes the door: what a worker
// whose capacity checks were lost would take on.
func init() {
	if !faults.On(faults.GuardDoor) {
		door = func(*Engine, *Request) *RejectError { return nil }
	}
}
