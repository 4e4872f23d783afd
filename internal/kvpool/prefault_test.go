package kvpool

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A pool's memory is mapped when New returns, so no store while serving
// takes a page fault (mincore: every page resident).
func TestNewPoolMemoryIsResident(t *testing.T) {
	p, err := New(Config{NumPages: 512, PageSize: 16, Layers: 4, KVHeads: 4, HeadDim: 64})
	if err != nil {
		t.Fatal(err)
	}
	data := p.KV().Data
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(data))), len(data)*4)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & 4095) // mincore takes whole pages
	b = b[off : off+(len(b)-off)&^4095]
	vec := make([]byte, len(b)/4096)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	missing := 0
	for _, v := range vec {
		if v&1 == 0 {
			missing++
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d pages of a new pool's %d MiB are not resident", missing, len(vec), len(data)*4>>20)
	}
}
