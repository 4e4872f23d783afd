//go:build faults

package hicache

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/faults"
)

func init() {
	sp := faults.Active()
	if sp == nil {
		return
	}
	if d := sp.LoadDelay; d > 0 {
		var mu sync.Mutex
		rng := rand.New(rand.NewPCG(sp.Seed, sp.Seed^0x5bd1e995))
		jitter := sp.LoadJitter
		// Each page waits; with jitter the waits differ, so that the loads
		// of requests running at once end out of their order.
		waitLoad = func() {
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
		beforeWrite = func(b []byte) {
			if i := len(b)/2 | 3; i < len(b) {
				b[i] ^= 0x40
			}
		}
	}
}
