package cuda

/*
#include "driver.h"
*/
import "C"

// Page copies in runs. A full page's packed rows (kernels.PackPage) are
// the page's memory as the pool lays it out (KOffset, VOffset), so
// consecutive full pages whose packed rows sit back to back elsewhere (an
// arena, a peer's mapped arena) move between there and the pool as one
// device-to-device copy: one copy a run of pages covering every layer,
// rather than a pack or unpack launch a page. A partial page (a prompt's
// last) is still the pack or unpack kernel.

// pageCopy is one page's move between the pool and packed rows at other.
type pageCopy struct {
	page   int32
	tokens int
	other  dptr
}

// copyPages queues the moves on the pool's stream, out of the pool into
// the packed rows (toPool false, Stage's packs) or into it (toPool true,
// a peer's pages landing), runs of full pages as single copies. With the
// pool's lock held and the context current.
func (kp *KVPool) copyPages(moves []pageCopy, toPool bool) error {
	l := kp.layout
	pageBytes := uint64(l.PackedBytes(l.PageSize))
	for i := 0; i < len(moves); {
		m := moves[i]
		if m.tokens == 0 {
			i++
			continue
		}
		if m.tokens != l.PageSize {
			var err error
			if toPool {
				err = kp.unpack(m.page, m.tokens, m.other)
			} else {
				err = kp.pack(m.other, m.page, m.tokens)
			}
			if err != nil {
				return err
			}
			i++
			continue
		}
		n := 1
		for i+n < len(moves) {
			next := moves[i+n]
			if next.tokens != l.PageSize || next.page != m.page+int32(n) || next.other != m.other+uint64(n)*pageBytes {
				break
			}
			n++
		}
		pool := kp.ptr + uint64(m.page)*pageBytes
		dst, src := m.other, pool
		if toPool {
			dst, src = pool, m.other
		}
		d := kp.b.drv
		if err := d.check("cuMemcpyDtoDAsync", C.bk_dtod(d.c, C.bk_dptr(dst), C.bk_dptr(src), C.size_t(uint64(n)*pageBytes),
			C.uintptr_t(kp.stream))); err != nil {
			return err
		}
		kp.runCopies++
		i += n
	}
	return nil
}
