package main

import (
	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/roles"
	"github.com/batonlm/baton/internal/scheduler"
)

// guards are the guards and injected faults this process hands each
// package through its options. The zero value, which every build but the
// faults one keeps, is every check and no fault; only guards_faults.go
// (built with the faults tag) fills it, from BATON_GUARDS_OFF and
// BATON_FAULTS.
var guards struct {
	engine scheduler.Guards
	// engineFaults makes the engine's faults from what it runs over
	// (nil: none).
	engineFaults func(pool *kvpool.Pool, vocab int, cache *prefixcache.Cache) scheduler.Faults
	pool         kvpool.Guards
	cache        prefixcache.Guards
	tiers        hicache.Faults
	decode       roles.DecodeGuards
	decodeFaults roles.DecodeFaults
	prefill      roles.PrefillGuards
}

// engineFaults are the engine's injected faults: none outside a faults build.
func engineFaults(pool *kvpool.Pool, vocab int, cache *prefixcache.Cache) scheduler.Faults {
	if guards.engineFaults == nil {
		return scheduler.Faults{}
	}
	return guards.engineFaults(pool, vocab, cache)
}
