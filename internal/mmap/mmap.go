// Package mmap maps model files read-only, so that weights are paged in by
// the kernel on first use instead of being copied into the Go heap.
package mmap

import (
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// File maps the whole of path read-only. Files shorter than minSize are
// refused before mapping (a format's fixed header must fit).
func File(path string, minSize int64) ([]byte, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < minSize {
		return nil, fmt.Errorf("%s: file too short (%d bytes)", path, st.Size())
	}
	data, err := unix.Mmap(int(fd.Fd()), 0, int(st.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", path, err)
	}
	return data, nil
}

// Unmap releases a mapping made by File.
func Unmap(data []byte) error { return unix.Munmap(data) }

// touched keeps the reads of Populate's fallback from being optimised away.
var touched atomic.Uint32

// Populate maps every page of data (a mapping made by File) now: a model
// that is about to serve reads all its weights at once, and left to first
// use each 4 KiB page took a fault inside the first requests' forward
// passes (on a 134M F32 model, 130 thousand of them during a benchmark's
// first steps). Kernels without MADV_POPULATE_READ (before 5.14) get the
// pages read ahead and touched one at a time.
func Populate(data []byte) {
	if len(data) == 0 || unix.Madvise(data, unix.MADV_POPULATE_READ) == nil {
		return
	}
	_ = unix.Madvise(data, unix.MADV_WILLNEED)
	var sum byte
	for i := 0; i < len(data); i += 4096 {
		sum += data[i]
	}
	touched.Add(uint32(sum))
}

// hugePage is the size of an x86-64 and arm64 transparent huge page.
const hugePage = 2 << 20

// AdviseHuge asks for transparent huge pages on the whole 2 MiB pages
// inside b (madvise takes page-aligned bounds). Where THP is off, or the
// kernel refuses, b keeps small pages: nothing depends on it.
func AdviseHuge(b []byte) {
	if len(b) == 0 {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := (start + hugePage - 1) &^ (hugePage - 1)
	hi := (start + uintptr(len(b))) &^ (hugePage - 1)
	if hi > lo {
		_ = unix.Madvise(b[lo-start:hi-start], unix.MADV_HUGEPAGE)
	}
}

// Anon maps size bytes of private anonymous memory starting on a 2 MiB
// boundary, in huge pages where the kernel gives them (AdviseHuge). free
// unmaps it.
func Anon(size int) (data []byte, free func() error, err error) {
	if size <= 0 {
		return nil, nil, fmt.Errorf("mmap: anonymous mapping of %d bytes", size)
	}
	m, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, fmt.Errorf("mmap: %d anonymous bytes: %w", size, err)
	}
	off := int(-uintptr(unsafe.Pointer(&m[0])) & (hugePage - 1))
	data = m[off : off+size : off+size]
	AdviseHuge(m[off:])
	return data, func() error { return unix.Munmap(m) }, nil
}
