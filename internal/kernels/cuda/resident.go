package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
	"weak"

	"github.com/batonlm/baton/internal/kernels"
)

// keptBuf is an activation buffer kept on the device (kernels.Resident):
// a device copy of the host slice's whole capacity.
type keptBuf struct {
	key  weak.Pointer[float32] // the host slice's first element, while it lives
	base uintptr               // its address
	n    int                   // floats: its capacity
	dev  dptr
	// hostOK: the host slice holds the current value; devOK: the device
	// copy does. At least one is true; both when they agree.
	hostOK, devOK bool
	// stale is how many floats from the start the device wrote since the
	// host copy was last current (results start a buffer): what toHost
	// copies, rather than the whole capacity (a step's logits are sized
	// for the largest batch).
	stale int
}

var _ kernels.Resident = (*Backend)(nil)

// Keep implements kernels.Resident. The slices must be Go memory.
func (b *Backend) Keep(bufs ...[]float32) {
	b.lock()
	defer b.unlock()
	for _, s := range bufs {
		if cap(s) == 0 {
			continue
		}
		s = s[:cap(s)]
		if b.keptOf(s) != nil {
			continue
		}
		p := uintptr(unsafe.Pointer(&s[0]))
		if old := b.kept[p]; old != nil { // a collected slice's, not freed yet
			b.sync()
			b.forget(old)
		}
		e := &keptBuf{key: weak.Make(&s[0]), base: p, n: len(s), hostOK: true}
		e.dev = b.alloc(4*e.n, "an activation buffer")
		b.kept[p] = e
		runtime.AddCleanup(&s[0], b.queueFree, pendingFree{act: e})
	}
}

// Forget implements kernels.Resident.
func (b *Backend) Forget(bufs ...[]float32) {
	b.lock()
	defer b.unlock()
	synced := false
	for _, s := range bufs {
		if e := b.keptOf(s); e != nil {
			if !synced { // queued kernels may still use it
				b.sync()
				synced = true
			}
			b.forget(e)
		}
	}
}

// forget frees a kept buffer's device copy (nothing queued may use it).
func (b *Backend) forget(e *keptBuf) {
	if b.kept[e.base] == e {
		delete(b.kept, e.base)
	}
	if e.dev != 0 {
		C.bk_mem_free(b.drv.c, C.bk_dptr(e.dev))
		e.dev = 0
	}
}

// Host implements kernels.Resident.
func (b *Backend) Host(bufs ...[]float32) {
	b.lock()
	defer b.unlock()
	for _, s := range bufs {
		b.toHost(s)
	}
}

// Changed implements kernels.Resident.
func (b *Backend) Changed(bufs ...[]float32) {
	b.lock()
	defer b.unlock()
	for _, s := range bufs {
		b.hostWrote(s)
	}
}

// keptOf is the kept buffer that s starts, or nil; it panics on a slice
// that starts inside a kept buffer (its host memory may be stale, and its
// device copy is not addressed from there). Lookups go by address (s may
// be memory Go does not own); an entry counts only while its slice lives,
// since a collected slice's address can be reused.
func (b *Backend) keptOf(s []float32) *keptBuf {
	if len(b.kept) == 0 || cap(s) == 0 {
		return nil
	}
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	if e := b.kept[p]; e != nil {
		if e.key.Value() != nil {
			return e
		}
		return nil
	}
	for _, e := range b.kept {
		if p > e.base && p < e.base+uintptr(4*e.n) && e.key.Value() != nil {
			panic(fmt.Sprintf("cuda: a slice starting %d floats into a kept activation buffer", (p-e.base)/4))
		}
	}
	return nil
}

// in is the device address of input s: a kept buffer (first brought up to
// date from the host if the host wrote it) or scratch buffer i.
func (b *Backend) in(i int, s []float32) dptr {
	if e := b.keptOf(s); e != nil {
		b.toDevice(e, s)
		return e.dev
	}
	return upload(b, i, s)
}

// toDevice brings the device copy of e up to date; s starts e.
func (b *Backend) toDevice(e *keptBuf, s []float32) {
	if !e.devOK {
		if r := b.g.rec; r != nil {
			r.warm = true
		}
		b.h2d(e.dev, unsafe.Pointer(unsafe.SliceData(s)), 4*e.n)
		e.devOK = true
	}
}

// out is where a call writes its n-float result for s, and what the call
// hands to wrote after queueing its kernels: a kept buffer keeps the
// result on the device (the host copy is stale from then on); anything
// else goes through scratch buffer i and is copied to s.
func (b *Backend) out(i int, s []float32, n int) (dptr, written) {
	if e := b.keptOf(s); e != nil {
		b.toDevice(e, s) // the part the call does not write stays current
		return e.dev, written{kept: e, n: n}
	}
	p := b.buf(i, 4*n)
	return p, written{n: n, s: s, p: p}
}

// inOut is in and out for a call that rewrites s in place.
func (b *Backend) inOut(i int, s []float32) (dptr, written) {
	if e := b.keptOf(s); e != nil {
		b.toDevice(e, s)
		return e.dev, written{kept: e, n: len(s)}
	}
	p := upload(b, i, s)
	return p, written{n: len(s), s: s, p: p}
}

// written is what out and inOut leave for after a call's kernels are
// queued (wrote). A value, where a closure would be an allocation in
// every operation of a step.
type written struct {
	kept *keptBuf // its device copy is now the newer, up to n floats
	n    int
	s    []float32 // not kept: s[:n] comes back from p
	p    dptr
}

// wrote finishes what out or inOut began: a kept buffer's host copy is
// marked stale, anything else copied back from its scratch buffer.
func (b *Backend) wrote(w written) {
	if e := w.kept; e != nil {
		e.hostOK, e.stale = false, max(e.stale, w.n)
		return
	}
	download(b, w.s[:w.n], w.p)
}

// toHost brings the host copy of a kept s up to date.
func (b *Backend) toHost(s []float32) {
	if e := b.keptOf(s); e != nil && !e.hostOK {
		b.d2h(unsafe.Pointer(unsafe.SliceData(s)), e.dev, 4*e.stale)
		e.hostOK, e.stale = true, 0
	}
}

// hostWrote records that the host wrote a kept s.
func (b *Backend) hostWrote(s []float32) {
	if e := b.keptOf(s); e != nil {
		e.hostOK, e.devOK, e.stale = true, false, 0
	}
}
