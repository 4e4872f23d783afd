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
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
)

// KVPool is a KV pool in GPU memory (kernels.DeviceKV), made by AllocKV.
// The backend's kernels address it directly; everything else (a transfer
// packing a prompt's pages, a decode worker unpacking received ones,
// poisoning freed pages) goes a page at a time through pinned host memory
// on a stream of the pool's own, so a page copy does not queue behind a
// forward pass and a forward pass does not wait for the network.
type KVPool struct {
	b      *Backend
	layout kernels.PagedKV // sizes only
	pages  int
	ptr    dptr

	// mu serialises page operations: they share the staging buffers and
	// the stream. It is never held while taking the backend's lock.
	mu     sync.Mutex
	closed bool
	stream uintptr
	// stored is, per page, the number of the last StoreKV into it (the
	// backend's count). A read of a page whose store may still be queued
	// waits for the backend's stream through event.
	stored []atomic.Uint64
	event  uintptr
	// waits counts reads that waited for the backend's stream; syncs the
	// pool's waits for its own stream (tests, through Synchronizes).
	waits int
	syncs int
	// runCopies counts the device-to-device copies of runs of full pages
	// (copyPages), for tests.
	runCopies int
	// host is the staging buffer of one packed page: pinned (page-locked,
	// so copies are DMA at full speed) when the driver allows, else
	// pageable C memory.
	host   unsafe.Pointer
	pinned bool
	// stage is one packed page on the device: the pack and unpack kernels
	// move rows between it and the pool.
	stage dptr
	// many and manyHost are ReadPages' staging, on the device and pinned
	// on the host, grown to the most bytes a call has packed.
	many      dptr
	manyHost  unsafe.Pointer
	manyBytes int
	args      []uint64
	// arenas and peers are the pool's CUDA IPC memory (ipc.go), freed with
	// it when their own Close was not called.
	arenas map[*arena]struct{}
	peers  map[*peerMemory]struct{}
	// sums is SumPages' staging (sums.go).
	sums *pageSums
	// slots are the staging slots of Arena.Stage (ipc.go), free those no
	// Stage in flight holds. released is set, under waitMu, once release
	// freed them: a Wait holds waitMu's read lock while it blocks on a
	// slot's event, so release does not destroy the event under it.
	slots      map[*stageSlot]struct{}
	freeSlots  []*stageSlot
	waitMu     sync.RWMutex
	released   bool
	eventWaits atomic.Int64
}

var _ kernels.DeviceKV = (*KVPool)(nil)
var _ kernels.PagesReader = (*KVPool)(nil)
var _ kernels.KVAllocator = (*Backend)(nil)

// AllocKV implements kernels.KVAllocator: pages pages of layout's shape
// in GPU memory, zeroed.
func (b *Backend) AllocKV(layout kernels.PagedKV, pages int) (_ kernels.DeviceKV, err error) {
	layout.Data, layout.Device = nil, nil
	if pages <= 0 || layout.PageSize <= 0 || layout.Layers <= 0 || layout.KVHeads <= 0 || layout.HeadDim <= 0 {
		return nil, fmt.Errorf("cuda: KV pool of %d pages of %+v", pages, layout)
	}
	if layout.HeadDim > attnMaxHD {
		return nil, fmt.Errorf("cuda: head dim %d > %d is not supported", layout.HeadDim, attnMaxHD)
	}
	if !kernels.ValidKVDType(layout.DType) {
		return nil, fmt.Errorf("cuda: KV cache dtype %s is not supported (f32, f16, bf16 and fp8_e4m3 are)", layout.DType)
	}
	// The page kernels move 2-byte units: an fp8 row of an odd number of
	// elements is not whole units (a page of whole-unit rows is whole words).
	if layout.RowFloats()*layout.ElemBytes()%2 != 0 {
		return nil, fmt.Errorf("cuda: a page of %s KV with head dim %d is not a whole number of words", layout.DType, layout.HeadDim)
	}
	bytes := int64(pages) * int64(layout.PageFloats()) * 4
	if bytes/int64(pages) != int64(layout.PageFloats())*4 || bytes > math.MaxInt/2 {
		return nil, fmt.Errorf("cuda: KV pool of %d pages of %d floats overflows", pages, layout.PageFloats())
	}
	defer catch(&err)
	b.lock()
	defer b.unlock()
	kp := &KVPool{b: b, layout: layout, pages: pages, stored: make([]atomic.Uint64, pages),
		arenas: map[*arena]struct{}{}, peers: map[*peerMemory]struct{}{}, slots: map[*stageSlot]struct{}{}}
	made := false
	defer func() {
		if !made { // a driver call panicked: free what was made so far
			kp.release()
		}
	}()
	b.flush()
	kp.ptr = b.alloc(int(bytes), "the KV pool")
	b.must("cuMemsetD32Async", C.bk_memset32(b.drv.c, C.bk_dptr(kp.ptr), 0, C.size_t(bytes/4), C.uintptr_t(b.stream)))
	page := layout.PackedBytes(layout.PageSize)
	kp.stage = b.alloc(page, "KV page staging")
	var s, e C.uintptr_t
	b.must("cuStreamCreate", C.bk_stream_create(b.drv.c, &s))
	kp.stream = uintptr(s)
	b.must("cuEventCreate", C.bk_event_create(b.drv.c, &e, 2 /* CU_EVENT_DISABLE_TIMING */))
	kp.event = uintptr(e)
	var h unsafe.Pointer
	if C.bk_host_alloc(b.drv.c, &h, C.size_t(page)) == 0 {
		kp.host, kp.pinned = h, true
	} else if kp.host = C.malloc(C.size_t(page)); kp.host == nil {
		panic(errors.New("cuda: out of host memory for KV page staging"))
	}
	b.sync()
	b.pools[kp] = struct{}{}
	made = true
	return kp, nil
}

// Pages implements kernels.DeviceKV.
func (kp *KVPool) Pages() int { return kp.pages }

var _ kernels.DeviceRange = (*KVPool)(nil)

// Range implements kernels.DeviceRange: the pool is one allocation, laid
// out as kernels.PagedKV's pages (kv.cuh's bk_k_off). The range stays
// valid until Close; whoever registers it with a NIC must unregister it
// first.
func (kp *KVPool) Range() (addr uintptr, bytes int, hostVisible bool) {
	return uintptr(kp.ptr), kp.pages * kp.layout.PageFloats() * 4, kp.b.drv.hostVisible()
}

// Synchronizes counts the times the pool's page operations waited for its
// stream, and the times a Staging's Wait waited for its event: what
// batching the page copies saves and where staging waits, for tests
// outside the package.
func (kp *KVPool) Synchronizes() (stream, event int) {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	return kp.syncs, int(kp.eventWaits.Load())
}

// Pinned reports whether page copies are staged through page-locked host
// memory (the driver may refuse it; copies then stage through pageable
// memory, correct but slower).
func (kp *KVPool) Pinned() bool { return kp.pinned }

// enter starts a page operation: the pool's lock, this OS thread, the
// context current. For a read of page (-1: none), the pool's stream is
// ordered after the backend's work so far when a store into that page may
// still be queued there.
//
// Writes and fills do not wait for the backend's stream: the pool hands a
// page to a transfer, or frees it, only once no forward pass uses it, and a
// forward pass returns with its kernels done (it reads its logits back).
// So a transfer's page copies never queue behind the forward passes that
// run meanwhile.
func (kp *KVPool) enter(read int32) error {
	if read < 0 {
		return kp.enterReading(nil)
	}
	return kp.enterReading([]int32{read})
}

var errPoolClosed = errors.New("cuda: KV pool used after Close")

// enterReading is enter for a read of several pages.
func (kp *KVPool) enterReading(pages []int32) error {
	kp.mu.Lock()
	if kp.closed {
		kp.mu.Unlock()
		return errPoolClosed
	}
	runtime.LockOSThread()
	b, d := kp.b, kp.b.drv
	if err := d.check("cuCtxSetCurrent", C.bk_ctx_set(d.c, C.uintptr_t(b.ctx))); err != nil {
		kp.leave()
		return err
	}
	queued := false
	for _, p := range pages {
		queued = queued || kp.stored[p].Load() > b.storesDone.Load()
	}
	if !queued {
		return nil
	}
	kp.waits++
	if err := d.check("cuEventRecord", C.bk_event_record(d.c, C.uintptr_t(kp.event), C.uintptr_t(b.stream))); err != nil {
		kp.leave()
		return err
	}
	if err := d.check("cuStreamWaitEvent", C.bk_stream_wait(d.c, C.uintptr_t(kp.stream), C.uintptr_t(kp.event))); err != nil {
		kp.leave()
		return err
	}
	return nil
}

func (kp *KVPool) leave() {
	runtime.UnlockOSThread()
	kp.mu.Unlock()
}

func (kp *KVPool) check(page int32, tokens int) error {
	if page < 0 || int(page) >= kp.pages {
		return fmt.Errorf("cuda: page %d outside the pool of %d", page, kp.pages)
	}
	if tokens < 0 || tokens > kp.layout.PageSize {
		return fmt.Errorf("cuda: %d tokens in a page of %d", tokens, kp.layout.PageSize)
	}
	return nil
}

// launch queues kernel k on the pool's stream.
func (kp *KVPool) launch(k, gx, bx int, args ...uint64) error {
	kp.args = append(kp.args[:0], args...)
	d := kp.b.drv
	return d.check(launchOp[k], C.bk_launch(d.c, C.uintptr_t(kp.b.fn[k]), C.uint(gx), 1,
		C.uint(bx), 0, C.uintptr_t(kp.stream), (*C.uint64_t)(unsafe.Pointer(&kp.args[0])), C.int(len(args))))
}

// unitShape is what the page kernels (pack, unpack, sum), which move
// 2-byte units, take for l: a page's and a row's elements and the units
// of an element. An fp8 pool's pairs of elements are its units (a page
// and a row hold an even number of them: kernels.PagedKV.PageFloats).
func unitShape(l kernels.PagedKV) (pe, rf, eu int) {
	if l.ElemBytes() == 1 {
		return l.PageElems() / 2, l.RowFloats() / 2, 1
	}
	return l.PageElems(), l.RowFloats(), l.ElemBytes() / 2
}

// pack queues bk_page_pack: the first tokens slots of page, packed, to
// dst (device memory of PackedBytes(tokens)) on the pool's stream.
func (kp *KVPool) pack(dst dptr, page int32, tokens int) error {
	l := kp.layout
	pe, rf, eu := unitShape(l)
	return kp.launch(kPagePack, blocks(l.PackedBytes(tokens)/2, elemThreads), elemThreads, dst, kp.ptr, argI(int(page)),
		argI(tokens), argI(l.Layers), argI(l.PageSize), argI(pe), argI(rf), argI(eu))
}

// unpack queues bk_page_unpack, pack's inverse, from src.
func (kp *KVPool) unpack(page int32, tokens int, src dptr) error {
	l := kp.layout
	pe, rf, eu := unitShape(l)
	return kp.launch(kPageUnpack, blocks(l.PackedBytes(tokens)/2, elemThreads), elemThreads, kp.ptr, src, argI(int(page)),
		argI(tokens), argI(l.Layers), argI(l.PageSize), argI(pe), argI(rf), argI(eu))
}

func (kp *KVPool) sync() error {
	kp.syncs++
	d := kp.b.drv
	return d.check("cuStreamSynchronize", C.bk_stream_sync(d.c, C.uintptr_t(kp.stream)))
}

// ReadPage implements kernels.DeviceKV: the pack kernel gathers the rows
// into the device staging page, one copy brings them to pinned memory.
func (kp *KVPool) ReadPage(page int32, tokens int, dst []byte) ([]byte, error) {
	if err := kp.check(page, tokens); err != nil {
		return dst, err
	}
	size := kp.layout.PackedBytes(tokens)
	if cap(dst) < size {
		dst = make([]byte, size)
	}
	dst = dst[:size]
	if size == 0 {
		return dst, nil
	}
	if err := kp.enter(page); err != nil {
		return dst, err
	}
	defer kp.leave()
	d := kp.b.drv
	if err := kp.pack(kp.stage, page, tokens); err != nil {
		return dst, err
	}
	if err := d.check("cuMemcpyDtoHAsync", C.bk_dtoh(d.c, kp.host, C.bk_dptr(kp.stage), C.size_t(size), C.uintptr_t(kp.stream))); err != nil {
		return dst, err
	}
	if err := kp.sync(); err != nil {
		return dst, err
	}
	copy(dst, unsafe.Slice((*byte)(kp.host), size))
	return dst, nil
}

// ReadPages implements kernels.PagesReader: each page packed into its
// place in one device buffer, one copy of them all to pinned memory, one
// wait.
func (kp *KVPool) ReadPages(pages []int32, tokens []int) ([][]byte, error) {
	if len(pages) != len(tokens) {
		return nil, fmt.Errorf("cuda: %d pages and %d token counts", len(pages), len(tokens))
	}
	total := 0
	for i, p := range pages {
		if err := kp.check(p, tokens[i]); err != nil {
			return nil, err
		}
		total += kp.layout.PackedBytes(tokens[i])
	}
	out := make([][]byte, len(pages))
	if total == 0 {
		for i := range out {
			out[i] = []byte{}
		}
		return out, nil
	}
	if err := kp.enterReading(pages); err != nil {
		return nil, err
	}
	defer kp.leave()
	if err := kp.growMany(total); err != nil {
		return nil, err
	}
	l, d := kp.layout, kp.b.drv
	at := 0
	for i, p := range pages {
		size := l.PackedBytes(tokens[i])
		if size > 0 {
			if err := kp.pack(kp.many+uint64(at), p, tokens[i]); err != nil {
				return nil, err
			}
		}
		at += size
	}
	if err := d.check("cuMemcpyDtoHAsync", C.bk_dtoh(d.c, kp.manyHost, C.bk_dptr(kp.many), C.size_t(total), C.uintptr_t(kp.stream))); err != nil {
		return nil, err
	}
	if err := kp.sync(); err != nil {
		return nil, err
	}
	all := make([]byte, total)
	copy(all, unsafe.Slice((*byte)(kp.manyHost), total))
	at = 0
	for i := range pages {
		size := l.PackedBytes(tokens[i])
		out[i] = all[at : at+size : at+size]
		at += size
	}
	return out, nil
}

// growMany makes ReadPages' staging hold bytes, with the pool's lock held
// and its context current.
func (kp *KVPool) growMany(bytes int) (err error) {
	if bytes <= kp.manyBytes {
		return nil
	}
	defer catch(&err)
	kp.freeMany()
	d := kp.b.drv
	kp.many = kp.b.alloc(bytes, "KV pages staging")
	var h unsafe.Pointer
	if r := C.bk_host_alloc(d.c, &h, C.size_t(bytes)); r != 0 {
		return d.check("cuMemHostAlloc", r)
	}
	kp.manyHost, kp.manyBytes = h, bytes
	return nil
}

func (kp *KVPool) freeMany() {
	d := kp.b.drv.c
	if kp.many != 0 {
		C.bk_mem_free(d, C.bk_dptr(kp.many))
	}
	if kp.manyHost != nil {
		C.bk_host_free(d, kp.manyHost)
	}
	kp.many, kp.manyHost, kp.manyBytes = 0, nil, 0
}

// WritePage implements kernels.DeviceKV: the inverse of ReadPage.
func (kp *KVPool) WritePage(page int32, tokens int, src []byte) error {
	if err := kp.check(page, tokens); err != nil {
		return err
	}
	size := kp.layout.PackedBytes(tokens)
	if len(src) != size {
		return fmt.Errorf("cuda: page payload of %d bytes, want %d for %d tokens", len(src), size, tokens)
	}
	if size == 0 {
		return nil
	}
	if err := kp.enter(-1); err != nil {
		return err
	}
	defer kp.leave()
	d := kp.b.drv
	copy(unsafe.Slice((*byte)(kp.host), size), src)
	if err := d.check("cuMemcpyHtoDAsync", C.bk_htod(d.c, C.bk_dptr(kp.stage), kp.host, C.size_t(size), C.uintptr_t(kp.stream))); err != nil {
		return err
	}
	if err := kp.unpack(page, tokens, kp.stage); err != nil {
		return err
	}
	return kp.sync()
}

// Fill implements kernels.DeviceKV.
func (kp *KVPool) Fill(pages []int32, v float32) error {
	for _, p := range pages {
		if err := kp.check(p, 0); err != nil {
			return err
		}
	}
	if err := kp.enter(-1); err != nil {
		return err
	}
	defer kp.leave()
	d, pf := kp.b.drv, kp.layout.PageFloats()
	fill := func(first, n int) error {
		return d.check("cuMemsetD32Async", C.bk_memset32(d.c, C.bk_dptr(kp.ptr+uint64(4*first*pf)), C.uint(math.Float32bits(v)),
			C.size_t(n*pf), C.uintptr_t(kp.stream)))
	}
	if pages == nil {
		if err := fill(0, kp.pages); err != nil {
			return err
		}
	}
	for _, p := range pages {
		if err := fill(int(p), 1); err != nil {
			return err
		}
	}
	return kp.sync()
}

// Close implements kernels.DeviceKV: frees the pool's device and host
// memory. Kernels must not be given it after.
func (kp *KVPool) Close() error {
	b := kp.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed { // the backend's Close freed it
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := b.drv
	if err := d.check("cuCtxSetCurrent", C.bk_ctx_set(d.c, C.uintptr_t(b.ctx))); err != nil {
		return err
	}
	// No kernel may still read it; a device that fails here has failed
	// already, and the memory goes all the same.
	err := d.check("cuStreamSynchronize", C.bk_stream_sync(d.c, C.uintptr_t(b.stream)))
	kp.release()
	delete(b.pools, kp)
	return err
}

// release frees what AllocKV made, with the backend's lock held and its
// context current.
func (kp *KVPool) release() {
	kp.mu.Lock()
	defer kp.mu.Unlock()
	if kp.closed {
		return
	}
	kp.closed = true
	d := kp.b.drv.c
	if kp.stream != 0 {
		C.bk_stream_sync(d, C.uintptr_t(kp.stream))
		C.bk_stream_destroy(d, C.uintptr_t(kp.stream))
	}
	kp.releaseIPC()
	kp.releaseSlots()
	if kp.event != 0 {
		C.bk_event_destroy(d, C.uintptr_t(kp.event))
	}
	if kp.pinned {
		C.bk_host_free(d, kp.host)
	} else if kp.host != nil {
		C.free(kp.host)
	}
	kp.freeMany()
	kp.freeSums()
	for _, p := range []dptr{kp.ptr, kp.stage} {
		if p != 0 {
			C.bk_mem_free(d, C.bk_dptr(p))
		}
	}
	kp.host, kp.ptr, kp.stage = nil, 0, 0
}

// devKV is the device address of kv's pool, which must be this backend's
// and of the layout kv describes (the kernels address it by that layout).
func (b *Backend) devKV(kv kernels.PagedKV) dptr {
	kp, ok := kv.Device.(*KVPool)
	if !ok || kp.b != b {
		panic("cuda: the KV pool must be GPU memory of this backend (AllocKV), not host memory")
	}
	if kp.ptr == 0 {
		panic("cuda: KV pool used after Close")
	}
	l := kp.layout
	if kv.PageSize != l.PageSize || kv.Layers != l.Layers || kv.KVHeads != l.KVHeads || kv.HeadDim != l.HeadDim {
		panic(fmt.Sprintf("cuda: KV pool allocated as %d layers x %d heads x %d, page %d; used as %d x %d x %d, page %d",
			l.Layers, l.KVHeads, l.HeadDim, l.PageSize, kv.Layers, kv.KVHeads, kv.HeadDim, kv.PageSize))
	}
	return kp.ptr
}
