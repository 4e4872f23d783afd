package mmap

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// threadFaults is the minor page faults of the calling OS thread so far.
func threadFaults(t *testing.T) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// readPages reads one byte of every 4 KiB of data and returns the minor
// faults that took on this thread.
func readPages(t *testing.T, data []byte) int64 {
	f0 := threadFaults(t)
	var sum byte
	for i := 0; i < len(data); i += 4096 {
		sum += data[i]
	}
	touched.Add(uint32(sum))
	return threadFaults(t) - f0
}

func TestPopulateMapsEveryPage(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	path := filepath.Join(t.TempDir(), "weights")
	if err := os.WriteFile(path, make([]byte, 16<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	lazy, err := File(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(lazy)
	// Without Populate the first read of the pages faults (the kernel maps
	// up to 16 pages around each fault, so 16 MiB takes at least 256).
	if n := readPages(t, lazy); n < 64 {
		t.Fatalf("reading a fresh mapping took %d faults; the check below would prove nothing", n)
	}
	eager, err := File(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(eager)
	Populate(eager)
	if n := readPages(t, eager); n > 8 {
		t.Fatalf("reading a populated mapping took %d page faults, want none", n)
	}
}
