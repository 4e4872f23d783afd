// Package faults is the test-only switchboard for fault injection and for
// switching isolation guards off. It does anything only in binaries built
// with the `faults` build tag; in every other build Enabled is false, there
// is no fault spec and On does not exist, so a release binary cannot be
// configured into an unsafe mode.
//
// Release code has one path per guard and never asks whether a guard is on.
// A package with guards takes a Guards value in its options (roles: one
// per worker, DecodeGuards and PrefillGuards) whose zero value is every
// check; only the command's files built with the faults tag
// (cmd/baton/guards_faults.go, plane_faults.go) read On and fill it with
// what a worker without the check would do; injected faults reach the
// packages the same way, in a Faults value.
//
// In a faults build, two environment variables configure a process:
//
//	BATON_FAULTS="seed=7,corrupt=0.2,slow_writer=50ms,kill_after_frames=3"
//	BATON_GUARDS_OFF="checksum,drain_wait"
//
// Fault probabilities are per frame (frame faults) or per request (commit
// and drain faults); durations use Go syntax.
package faults

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Guards that BATON_GUARDS_OFF can switch off, each a check the page rules
// rely on. test/gates/README.md lists which gate test shows each one.
const (
	GuardDoor      = "door"       // capacity and context checks in Received
	GuardCoverage  = "coverage"   // Commit's tokens written == reserved, pages written
	GuardChecksum  = "checksum"   // Commit's per-page xxh3 against what landed
	GuardOwnerTag  = "owner_tag"  // a write lands only in a page of its own reservation
	GuardDrainWait = "drain_wait" // aborted pages wait in quarantine for their writer
	GuardLateDrop  = "late_drop"  // writes and drains for a room no longer open are dropped
	GuardReadGate  = "read_gate"  // every step reads only pages tagged as the request's own and written

	// The prefix cache's guards.
	GuardCacheWrite    = "cache_write"    // a step stores KV only in the request's own pages, never a shared one
	GuardCacheComplete = "cache_complete" // only a page written to its last slot, with no writer, becomes shared
	GuardCachePin      = "cache_pin"      // eviction takes only shared pages nobody pins
	GuardTenantSalt    = "tenant_salt"    // a tenant's lookups hash its own salt (API key, cache_salt)
	GuardHeldRecheck   = "held_recheck"   // decode's Commit re-checks the pages it holds from its cache

	// The hierarchical cache's guards (loads from host memory and files).
	GuardLoadWait  = "load_wait"  // the scheduler steps a request only once all its pages finished loading
	GuardLoadReady = "load_ready" // the read gate refuses a page that is still loading (read-before-ready)

	// The internal plane's guards: against a stranger, not a fault.
	GuardPeerAuth    = "peer_auth"    // gRPC calls and transfer sessions need cluster credentials and the right role
	GuardCapability  = "capability"   // every message about a reservation carries its capability
	GuardSessionBind = "session_bind" // frames, end of writing and Commit come only from the session decode admitted
	GuardDialKnown   = "dial_known"   // prefill dials only decode workers the router paired it with
	GuardPeerQuota   = "peer_quota"   // reservations per peer are bounded
)

// AllGuards lists every guard name.
var AllGuards = []string{GuardDoor, GuardCoverage, GuardChecksum, GuardOwnerTag, GuardDrainWait, GuardLateDrop, GuardReadGate,
	GuardCacheWrite, GuardCacheComplete, GuardCachePin, GuardTenantSalt, GuardHeldRecheck, GuardLoadWait, GuardLoadReady,
	GuardPeerAuth, GuardCapability, GuardSessionBind, GuardDialKnown, GuardPeerQuota}

// Spec is a parsed BATON_FAULTS.
type Spec struct {
	Seed uint64
	// per frame
	Drop, Duplicate, Reorder, Corrupt, WrongPage float64
	Delay                                        time.Duration // added before a frame, with probability DelayP
	DelayP                                       float64
	SlowWriter                                   time.Duration // added before every frame
	// per request
	ShortWrite, OverClaim, WrongEpoch, LostDrained float64
	// IgnoreAbort makes the writer carry on after decode asked it to stop,
	// so its writes keep arriving after the abort.
	IgnoreAbort bool
	// process
	KillAfterFrames int // SIGKILL this process after writing that many frames (0: never)
	// prefix cache (standalone engine)
	// CacheRewrite makes the first request that reads cached pages start
	// its prefill one page early, over different tokens: a write aimed at
	// a shared page.
	CacheRewrite bool
	// CachePublishEarly makes every request offer its prompt pages to the
	// cache at admission, before a token of them is written.
	CachePublishEarly bool
	// HeldCorrupt changes a page decode holds from its prefix cache just
	// before Commit re-checks it (decode side).
	HeldCorrupt bool
	// hierarchical cache
	// LoadDelay holds each load from a lower tier that long (times a
	// random factor in [0.5, 1.5) when LoadJitter, so loads finish out
	// of their order).
	LoadDelay  time.Duration
	LoadJitter bool
	// LoadCorrupt flips a byte of every loaded page before its checksum
	// is checked: each load must end as a miss.
	LoadCorrupt bool
	// FlattenLanded sets every K and V value of each prompt page that
	// landed on this decode worker to 1.0 just before Commit checks the
	// page (decode side): KV that no longer tells the prompt's positions
	// apart, which the checksum catches and, with it off, sends the
	// bundled model into repeating one token.
	FlattenLanded bool
}

// ParseSpec parses the BATON_FAULTS syntax.
func ParseSpec(s string) (*Spec, error) {
	sp := &Spec{Seed: 1}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("faults: %q is not key=value", kv)
		}
		var err error
		prob := func(dst *float64) {
			*dst, err = strconv.ParseFloat(v, 64)
			if err == nil && (*dst < 0 || *dst > 1) {
				err = fmt.Errorf("probability %v outside [0,1]", *dst)
			}
		}
		switch k {
		case "seed":
			sp.Seed, err = strconv.ParseUint(v, 10, 64)
		case "drop":
			prob(&sp.Drop)
		case "duplicate":
			prob(&sp.Duplicate)
		case "reorder":
			prob(&sp.Reorder)
		case "corrupt":
			prob(&sp.Corrupt)
		case "wrong_page":
			prob(&sp.WrongPage)
		case "delay":
			sp.Delay, err = time.ParseDuration(v)
			if sp.DelayP == 0 {
				sp.DelayP = 1
			}
		case "delay_p":
			prob(&sp.DelayP)
		case "slow_writer":
			sp.SlowWriter, err = time.ParseDuration(v)
		case "short_write":
			prob(&sp.ShortWrite)
		case "over_claim":
			prob(&sp.OverClaim)
		case "wrong_epoch":
			prob(&sp.WrongEpoch)
		case "lost_drained":
			prob(&sp.LostDrained)
		case "ignore_abort":
			sp.IgnoreAbort, err = strconv.ParseBool(v)
		case "kill_after_frames":
			sp.KillAfterFrames, err = strconv.Atoi(v)
		case "cache_rewrite":
			sp.CacheRewrite, err = strconv.ParseBool(v)
		case "cache_publish_early":
			sp.CachePublishEarly, err = strconv.ParseBool(v)
		case "held_corrupt":
			sp.HeldCorrupt, err = strconv.ParseBool(v)
		case "load_delay":
			sp.LoadDelay, err = time.ParseDuration(v)
		case "load_jitter":
			sp.LoadJitter, err = strconv.ParseBool(v)
		case "load_corrupt":
			sp.LoadCorrupt, err = strconv.ParseBool(v)
		case "flatten_landed":
			sp.FlattenLanded, err = strconv.ParseBool(v)
		default:
			return nil, fmt.Errorf("faults: unknown fault %q", k)
		}
		if err != nil {
			return nil, fmt.Errorf("faults: %s: %w", k, err)
		}
	}
	return sp, nil
}

// ParseGuards parses BATON_GUARDS_OFF.
func ParseGuards(s string) (map[string]bool, error) {
	off := map[string]bool{}
	for _, g := range strings.Split(s, ",") {
		g = strings.TrimSpace(g)
		if g == "" {
			continue
		}
		known := false
		for _, k := range AllGuards {
			known = known || k == g
		}
		if !known {
			return nil, fmt.Errorf("faults: unknown guard %q (known: %s)", g, strings.Join(AllGuards, ", "))
		}
		off[g] = true
	}
	return off, nil
}
