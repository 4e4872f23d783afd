package roles

import "github.com/batonlm/baton/internal/handoff"

// DecodeGuards, DecodeFaults and PrefillGuards are the desks'
// (internal/handoff), named here too so that a worker's options read as
// one list.
type (
	DecodeGuards  = handoff.DecodeGuards
	DecodeFaults  = handoff.DecodeFaults
	PrefillGuards = handoff.PrefillGuards
)

// DecodeDesk and PrefillDesk are the desks' own options, which a worker's
// options carry whole: the engine, pool, bounds, timeouts, guards and
// faults are set once, for the desk, and the worker reads them there.
type (
	DecodeDesk  = handoff.DecodeOptions
	PrefillDesk = handoff.PrefillOptions
)
