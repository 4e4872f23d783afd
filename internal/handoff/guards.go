package handoff

import (
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// DecodeGuards are the decode worker's handoff and plane checks, each the
// function the worker calls at that point, built from exported pieces so
// that what a worker without the check would do can be written outside
// this package. A nil field is the real check, so the zero value (what
// every build but the faults one passes) keeps every check; only the
// faults build's command (cmd/baton/guards_faults.go, BATON_GUARDS_OFF)
// sets a field. test/gates/README.md names the gate that shows each one.
type DecodeGuards struct {
	// LateDrop answers a frame for a reservation that no longer takes writes: dropped and counted, never unpacked (late_drop).
	LateDrop func(pool *kvpool.Pool, w transfer.PageWrite, why error) error
	// OwnerTag refuses page unless it is the page r's prompt pages give index, tagged as r's and allocated (owner_tag).
	OwnerTag func(pool *kvpool.Pool, r *scheduler.Request, prompt []int32, index int, page int32) error
	// HeldRecheck refuses a page r holds from the prefix cache unless it is ref's page, still cached, pinned and unchanged (held_recheck).
	HeldRecheck func(pool *kvpool.Pool, r *scheduler.Request, ref kvpool.SharedRef, page int32, buf []byte) ([]byte, error)
	// SessionBound says whether id names the transfer session admitted for a reservation (bound, session) (session_bind).
	SessionBound func(bound bool, session transfer.SessionID, id []byte) bool
	// TokenCoverage refuses a Commit whose tokens written are not the tokens reserved (coverage, over_claim).
	TokenCoverage func(written, reserved int) (reason string, err error)
	// PageCoverage refuses a shipped prompt page whose written tokens are not the want the prompt reaches into it (coverage).
	PageCoverage func(pool *kvpool.Pool, page int32, want int) error
	// ChecksumMatches says whether the checksum of what landed in a page is Commit's claim for it (checksum).
	ChecksumMatches func(got, claim uint64) bool
	// CapabilityMatches says whether a message carries its reservation's capability (capability).
	CapabilityMatches func(want transfer.Capability, got []byte) bool
	// OverQuota says whether one more reservation of pages takes a caller holding reservations and held pages past its bounds (peer_quota).
	OverQuota func(reservations, counted, pages int) bool
	// DrainWait asks an aborted reservation's writer to stop (tell) and keeps its pages quarantined until it answers; release, which the check never calls, would end the quarantine at once (drain_wait).
	DrainWait func(tell func(), release func(proof string))
}

// withChecks fills every field left nil with the real check, bound to d
// where the check reads the worker's own state.
func (g DecodeGuards) withChecks(d *Decode) DecodeGuards {
	if g.LateDrop == nil {
		g.LateDrop = d.dropLate
	}
	if g.OwnerTag == nil {
		g.OwnerTag = d.ownsPage
	}
	if g.HeldRecheck == nil {
		g.HeldRecheck = d.checkHeld
	}
	if g.SessionBound == nil {
		g.SessionBound = sameSession
	}
	if g.TokenCoverage == nil {
		g.TokenCoverage = tokensCovered
	}
	if g.PageCoverage == nil {
		g.PageCoverage = d.pageCovered
	}
	if g.ChecksumMatches == nil {
		g.ChecksumMatches = func(got, claim uint64) bool { return got == claim }
	}
	if g.CapabilityMatches == nil {
		g.CapabilityMatches = transfer.Capability.Matches
	}
	if g.OverQuota == nil {
		g.OverQuota = d.exceedsQuota
	}
	if g.DrainWait == nil {
		g.DrainWait = waitForDrain
	}
	return g
}

// DecodeFaults are faults only the faults build's command injects
// (cmd/baton/guards_faults.go, BATON_FAULTS); a nil field injects none.
type DecodeFaults struct {
	// Held sees a page a reservation holds from the prefix cache just before Commit re-checks it (held_corrupt).
	Held func(pool *kvpool.Pool, page int32)
	// Landed sees a shipped prompt page, tokens slots of it, just before Commit checks its coverage and checksum (flatten_landed).
	Landed func(pool *kvpool.Pool, page int32, tokens int)
}

// withNone fills every field left nil with what injects nothing.
func (f DecodeFaults) withNone() DecodeFaults {
	if f.Held == nil {
		f.Held = func(*kvpool.Pool, int32) {}
	}
	if f.Landed == nil {
		f.Landed = func(*kvpool.Pool, int32, int) {}
	}
	return f
}

// PrefillGuards are the prefill desk's plane checks, as DecodeGuards are
// decode's: a nil field is the real check, and only the faults build's
// command sets one.
type PrefillGuards struct {
	// DialKnown says whether a decode worker's word may make this worker dial addr: only if the router paired them (dial_known).
	DialKnown func(addr string) bool
}

// withChecks fills every field left nil with the real check, bound to d.
func (g PrefillGuards) withChecks(d *Prefill) PrefillGuards {
	if g.DialKnown == nil {
		g.DialKnown = d.knowsDecode
	}
	return g
}
