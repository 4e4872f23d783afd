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
	"runtime"
	"slices"
	"sync"
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

// hostVisible says the driver's device memory is this process's host
// memory: only the emulated driver's is.
func (d *driver) hostVisible() bool { return C.bk_host_visible(d.c) != 0 }

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

var _ kernels.DeviceRange = (*arena)(nil)

// Range implements kernels.DeviceRange, for a one-sided transport that
// registers the arena and puts the staged pages straight from it (ucx):
// the arena's device address (0 once it is freed) and size, and whether
// that address is host memory of this process too (the emulated driver).
// Whoever registers it must unregister it before Close.
func (a *arena) Range() (addr uintptr, bytes int, hostVisible bool) {
	a.kp.mu.Lock()
	p := a.ptr
	a.kp.mu.Unlock()
	return uintptr(p), a.size, a.kp.b.drv.hostVisible()
}

// Stage implements kernels.Arena: the pack kernel writes each page straight
// into its place in the arena and bk_page_sum sums the pool's pages behind
// the packs, on the pool's stream; an event marks where the stream is done
// with them, and the sums come back into pinned memory of the staging's
// own, so the caller waits for nothing here (Wait does).
//
// The ordering rule for the pages packed: the packs run on the pool's
// stream, after the backend's stores into the pages (enterReading), and
// the backend's stream waits for the staging's event before any kernel
// queued after Stage returns. The pages a prompt finished are not written
// again while it runs, but once released they may be reused by another
// request's kernels on the backend's stream: those must not overwrite a
// page still being packed. The wait is the device's (cuStreamWaitEvent),
// so the CPU goes on; what it costs the next chunk on the GPU is not
// measured on a GPU.
func (a *arena) Stage(pages []int32, tokens []int, offs []int) (kernels.Staging, error) {
	kp := a.kp
	if len(pages) != len(tokens) || len(pages) != len(offs) {
		return nil, fmt.Errorf("cuda: %d pages, %d token counts and %d offsets", len(pages), len(tokens), len(offs))
	}
	l := kp.layout
	for i, p := range pages {
		if err := kp.check(p, tokens[i]); err != nil {
			return nil, err
		}
		if err := span(offs[i], l.PackedBytes(tokens[i]), a.size); err != nil {
			return nil, err
		}
	}
	st := &staging{kp: kp, tokens: slices.Clone(tokens)}
	if len(pages) == 0 {
		st.sums = []uint64{}
		return st, nil
	}
	if err := a.stage(st, pages, offs); err != nil {
		return nil, err
	}
	if err := kp.computeAfter(st.slot.event); err != nil {
		_, _ = st.Wait() // gives the slot back
		return nil, err
	}
	return st, nil
}

// stage queues the packs, the sums and the event of st.
func (a *arena) stage(st *staging, pages []int32, offs []int) error {
	kp := a.kp
	if err := kp.enterReading(pages); err != nil {
		return err
	}
	defer kp.leave()
	if a.ptr == 0 {
		return errArenaClosed
	}
	slot, err := kp.takeSlot(len(pages))
	if err != nil {
		return err
	}
	err = func() error {
		moves := make([]pageCopy, len(pages))
		for i, p := range pages {
			moves[i] = pageCopy{page: p, tokens: st.tokens[i], other: a.ptr + uint64(offs[i])}
		}
		if err := kp.copyPages(moves, false); err != nil {
			return err
		}
		// The sums are of the pool's pages, queued behind their packs on
		// the same stream: the rows the arena got.
		if err := kp.queueSums(slot.sums, pages, st.tokens); err != nil {
			return err
		}
		d := kp.b.drv
		return d.check("cuEventRecord", C.bk_event_record(d.c, C.uintptr_t(slot.event), C.uintptr_t(kp.stream)))
	}()
	if err != nil {
		// Nothing waits for this slot's work: the stream drains before the
		// slot is reused.
		serr := kp.sync()
		kp.freeSlots = append(kp.freeSlots, slot)
		return errors.Join(err, serr)
	}
	st.slot = slot
	return nil
}

// computeAfter makes the backend's stream wait for event before whatever
// is queued on it next (Stage's ordering rule). It takes the backend's
// lock, so a step is not captured into a graph meanwhile; the pool's lock
// is not held (the backend's comes first).
func (kp *KVPool) computeAfter(event uintptr) (err error) {
	defer catch(&err)
	b := kp.b
	b.lock()
	defer b.unlock()
	return b.drv.check("cuStreamWaitEvent", C.bk_stream_wait(b.drv.c, C.uintptr_t(b.stream), C.uintptr_t(event)))
}

// stageSlot is what a Stage in flight holds: its sums' staging, on the
// device and pinned, and the event that marks them (and the packs) done.
type stageSlot struct {
	sums  *pageSums
	event uintptr
}

// takeSlot finds a free slot for n pages' sums or makes one, with the
// pool's lock held and its context current.
func (kp *KVPool) takeSlot(n int) (*stageSlot, error) {
	for i, sl := range kp.freeSlots {
		if sl.sums.n >= n {
			kp.freeSlots = slices.Delete(kp.freeSlots, i, i+1)
			return sl, nil
		}
	}
	sums, err := kp.newPageSums(n)
	if err != nil {
		return nil, err
	}
	d := kp.b.drv
	var e C.uintptr_t
	if err := d.check("cuEventCreate", C.bk_event_create(d.c, &e, 2 /* CU_EVENT_DISABLE_TIMING */)); err != nil {
		sums.free(d.c)
		return nil, err
	}
	sl := &stageSlot{sums: sums, event: uintptr(e)}
	kp.slots[sl] = struct{}{}
	return sl, nil
}

// staging implements kernels.Staging.
type staging struct {
	kp     *KVPool
	tokens []int
	// slot is nil once given back (or when nothing was queued).
	slot *stageSlot
	once sync.Once
	sums []uint64
	err  error
}

// Wait implements kernels.Staging.
func (st *staging) Wait() ([]uint64, error) {
	st.once.Do(st.wait)
	return st.sums, st.err
}

// wait blocks on the staging's event with neither of the pool's locks
// held, so the engine loop's next Stage does not queue behind it; the
// pool's Close waits for it (waitMu) before it destroys the event.
func (st *staging) wait() {
	if st.slot == nil {
		return
	}
	kp, sl := st.kp, st.slot
	st.err = kp.waitEvent(sl.event)
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.closed {
		if st.err == nil {
			st.err = errPoolClosed
		}
		return
	}
	if st.err == nil {
		st.sums = kp.sumsOf(sl.sums, st.tokens)
	}
	st.slot = nil
	kp.freeSlots = append(kp.freeSlots, sl)
}

// waitEvent is cuEventSynchronize of one of the pool's events.
func (kp *KVPool) waitEvent(event uintptr) error {
	kp.waitMu.RLock()
	defer kp.waitMu.RUnlock()
	if kp.released {
		return errPoolClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b, d := kp.b, kp.b.drv
	if err := d.check("cuCtxSetCurrent", C.bk_ctx_set(d.c, C.uintptr_t(b.ctx))); err != nil {
		return err
	}
	kp.eventWaits.Add(1)
	return d.check("cuEventSynchronize", C.bk_event_sync(d.c, C.uintptr_t(event)))
}

// releaseSlots frees every staging slot, from release (the stream is
// synchronised): a Wait blocked on an event finishes first, later ones
// find the pool gone.
func (kp *KVPool) releaseSlots() {
	kp.waitMu.Lock()
	kp.released = true
	kp.waitMu.Unlock()
	d := kp.b.drv.c
	for sl := range kp.slots {
		C.bk_event_destroy(d, C.uintptr_t(sl.event))
		sl.sums.free(d)
	}
	kp.slots, kp.freeSlots = nil, nil
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
	// pending are the copies QueuePage took and Drain issues, so that a
	// batch's runs of consecutive pages go as single copies; under kp.mu.
	pending []pageCopy
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

// QueuePage implements kernels.PeerMemory: the page's move out of the
// peer's arena, checked and kept for Drain, which issues a batch's moves
// in runs (copyPages: one copy for consecutive full pages, WritePage's
// unpack kernel for a partial one).
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
	pm.pending = append(pm.pending, pageCopy{page: page, tokens: tokens, other: pm.ptr + uint64(off)})
	return nil
}

// issue queues the pending copies on the pool's stream, runs of
// consecutive full pages as one copy each; with the pool's lock held.
func (pm *peerMemory) issue() error {
	moves := pm.pending
	pm.pending = pm.pending[:0]
	return pm.kp.copyPages(moves, true)
}

// Drain implements kernels.PeerMemory: it issues the copies QueuePage
// took, in runs, and waits; the copies share the pool's stream, so one
// synchronise covers every page queued on it, from any peer. A peer
// mapping is shared by its sender's sessions: whichever drains first
// issues the others' copies too, and each Drain returns only once every
// copy taken before it landed.
func (pm *peerMemory) Drain() error {
	if err := pm.kp.enter(-1); err != nil {
		return err
	}
	defer pm.kp.leave()
	var err error
	if pm.ptr != 0 {
		err = pm.issue()
	}
	if serr := pm.kp.sync(); err == nil {
		err = serr
	}
	return err
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
	// Copies taken and not drained were gated already: they land.
	ierr := pm.issue()
	serr := errors.Join(ierr, pm.kp.sync())
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
