// Package mmap maps model files read-only, so that weights are paged in by
// the kernel on first use instead of being copied into the Go heap.
package mmap

import (
	"fmt"
	"os"

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
