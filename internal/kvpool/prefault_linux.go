package kvpool

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size of an x86-64 and arm64 transparent huge page.
const hugePage = 2 << 20

// advise asks for transparent huge pages on the whole 2 MiB pages inside
// b (madvise needs page-aligned bounds). Where THP is off, or the kernel
// refuses, the pool keeps small pages: nothing depends on it.
func advise(b []byte) {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (start + hugePage - 1) &^ (hugePage - 1)
	hi := (start + uintptr(len(b))) &^ (hugePage - 1)
	if hi <= lo {
		return
	}
	_ = unix.Madvise(b[lo-start:hi-start], unix.MADV_HUGEPAGE)
}
