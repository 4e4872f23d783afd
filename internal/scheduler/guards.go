package scheduler

import "github.com/batonlm/baton/internal/kvpool"

// Guards are the engine's isolation checks, each the function the engine
// calls at that point. A nil field is the real check, so the zero value
// (what every build but the faults one passes) keeps every check; only
// the faults build's command (cmd/baton/guards_faults.go,
// BATON_GUARDS_OFF) sets a field, to what an engine without the check
// would do. test/gates/README.md names the gate that shows each one.
type Guards struct {
	// Door refuses at Received what the engine cannot hold or read (door).
	Door func(*Engine, *Request) *RejectError
	// ReadGate refuses a step that would read a page not the request's own and written (read_gate).
	ReadGate func(*Engine, *Request) error
	// WriteGate refuses a step that would store KV in positions [from, to) of a shared page (cache_write).
	WriteGate func(e *Engine, r *Request, from, to int) error
	// LoadWait says a request may step: every page it loads from a lower tier has landed (load_wait).
	LoadWait func(*Engine, *Request) bool
}

// withChecks fills every field left nil with the real check.
func (g Guards) withChecks() Guards {
	if g.Door == nil {
		g.Door = (*Engine).checkDoor
	}
	if g.ReadGate == nil {
		g.ReadGate = (*Engine).checkReadable
	}
	if g.WriteGate == nil {
		g.WriteGate = (*Engine).checkWritable
	}
	if g.LoadWait == nil {
		g.LoadWait = (*Engine).loadsEnded
	}
	return g
}

// Faults are faults only the faults build's command injects
// (cmd/baton/guards_faults.go, BATON_FAULTS); a nil field injects none.
type Faults struct {
	// Admitted sees a request's pages at admission, cached of its prompt
	// positions read from the prefix cache, and returns where its prefill
	// starts (cache_rewrite, cache_publish_early).
	Admitted func(r *Request, a kvpool.Allocation, cached int) int
}

// withNone fills every field left nil with what injects nothing.
func (f Faults) withNone() Faults {
	if f.Admitted == nil {
		f.Admitted = func(_ *Request, _ kvpool.Allocation, cached int) int { return cached }
	}
	return f
}
