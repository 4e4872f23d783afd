package cuda

/*
#include <stdlib.h>
#include "driver.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
)

// Pages from device to device between processes of one node: an Arena is
// cuMemAlloc'd memory exported with cuIpcGetMemHandle, a PeerMemory is
// another process's arena mapped with cuIpcOpenMemHandle. Both belong to
// the pool that made them: they use its stream and its lock, and the pool's
// Close frees those whose own Close was not called.

var (
	_ kernels.PeerExporter = (*KVPool)(nil)
	_ kernels.PeerImporter = (*KVPool)(nil)
)

// ipcHandleBytes is the size of a CUipcMemHandle.
const ipcHandleBytes = 64

var (
	errNoIPC = errors.New("cuda: this driver has no CUDA IPC (cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, " +
		"cuIpcCloseMemHandle, cuMemGetAddressRange_v2)")
	errArenaClosed = errors.New("cuda: arena used after Close")
	errPeerClosed  = errors.New("cuda: peer memory used after Close")
)

func (d *driver) hasIPC() bool { return C.bk_has_ipc(d.c) != 0 }

// ipcCheck is check for the IPC entry points, which a driver may lack.
func (d *driver) ipcCheck(op string, r C.bk_res) error {
	if r == C.BK_ERR_MISSING {
		return errNoIPC
	}
	return d.check(op, r)
}

// span checks that size bytes at off lie inside limit bytes. The pack
// kernels move 2-byte units, so an odd offset is refused too: on a GPU the
// misaligned access would be an error that ends the context.
func span(off, size, limit int) error {
	if off < 0 || off > limit || size > limit-off {
		return fmt.Errorf("cuda: %d bytes at offset %d overrun an arena of %d bytes", size, off, limit)
	}
	if off%2 != 0 {
		return fmt.Errorf("cuda: arena offset %d is odd (pages move in 2-byte units)", off)
	}
	return nil
}

// arena implements kernels.Arena.
type arena struct {
	kp     *KVPool
	ptr    dptr // 0 once freed; under kp.mu
	size   int
	handle [ipcHandleBytes]byte
}

// NewArena implements kernels.PeerExporter.
func (kp *KVPool) NewArena(bytes int) (_ kernels.Arena, err error) {
	if bytes <= 0 || bytes > math.MaxInt/2 {
		return nil, fmt.Errorf("cuda: an arena of %d bytes", bytes)
	}
	d := kp.b.drv
	if !d.hasIPC() {
		return nil, errNoIPC
	}
	if err := kp.enter(-1); err != nil {
		return nil, err
	}
	defer kp.leave()
	defer catch(&err)
	a := &arena{kp: kp, size: bytes}
	words := roundUp(bytes, 4) / 4
	a.ptr = kp.b.alloc(4*words, "a page arena")
	made := false
	defer func() {
		if !made {
			C.bk_mem_free(d.c, C.bk_dptr(a.ptr))
		}
	}()
	// Whoever holds the handle can read all of the arena, not only what
	// was staged in it: zeroed, it shows nothing device memory held before.
	if err := d.check("cuMemsetD32Async", C.bk_memset32(d.c, C.bk_dptr(a.ptr), 0, C.size_t(words), C.uintptr_t(kp.stream))); err != nil {
		return nil, err
	}
	if err := kp.sync(); err != nil {
		return nil, err
	}
	if err := d.ipcCheck("cuIpcGetMemHandle", C.bk_ipc_get(d.c, unsafe.Pointer(&a.handle[0]), C.bk_dptr(a.ptr))); err != nil {
		return nil, err
	}
	kp.arenas[a] = struct{}{}
	made = true
	return a, nil
}

// Handle implements kernels.Arena.
func (a *arena) Handle() []byte { return append([]byte(nil), a.handle[:]...) }

// Size implements kernels.Arena.
func (a *arena) Size() int { return a.size }

// Stage implements kernels.Arena: the pack kernel writes each page straight
// into its place in the arena, and one copy of the span they cover brings
// them back for the caller's checksums.
func (a *arena) Stage(pages []int32, tokens []int, offs []int) ([]uint64, error) {
	kp := a.kp
	if len(pages) != len(tokens) || len(pages) != len(offs) {
		return nil, fmt.Errorf("cuda: %d pages, %d token counts and %d offsets", len(pages), len(tokens), len(offs))
	}
	l := kp.layout
	lo, hi := a.size, 0
	for i, p := range pages {
		if err := kp.check(p, tokens[i]); err != nil {
			return nil, err
		}
		size := l.PackedBytes(tokens[i])
		if err := span(offs[i], size, a.size); err != nil {
			return nil, err
		}
		if size > 0 {
			lo, hi = min(lo, offs[i]), max(hi, offs[i]+size)
		}
	}
	if err := kp.enterReading(pages); err != nil {
		return nil, err
	}
	defer kp.leave()
	if a.ptr == 0 {
		return nil, errArenaClosed
	}
	if hi <= lo {
		return kp.sumPagesLocked(pages, tokens)
	}
	for i, p := range pages {
		if size := l.PackedBytes(tokens[i]); size > 0 {
			if err := kp.pack(a.ptr+uint64(offs[i]), p, tokens[i]); err != nil {
				return nil, err
			}
		}
	}
	// The sums are of the pool's pages, queued behind their packs on the
	// same stream: the rows the arena got.
	return kp.sumPagesLocked(pages, tokens)
}

// Close implements kernels.Arena.
func (a *arena) Close() error {
	if err := a.kp.enter(-1); err != nil {
		if errors.Is(err, errPoolClosed) { // the pool's Close freed it
			return nil
		}
		return err
	}
	defer a.kp.leave()
	return a.free()
}

// free releases the arena, with the pool's lock held and the context current.
func (a *arena) free() error {
	if a.ptr == 0 {
		return nil
	}
	p := a.ptr
	a.ptr = 0
	delete(a.kp.arenas, a)
	d := a.kp.b.drv
	return d.check("cuMemFree", C.bk_mem_free(d.c, C.bk_dptr(p)))
}

// peerMemory implements kernels.PeerMemory.
type peerMemory struct {
	kp   *KVPool
	ptr  dptr // 0 once closed; under kp.mu
	size int
}

// OpenPeer implements kernels.PeerImporter. The mapping's size is the
// driver's, so a handle that claims more than was exported cannot make
// CopyPage read past it.
func (kp *KVPool) OpenPeer(handle []byte) (kernels.PeerMemory, error) {
	if len(handle) != ipcHandleBytes {
		return nil, fmt.Errorf("cuda: an arena handle of %d bytes, want %d", len(handle), ipcHandleBytes)
	}
	d := kp.b.drv
	if !d.hasIPC() {
		return nil, errNoIPC
	}
	var h [ipcHandleBytes]byte
	copy(h[:], handle)
	if err := kp.enter(-1); err != nil {
		return nil, err
	}
	defer kp.leave()
	var p C.bk_dptr
	if err := d.ipcCheck("cuIpcOpenMemHandle", C.bk_ipc_open(d.c, &p, unsafe.Pointer(&h[0]))); err != nil {
		return nil, fmt.Errorf("cuda: the arena handle does not map here: %w", err)
	}
	base, size, err := d.addressRange(dptr(p))
	end := base + uint64(size)
	if err == nil && (uint64(p) < base || uint64(p) >= end || end-uint64(p) > math.MaxInt/2) {
		err = fmt.Errorf("cuda: the driver maps the arena at %#x, in a range of %d bytes from %#x", uint64(p), size, base)
	}
	if err != nil {
		C.bk_ipc_close(d.c, p)
		return nil, err
	}
	pm := &peerMemory{kp: kp, ptr: dptr(p), size: int(end - uint64(p))}
	kp.peers[pm] = struct{}{}
	return pm, nil
}

// Size implements kernels.PeerMemory.
func (pm *peerMemory) Size() int { return pm.size }

// QueuePage implements kernels.PeerMemory: WritePage's unpack kernel,
// reading the peer's arena where WritePage reads its staging page, queued
// on the pool's stream without a wait.
func (pm *peerMemory) QueuePage(page int32, tokens int, off int) error {
	kp := pm.kp
	if err := kp.check(page, tokens); err != nil {
		return err
	}
	l := kp.layout
	size := l.PackedBytes(tokens)
	if err := span(off, size, pm.size); err != nil {
		return err
	}
	if err := kp.enter(-1); err != nil {
		return err
	}
	defer kp.leave()
	if pm.ptr == 0 {
		return errPeerClosed
	}
	if size == 0 {
		return nil
	}
	return kp.unpack(page, tokens, pm.ptr+uint64(off))
}

// Drain implements kernels.PeerMemory: the copies share the pool's stream,
// so one synchronise covers every page queued on it, from any peer.
func (pm *peerMemory) Drain() error {
	if err := pm.kp.enter(-1); err != nil {
		return err
	}
	defer pm.kp.leave()
	return pm.kp.sync()
}

// CopyPage implements kernels.PeerMemory.
func (pm *peerMemory) CopyPage(page int32, tokens int, off int) error {
	if err := pm.QueuePage(page, tokens, off); err != nil {
		return err
	}
	// The drain proof: nothing of this copy is in flight once it returns.
	return pm.Drain()
}

// Close implements kernels.PeerMemory.
func (pm *peerMemory) Close() error {
	if err := pm.kp.enter(-1); err != nil {
		if errors.Is(err, errPoolClosed) { // the pool's Close unmapped it
			return nil
		}
		return err
	}
	defer pm.kp.leave()
	if pm.ptr == 0 {
		return nil
	}
	// A queued copy may still read the mapping: it goes once they are
	// done. (The pool's release synchronises before it unmaps its peers.)
	serr := pm.kp.sync()
	if err := pm.close(); err != nil {
		return err
	}
	return serr
}

// close unmaps, with the pool's lock held and the context current.
func (pm *peerMemory) close() error {
	if pm.ptr == 0 {
		return nil
	}
	p := pm.ptr
	pm.ptr = 0
	delete(pm.kp.peers, pm)
	d := pm.kp.b.drv
	return d.ipcCheck("cuIpcCloseMemHandle", C.bk_ipc_close(d.c, C.bk_dptr(p)))
}

// releaseIPC frees the pool's arenas and unmaps its peers, from release.
func (kp *KVPool) releaseIPC() {
	for a := range kp.arenas {
		a.free()
	}
	for pm := range kp.peers {
		pm.close()
	}
}

// addressRange is the allocation or mapping the driver knows p in.
func (d *driver) addressRange(p dptr) (base dptr, size int, err error) {
	var b C.bk_dptr
	var s C.size_t
	if err := d.ipcCheck("cuMemGetAddressRange", C.bk_mem_range(d.c, &b, &s, C.bk_dptr(p))); err != nil {
		return 0, 0, err
	}
	return dptr(b), int(s), nil
}
