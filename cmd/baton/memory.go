package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

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
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("host memory: %w", err)
	}
	defer f.Close()
	total, err := memTotal(f)
	if err != nil {
		return 0, err
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if lim, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && lim > 0 {
			total = min(total, lim)
		}
	}
	return total, nil
}

// memTotal reads MemTotal (in kB) from /proc/meminfo's text.
func memTotal(r io.Reader) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil || kb <= 0 {
				return 0, fmt.Errorf("host memory: MemTotal %q", fields[1])
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("host memory: no MemTotal in /proc/meminfo")
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
