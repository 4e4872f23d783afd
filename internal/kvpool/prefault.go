package kvpool

import (
	"unsafe"

	"github.com/batonlm/baton/internal/mmap"
)

// prefault gives the pool its memory before the first request: huge pages
// where the OS gives them (mmap.AdviseHuge), then one write
// per 4 KiB so every page is mapped now. Left to the first store of each
// page, a fresh pool took a page fault per 4 KiB of KV while serving (in
// the engine's serial KV store, a fifth of a million faults and 7% of the
// CPU time of a 32-stream benchmark), and 4 KiB pages cost the attention's
// scattered reads a TLB miss per page.
func prefault(data []float32) {
	if len(data) == 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), len(data)*4)
	mmap.AdviseHuge(b)
	for i := 0; i < len(data); i += 1024 {
		data[i] = 0
	}
}
