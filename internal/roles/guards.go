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
