package main

import (
	"fmt"

	"github.com/batonlm/baton/internal/hostmem"
	"github.com/batonlm/baton/internal/kernels"
)

// deviceMemory is the memory --mem-fraction-static is a fraction of: the
// GPU's for a backend that reports it, else the host's (the smaller of
// MemTotal and the cgroup's limit, so a container is sized by what it may
// use, not by the machine). A variable so tests can set it.
var deviceMemory = func(be kernels.Backend) (int64, error) {
	if r, ok := be.(interface{ TotalMemory() (int64, error) }); ok {
		return r.TotalMemory()
	}
	return hostmem.Total()
}

// staticKVBudget is SGLang's --mem-fraction-static on baton's terms: the
// weights and the KV pool together take frac of the device's memory, so
// the pool gets what that leaves after the weights.
func staticKVBudget(frac float64, be kernels.Backend, weightBytes int64) (int64, error) {
	total, err := deviceMemory(be)
	if err != nil {
		return 0, fmt.Errorf("--mem-fraction-static: %w", err)
	}
	budget := int64(frac*float64(total)) - weightBytes
	if budget <= 0 {
		return 0, fmt.Errorf("--mem-fraction-static %g: %d MiB of %d MiB leaves nothing for the KV pool after %d MiB of weights",
			frac, int64(frac*float64(total))>>20, total>>20, weightBytes>>20)
	}
	return budget, nil
}
