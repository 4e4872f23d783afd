package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// --cpu-profile writes a gzipped pprof profile when the run stops, and a
// path it cannot create is refused before serving.
func TestCPUProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.pprof")
	stop, err := startCPUProfile(path)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Fatalf("profile is %d bytes, not gzip", len(b))
	}
	if _, err := startCPUProfile(filepath.Join(t.TempDir(), "no", "such", "dir", "cpu.pprof")); err == nil {
		t.Fatal("a profile path in a missing directory was accepted")
	}
}
