package server

import (
	"bytes"
	"io"
	"runtime"
	"testing"
)

// A declared length costs a client one header: readAll's first buffer must
// not be sized by it. A body that declares 32 MiB and sends 3 bytes
// allocates about firstBodyAlloc, not 32 MiB; a body that does arrive is
// read whole, in a buffer grown to its declared size.
func TestReadAllFirstAllocationIsBounded(t *testing.T) {
	const declared = 32 << 20
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b, err := readAll(bytes.NewReader([]byte("abc")), declared)
	runtime.ReadMemStats(&after)
	if err != nil || string(b) != "abc" {
		t.Fatalf("%q %v", b, err)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
		t.Errorf("a 3-byte body declaring %d bytes allocated %d bytes", declared, got)
	}
	body := bytes.Repeat([]byte("x"), 3<<20+17)
	got, err := readAll(io.MultiReader(bytes.NewReader(body[:1000]), bytes.NewReader(body[1000:])), int64(len(body)))
	if err != nil || !bytes.Equal(got, body) {
		t.Fatalf("a %d-byte body read back as %d bytes (%v)", len(body), len(got), err)
	}
}
