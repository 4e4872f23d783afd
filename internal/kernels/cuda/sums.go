package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
)

var _ kernels.PageSummer = (*KVPool)(nil)

// sumThreads and sumBlocksPerPage shape bk_page_sum: a page of a 1.7B
// model's bf16 KV at 16 tokens is about 1.8 MB, 900K units, so a few
// blocks a page keep the SMs busy for a batch of pages without many
// atomics.
const (
	sumThreads       = 256
	sumBlocksPerPage = 16
)

// pageSums is SumPages' staging: out[n] then pages[n] then tokens[n], on
// the device and pinned on the host, grown to the most pages asked.
type pageSums struct {
	dev  dptr
	host unsafe.Pointer
	n    int
}

func (s *pageSums) bytes() int { return s.n * 16 }

// SumPages implements kernels.PageSummer: bk_page_sum over the pages where
// they are, then one copy of a word a page to the host.
func (kp *KVPool) SumPages(pages []int32, tokens []int) ([]uint64, error) {
	if len(pages) != len(tokens) {
		return nil, fmt.Errorf("cuda: %d pages and %d token counts", len(pages), len(tokens))
	}
	for i, p := range pages {
		if err := kp.check(p, tokens[i]); err != nil {
			return nil, err
		}
	}
	if len(pages) == 0 {
		return []uint64{}, nil
	}
	if err := kp.enterReading(pages); err != nil {
		return nil, err
	}
	defer kp.leave()
	return kp.sumPagesLocked(pages, tokens)
}

// sumPagesLocked is SumPages of checked pages, with the pool entered:
// queued on the pool's stream behind whatever is queued there already.
func (kp *KVPool) sumPagesLocked(pages []int32, tokens []int) ([]uint64, error) {
	if len(pages) == 0 {
		return []uint64{}, nil
	}
	if err := kp.growSums(len(pages)); err != nil {
		return nil, err
	}
	if err := kp.queueSums(kp.sums, pages, tokens); err != nil {
		return nil, err
	}
	if err := kp.sync(); err != nil {
		return nil, err
	}
	return kp.sumsOf(kp.sums, tokens), nil
}

// queueSums queues bk_page_sum of checked pages into s and the copy of
// the sums to s.host, on the pool's stream, with the pool entered; they
// are in once the stream passed that point (sumsOf reads them).
func (kp *KVPool) queueSums(s *pageSums, pages []int32, tokens []int) error {
	n := len(pages)
	host := unsafe.Slice((*byte)(s.host), s.bytes())
	clear(host[:8*n])
	pg := unsafe.Slice((*int32)(unsafe.Pointer(&host[8*n])), n)
	tk := unsafe.Slice((*int32)(unsafe.Pointer(&host[12*n])), n)
	for i := range pages {
		pg[i], tk[i] = pages[i], int32(tokens[i])
	}
	d, l := kp.b.drv, kp.layout
	pe, rf, eu := unitShape(l)
	if err := d.check("cuMemcpyHtoDAsync", C.bk_htod(d.c, C.bk_dptr(s.dev), s.host, C.size_t(16*n), C.uintptr_t(kp.stream))); err != nil {
		return err
	}
	kp.args = append(kp.args[:0], s.dev, kp.ptr, s.dev+uint64(8*n), s.dev+uint64(12*n), argI(l.Layers), argI(l.PageSize),
		argI(pe), argI(rf), argI(eu))
	if err := d.check("cuLaunchKernel bk_page_sum", C.bk_launch(d.c, C.uintptr_t(kp.b.fn[kPageSum]), C.uint(sumBlocksPerPage),
		C.uint(n), C.uint(sumThreads), 0, C.uintptr_t(kp.stream), (*C.uint64_t)(unsafe.Pointer(&kp.args[0])), C.int(len(kp.args)))); err != nil {
		return err
	}
	return d.check("cuMemcpyDtoHAsync", C.bk_dtoh(d.c, s.host, C.bk_dptr(s.dev), C.size_t(8*n), C.uintptr_t(kp.stream)))
}

// sumsOf is the PageSums queueSums brought back into s.host.
func (kp *KVPool) sumsOf(s *pageSums, tokens []int) []uint64 {
	sums := unsafe.Slice((*uint64)(s.host), len(tokens))
	out := make([]uint64, len(tokens))
	for i := range out {
		units := uint64(kp.layout.PackedBytes(tokens[i]) / 2)
		out[i] = sums[i] + units*kernels.PageSumUnitWeight
	}
	return out
}

// growSums makes SumPages' staging hold n pages, with the pool's lock held
// and its context current.
func (kp *KVPool) growSums(n int) (err error) {
	if kp.sums != nil && n <= kp.sums.n {
		return nil
	}
	kp.freeSums()
	kp.sums, err = kp.newPageSums(n)
	return err
}

// newPageSums allocates the staging of n pages' sums, with the pool's lock
// held and its context current.
func (kp *KVPool) newPageSums(n int) (_ *pageSums, err error) {
	defer catch(&err)
	s := &pageSums{n: max(n, 64)}
	s.dev = kp.b.alloc(s.bytes(), "page sums staging")
	if r := C.bk_host_alloc(kp.b.drv.c, &s.host, C.size_t(s.bytes())); r != 0 {
		C.bk_mem_free(kp.b.drv.c, C.bk_dptr(s.dev))
		return nil, kp.b.drv.check("cuMemHostAlloc", r)
	}
	return s, nil
}

// free releases s, with the context current.
func (s *pageSums) free(d *C.bk_cuda) {
	C.bk_mem_free(d, C.bk_dptr(s.dev))
	C.bk_host_free(d, s.host)
}

func (kp *KVPool) freeSums() {
	if kp.sums == nil {
		return
	}
	kp.sums.free(kp.b.drv.c)
	kp.sums = nil
}
