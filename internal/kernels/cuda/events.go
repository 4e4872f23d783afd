package cuda

/*
#include "driver.h"
*/
import "C"

import "unsafe"

// Device-side timing and raw copies, for the GPU benchmarks.

// timed runs fn (which queues work on the stream) between two events and
// returns the device time in seconds. The caller holds the lock.
func (b *Backend) timed(fn func()) float64 {
	d := b.drv.c
	b.flush()
	var e0, e1 C.uintptr_t
	b.must("cuEventCreate", C.bk_event_create(d, &e0, 0))
	defer C.bk_event_destroy(d, e0)
	b.must("cuEventCreate", C.bk_event_create(d, &e1, 0))
	defer C.bk_event_destroy(d, e1)
	b.must("cuEventRecord", C.bk_event_record(d, e0, C.uintptr_t(b.stream)))
	fn()
	b.must("cuEventRecord", C.bk_event_record(d, e1, C.uintptr_t(b.stream)))
	b.must("cuEventSynchronize", C.bk_event_sync(d, e1))
	var ms C.float
	b.must("cuEventElapsedTime", C.bk_event_elapsed(d, &ms, e0, e1))
	return float64(ms) / 1e3
}

// copyDtoD queues a device-to-device copy (cuMemcpyDtoDAsync).
func (b *Backend) copyDtoD(dst, src dptr, bytes int) {
	b.flush()
	b.must("cuMemcpyDtoDAsync", C.bk_dtod(b.drv.c, C.bk_dptr(dst), C.bk_dptr(src), C.size_t(bytes), C.uintptr_t(b.stream)))
}

// hostToDevice copies a host slice to device memory and waits.
func (b *Backend) hostToDevice(dst dptr, src []float32) {
	b.h2d(dst, unsafe.Pointer(unsafe.SliceData(src)), 4*len(src))
	b.sync()
}
