package model

import (
	"errors"

	"github.com/batonlm/baton/internal/hostmem"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/mmap"
)

// errNoRoom: the copy would not fit the memory the host says is available
// (hostmem.Available: MemAvailable, or a container's cgroup limit less its
// use where that is smaller).
var errNoRoom = errors.New("model: no room for a copy of the weights")

// copyReserve is what a copy leaves of the available memory: the KV pool,
// activations and the page cache's working set are still to come.
const copyReserve = 1 << 30

// memAvailable is hostmem.Available; a variable so that tests can
// pretend to be short.
var memAvailable = hostmem.Available

// copyToHost moves every weight matrix into one anonymous mapping in huge
// pages (mmap.Anon) and returns what unmaps it. Served from the file's
// mapping, the CPU read weights through 4 KiB page-cache pages: a TLB miss
// and a hardware prefetch stream stopped at every page, which is one F16
// row of a 2048-wide model (1.1B F16 in process: decode 108-129 -> 54-57
// ms a token, a 128-token prefill 1.31-1.36 -> 1.07-1.09 s). A model
// that would not leave copyReserve of the available memory is not copied
// (errNoRoom): served from the mapping it runs slower, copied it would be
// killed for memory.
func copyToHost(w *Weights) (func() error, error) {
	var ms []*kernels.Matrix
	seen := map[*kernels.Matrix]bool{}
	total := 0
	for _, m := range w.matrices() {
		if m == nil || seen[m] {
			continue // Output may be Embed
		}
		seen[m] = true
		ms = append(ms, m)
		total += (len(m.Data) + 63) &^ 63 // rows' vectors start 64-byte aligned, as in a GGUF
	}
	if total == 0 {
		return func() error { return nil }, nil
	}
	if avail, err := memAvailable(); err == nil && int64(total)+copyReserve > avail {
		return nil, errNoRoom
	}
	buf, free, err := mmap.Anon(total)
	if err != nil {
		return nil, err
	}
	at := 0
	for _, m := range ms {
		n := copy(buf[at:], m.Data)
		m.Data = buf[at : at+n : at+n]
		at += (n + 63) &^ 63
	}
	return free, nil
}
