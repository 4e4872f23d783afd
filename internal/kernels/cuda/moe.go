package cuda

import (
	"math"
	"slices"

	"github.com/batonlm/baton/internal/kernels"
)

// Geometry shared with kernels/moe.cuh.
const (
	moeSegFields = 8 // BK_MOE_SEG_FIELDS
	maxGridY     = 65535
)

var _ kernels.ExpertRunner = (*Backend)(nil)

// moePlan is an Experts call laid out on the host: the n*k (row, expert)
// pairs of the step ordered by expert (pick order within one), so that
// each expert's rows are one segment of consecutive slots.
type moePlan struct {
	count []int // rows per expert, then (prefix sums) each expert's first slot
	// route is what goes to the device in one copy: the row of each slot,
	// then the slot of each pick, then each pick's weight (float bits).
	route []uint32
	// seg is the segment table of the grouped products, BK_MOE_SEG_FIELDS
	// a segment of up to gemvMaxN slots.
	seg []int64
	// big are the experts whose rows run through b.matmul (cuBLAS), one
	// product each: (expert, first slot, rows).
	big [][3]int
}

// planExperts lays out an Experts call; segments of more than b.gemvMax
// rows go to big when cuBLAS is there (the choice MatMul makes for a
// product of that many rows), the rest to the table in chunks the gemv
// kernel takes. It uploads the weights of experts not yet on the device.
func (b *Backend) planExperts(experts []kernels.Expert, pick []int32, weight []float32, k int) *moePlan {
	p := &b.moe
	ns := len(pick)
	p.count = slices.Grow(p.count[:0], len(experts))[:len(experts)]
	clear(p.count)
	for _, e := range pick {
		p.count[e]++
	}
	p.route = slices.Grow(p.route[:0], 3*ns)[:3*ns]
	rows, slots, ws := p.route[:ns], p.route[ns:2*ns], p.route[2*ns:]
	p.seg, p.big = p.seg[:0], p.big[:0]
	first := 0
	for e, r := range p.count {
		p.count[e] = first
		if r == 0 {
			continue
		}
		if r > b.gemvMax && b.blas != nil {
			p.big = append(p.big, [3]int{e, first, r})
		} else {
			ex := &experts[e]
			g, u, d := b.weight(ex.Gate), b.weight(ex.Up), b.weight(ex.Down)
			for c := 0; c < r; c += gemvMaxN {
				p.seg = append(p.seg, int64(first+c), int64(min(gemvMaxN, r-c)), int64(g.ptr), int64(g.dtype),
					int64(u.ptr), int64(u.dtype), int64(d.ptr), int64(d.dtype))
			}
		}
		first += r
	}
	for i, e := range pick {
		s := p.count[e]
		p.count[e]++
		rows[s], slots[i], ws[i] = uint32(i/k), uint32(s), math.Float32bits(weight[i])
	}
	return p
}

// Experts implements kernels.ExpertRunner. The rows of x are gathered by
// expert on the device; each product (gate, up, down) of every expert with
// at most b.gemvMax rows is one launch of the grouped gemv kernel over all
// of them, and each expert with more runs b.matmul (cuBLAS) on its slice
// of the gathered rows; SwiGLU is one launch over all slots, and the
// weighted sum of each row's k outputs one more. Only the routing tables
// are copied in: the experts' weights are the cached device copies, x and
// out stay on the device when kept.
func (b *Backend) Experts(out, x []float32, n int, experts []kernels.Expert, pick []int32, weight []float32, k int) {
	if n <= 0 {
		return
	}
	kernels.CheckExperts(out, x, n, experts, pick, weight, k)
	d, ff := experts[0].Gate.Cols, experts[0].Gate.Rows
	pick, weight = pick[:n*k], weight[:n*k]
	ns := n * k
	b.lock()
	defer b.unlock()
	b.expertCalls++
	p := b.planExperts(experts, pick, weight, k)
	route := upload(b, sMoERoute, p.route)
	rows, slots, ws := route, route+uint64(4*ns), route+uint64(8*ns)
	var seg dptr
	if len(p.seg) > 0 {
		seg = upload(b, sMoESeg, p.seg)
	}
	dx := b.in(sX, x[:n*d])
	gx := b.buf(sMoEX, 4*ns*d)
	gate, up := b.buf(sMoEGate, 4*ns*ff), b.buf(sMoEUp, 4*ns*ff)
	y := b.buf(sMoEY, 4*ns*d)

	b.launch(kMoEGather, blocks(ns*d, elemThreads), 1, elemThreads, 0, gx, dx, rows, argI(ns), argI(d))
	b.moeProduct(experts, p, seg, moeGate, gate, gx, ff, d)
	b.moeProduct(experts, p, seg, moeUp, up, gx, ff, d)
	b.launch(kSwiGLU, blocks(ns*ff, elemThreads), 1, elemThreads, 0, gate, gate, up, argI(ns*ff), 0, 0)
	b.moeProduct(experts, p, seg, moeDown, y, gate, d, ff)
	do, done := b.out(sOut, out, n*d)
	b.launch(kMoEScatter, blocks(n*d, elemThreads), 1, elemThreads, 0, do, y, slots, ws, argI(n), argI(k), argI(d))
	b.wrote(done)
}

// The products of an expert, in the order of their pairs in a segment.
const (
	moeGate = iota
	moeUp
	moeDown
)

// moeProduct runs product which (matrices of rows × cols) for every
// segment: out (slot rows of rows) from in (slot rows of cols), both
// gathered buffers.
func (b *Backend) moeProduct(experts []kernels.Expert, p *moePlan, seg dptr, which int, out, in dptr, rows, cols int) {
	nseg := len(p.seg) / moeSegFields
	for s := 0; s < nseg; s += maxGridY {
		b.launch(kMoEGemv, (rows+gemvWarps-1)/gemvWarps, min(maxGridY, nseg-s), 32*gemvWarps, 0,
			out, in, seg+uint64(8*moeSegFields*s), argI(which), argI(rows), argI(cols))
	}
	for _, g := range p.big {
		e, first, r := g[0], g[1], g[2]
		ex := &experts[e]
		w := [...]*kernels.Matrix{moeGate: ex.Gate, moeUp: ex.Up, moeDown: ex.Down}[which]
		b.matmul(out+uint64(4*first*rows), in+uint64(4*first*cols), r, b.weight(w))
	}
}
