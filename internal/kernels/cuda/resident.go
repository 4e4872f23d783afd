package cuda

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
	key  weak.Pointer[float32]
	base uintptr // the host slice's first element
	n    int     // floats: its capacity
	dev  dptr
	// hostOK: the host slice holds the current value; devOK: the device
	// copy does. At least one is true; both when they agree.
	hostOK, devOK bool
}

var _ kernels.Resident = (*Backend)(nil)

// Keep implements kernels.Resident.
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
		key := weak.Make(&s[0])
		e := &keptBuf{key: key, base: uintptr(unsafe.Pointer(&s[0])), n: len(s), hostOK: true}
		e.dev = b.alloc(4*e.n, "an activation buffer")
		b.kept[key] = e
		runtime.AddCleanup(&s[0], b.queueFree, pendingFree{act: key})
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
// device copy is not addressed from there).
func (b *Backend) keptOf(s []float32) *keptBuf {
	if len(b.kept) == 0 || cap(s) == 0 {
		return nil
	}
	s = s[:1]
	if e := b.kept[weak.Make(&s[0])]; e != nil {
		return e
	}
	p := uintptr(unsafe.Pointer(&s[0]))
	for _, e := range b.kept {
		// Only a live buffer still owns its address range.
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
		b.h2d(e.dev, unsafe.Pointer(unsafe.SliceData(s)), 4*e.n)
		e.devOK = true
	}
}

// out is where a call writes its n-float result for s, and done, which the
// call runs after queueing its kernels: a kept buffer keeps the result on
// the device (the host copy is stale from then on); anything else goes
// through scratch buffer i and is copied to s.
func (b *Backend) out(i int, s []float32, n int) (dptr, func()) {
	if e := b.keptOf(s); e != nil {
		b.toDevice(e, s) // the part the call does not write stays current
		return e.dev, func() { e.hostOK = false }
	}
	p := b.buf(i, 4*n)
	return p, func() { download(b, s[:n], p) }
}

// inOut is in and out for a call that rewrites s in place.
func (b *Backend) inOut(i int, s []float32) (dptr, func()) {
	if e := b.keptOf(s); e != nil {
		b.toDevice(e, s)
		return e.dev, func() { e.hostOK = false }
	}
	p := upload(b, i, s)
	return p, func() { download(b, s, p) }
}

// toHost brings the host copy of a kept s up to date.
func (b *Backend) toHost(s []float32) {
	if e := b.keptOf(s); e != nil && !e.hostOK {
		b.d2h(unsafe.Pointer(unsafe.SliceData(s)), e.dev, 4*e.n)
		e.hostOK = true
	}
}

// hostWrote records that the host wrote a kept s.
func (b *Backend) hostWrote(s []float32) {
	if e := b.keptOf(s); e != nil {
		e.hostOK, e.devOK = true, false
	}
}
