package roles

import "github.com/batonlm/baton/internal/handoff"

// DecodeGuards and DecodeFaults are the decode desk's (internal/handoff),
// named here too so that a worker's options read as one list.
type (
	DecodeGuards = handoff.DecodeGuards
	DecodeFaults = handoff.DecodeFaults
)

// PrefillGuards are the prefill worker's plane checks, as the desk's DecodeGuards
// are decode's: a nil field is the real check, and only the faults build's
// command sets one.
type PrefillGuards struct {
	// DialKnown says whether a decode worker's word may make this worker dial addr: only if the router paired them (dial_known).
	DialKnown func(addr string) bool
}

// withChecks fills every field left nil with the real check, bound to p.
func (g PrefillGuards) withChecks(p *Prefill) PrefillGuards {
	if g.DialKnown == nil {
		g.DialKnown = p.knowsDecode
	}
	return g
}
