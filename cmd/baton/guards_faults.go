//go:build faults

package main

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// The guards BATON_GUARDS_OFF names are replaced by what a worker without
// the check would do, and BATON_FAULTS's injections are added; every
// package gets them through its options (guards.go).
func init() {
	off := func(g string) bool { return !faults.On(g) }
	if off(faults.GuardDoor) {
		// Every request passes the door: what a worker whose capacity
		// checks were lost would take on.
		guards.engine.Door = func(*scheduler.Engine, *scheduler.Request) *scheduler.RejectError { return nil }
	}
	if off(faults.GuardReadGate) {
		// Every step attends over whatever its pages hold, written or not,
		// its own or not.
		guards.engine.ReadGate = func(*scheduler.Engine, *scheduler.Request) error { return nil }
	}
	if off(faults.GuardCacheWrite) {
		// A step stores KV wherever its page table points, shared pages
		// included.
		guards.engine.WriteGate = func(*scheduler.Engine, *scheduler.Request, int, int) error { return nil }
	}
	if off(faults.GuardLoadWait) {
		// A request steps while its pages still load; only the read gate
		// (load_ready) stands in the way.
		guards.engine.LoadWait = func(*scheduler.Engine, *scheduler.Request) bool { return true }
	}
	if off(faults.GuardCacheComplete) {
		// Any page of its owner's can be shared, written or not, held by a
		// writer or not.
		guards.pool.Shareable = func(int32, kvpool.PageInfo, int) error { return nil }
	}
	if off(faults.GuardLoadReady) {
		// The read gate lets a step read a page of its own that is still
		// loading.
		guards.pool.Loading = func(kvpool.PageState) bool { return false }
	}
	// Without cache_pin eviction counts every shared page as spare and
	// takes pinned ones first: what a pool that forgot its readers would do.
	guards.pool.EvictPinned = off(faults.GuardCachePin)
	if off(faults.GuardTenantSalt) {
		// Every request is one tenant: its API key and cache_salt are
		// ignored.
		guards.cache.Tenant = func(prefixcache.Salt) prefixcache.Salt { return prefixcache.Salt{} }
	}
	workerGuards(off)
	sp := faults.Active()
	if sp == nil {
		return
	}
	if sp.HeldCorrupt {
		// The held page changes while cached (a stray write, a bad bit):
		// its first values are negated just before Commit looks at it.
		guards.decodeFaults.Held = func(pool *kvpool.Pool, page int32) {
			if data := pool.PageData(page); data != nil {
				for i := range min(len(data), 64) {
					data[i] = -data[i] - 1
				}
			}
		}
	}
	if sp.FlattenLanded {
		// Each landed prompt page's written slots become 1.0 just before
		// Commit checks the page: after the handoff, before the checksum.
		guards.decodeFaults.Landed = func(pool *kvpool.Pool, page int32, tokens int) {
			kv := pool.KV()
			if buf, err := transfer.ReadPage(kv, page, tokens, nil); err == nil && kv.DType == kernels.F32 {
				for i := 0; i+4 <= len(buf); i += 4 {
					binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(1))
				}
				_ = transfer.Unpack(kv, page, tokens, buf)
			}
		}
	}
	if sp.CacheRewrite || sp.CachePublishEarly {
		guards.engineFaults = cacheFaults(sp)
	}
	if d := sp.LoadDelay; d > 0 {
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(sp.Seed, sp.Seed^0x5bd1e995))
		jitter := sp.LoadJitter
		// Each page waits; with jitter the waits differ, so that the loads
		// of requests running at once end out of their order.
		guards.tiers.Fetch = func() {
			w := d
			if jitter {
				mu.Lock()
				w = time.Duration(float64(d) * (0.5 + rng.Float64()))
				mu.Unlock()
			}
			time.Sleep(w)
		}
	}
	if sp.LoadCorrupt {
		// An exponent bit of one element (the high byte of a float32 or a
		// half): a change attention notices, if it is ever read.
		guards.tiers.Landed = func(b []byte) {
			if i := len(b)/2 | 3; i < len(b) {
				b[i] ^= 0x40
			}
		}
	}
}

// workerGuards are the PD workers' handoff and plane guards (roles'
// DecodeGuards and PrefillGuards) that BATON_GUARDS_OFF names, each
// replaced by what a worker without the check would do.
func workerGuards(off func(string) bool) {
	if off(faults.GuardLateDrop) {
		// A frame for a reservation gone lands where it points, whoever
		// holds the page now.
		guards.decode.LateDrop = func(pool *kvpool.Pool, w transfer.PageWrite, _ error) error {
			if w.Page < 0 || int(w.Page) >= pool.NumPages() || w.Tokens <= 0 || w.Tokens > pool.PageSize() {
				return fmt.Errorf("page %d outside the pool", w.Page)
			}
			return transfer.Unpack(pool.KV(), w.Page, w.Tokens, w.Data)
		}
	}
	if off(faults.GuardOwnerTag) {
		// Any page of the pool is taken at its word; only the pool's bounds
		// keep the frame from writing past the KV.
		guards.decode.OwnerTag = func(pool *kvpool.Pool, _ *scheduler.Request, _ []int32, index int, page int32) error {
			if page < 0 || int(page) >= pool.NumPages() || index < 0 {
				return fmt.Errorf("page %d outside the pool", page)
			}
			return nil
		}
	}
	if off(faults.GuardHeldRecheck) {
		// A held page is taken as it is, whatever happened to it in the
		// cache.
		guards.decode.HeldRecheck = func(_ *kvpool.Pool, _ *scheduler.Request, _ kvpool.SharedRef, _ int32, buf []byte) ([]byte, error) {
			return buf, nil
		}
	}
	if off(faults.GuardSessionBind) {
		// Any session may write a reservation's pages and commit them.
		guards.decode.SessionBound = func(bool, transfer.SessionID, []byte) bool { return true }
	}
	if off(faults.GuardCoverage) {
		// The claim is believed; the pages' written counts stay what
		// landed, so the read gate (unless it is off too: the incident's
		// shape) still sees the truth.
		guards.decode.TokenCoverage = func(int, int) (string, error) { return "", nil }
		guards.decode.PageCoverage = func(*kvpool.Pool, int32, int) error { return nil }
	}
	if off(faults.GuardChecksum) {
		// Any claim is believed.
		guards.decode.ChecksumMatches = func(uint64, uint64) bool { return true }
	}
	if off(faults.GuardCapability) {
		// A message about a live reservation need not carry its capability.
		guards.decode.CapabilityMatches = func(transfer.Capability, []byte) bool { return true }
	}
	if off(faults.GuardPeerQuota) {
		// One caller may hold as many reservations and pages as it asks for.
		guards.decode.OverQuota = func(int, int, int) bool { return false }
	}
	if off(faults.GuardDrainWait) {
		// The writer is still asked to stop, but its pages are reused
		// without waiting for its answer.
		guards.decode.DrainWait = func(tell func(), release func(string)) {
			go tell()
			release("drain wait switched off")
		}
	}
	if off(faults.GuardDialKnown) {
		// Prefill answers an Abort at whatever address it names.
		guards.prefill.DialKnown = func(string) bool { return true }
	}
}

// cacheFaults are the prefix cache's faults, at admission: cache_rewrite
// starts the first request that reads cached pages one page early, over
// other tokens, and cache_publish_early offers every request's prompt
// pages before any of them is written.
func cacheFaults(sp *faults.Spec) func(*kvpool.Pool, int, *prefixcache.Cache) scheduler.Faults {
	return func(pool *kvpool.Pool, vocab int, cache *prefixcache.Cache) scheduler.Faults {
		// rewrote makes cache_rewrite fault one request only, so that the
		// ones after it show whether the shared page survived.
		var rewrote atomic.Bool
		ps := pool.PageSize()
		return scheduler.Faults{Admitted: func(r *scheduler.Request, a kvpool.Allocation, cached int) int {
			if sp.CacheRewrite && cached > 0 && rewrote.CompareAndSwap(false, true) {
				// Start one page early, over other tokens: the step would
				// store their KV into the last cached page, which others read.
				cached -= ps
				p := append([]int32(nil), r.Prompt...)
				for i := cached; i < cached+ps; i++ {
					p[i] = int32((int(p[i]) + 7) % vocab)
				}
				r.Prompt = p
			}
			if sp.CachePublishEarly && cache != nil {
				// Offer the prompt's pages before any of them is written.
				_, _ = cache.Publish(r.Params.Tenant, a.Owner, a.Pages, r.Prompt)
			}
			return cached
		}}
	}
}
