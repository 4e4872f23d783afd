package kernels

import "fmt"

// The Check functions validate a Backend call's arguments the same way for
// every backend, and panic with what does not fit: a wrong shape is a bug
// in the caller, and a kernel must never read or write outside its slices.

func need(what string, have, want int) {
	if have < want {
		panic(fmt.Sprintf("kernels: %s has %d elements, needs %d", what, have, want))
	}
}

// CheckMatMul validates MatMul(out, x, n, w).
func CheckMatMul(out, x []float32, n int, w *Matrix) {
	if err := w.Validate(); err != nil {
		panic(err)
	}
	need("MatMul x", len(x), n*w.Cols)
	need("MatMul out", len(out), n*w.Rows)
}

// CheckRMSNorm validates RMSNorm over n rows of d.
func CheckRMSNorm(out, x []float32, n, d int) {
	need("RMSNorm x", len(x), n*d)
	need("RMSNorm out", len(out), n*d)
}

// CheckRoPE validates ApplyRoPE over rows positions.
func CheckRoPE(x []float32, rows, heads, headDim int, r RoPE) {
	if r.Dim > headDim {
		panic(fmt.Sprintf("kernels: RoPE dim %d > head dim %d", r.Dim, headDim))
	}
	need("ApplyRoPE x", len(x), rows*heads*headDim)
	if r.Factors != nil {
		need("RoPE Factors", len(r.Factors), r.Dim/2)
	}
}

// CheckElementwise validates an elementwise op over n elements (SwiGLU, Add).
func CheckElementwise(op string, n int, operands ...[]float32) {
	for i, s := range operands {
		need(fmt.Sprintf("%s operand %d", op, i), len(s), n)
	}
}

// CheckEmbed validates Embed: every id a row of table, out large enough.
func CheckEmbed(out []float32, table *Matrix, ids []int32) {
	if err := table.Validate(); err != nil {
		panic(err)
	}
	for _, id := range ids {
		if id < 0 || int(id) >= table.Rows {
			panic(fmt.Sprintf("kernels: Embed id %d out of range [0,%d)", id, table.Rows))
		}
	}
	need("Embed out", len(out), len(ids)*table.Cols)
}

// Pages is the number of whole pages the pool holds.
func (kv PagedKV) Pages() int {
	if kv.Device != nil {
		return kv.Device.Pages()
	}
	if kv.PageFloats() <= 0 {
		return 0
	}
	return len(kv.Data) / kv.PageFloats()
}

// CheckStoreKV validates StoreKV: the layer exists, every slot is in the pool.
func CheckStoreKV(kv PagedKV, layer int, slots []int32, k, v []float32) {
	if layer < 0 || layer >= kv.Layers {
		panic(fmt.Sprintf("kernels: StoreKV layer %d of %d", layer, kv.Layers))
	}
	total := kv.Pages() * kv.PageSize
	for _, s := range slots {
		if s < 0 || int(s) >= total {
			panic(fmt.Sprintf("kernels: StoreKV slot %d outside the pool of %d", s, total))
		}
	}
	n := len(slots) * kv.RowFloats()
	need("StoreKV k", len(k), n)
	need("StoreKV v", len(v), n)
}

// CheckAttention validates Attention whose q and out hold qLen and outLen
// floats: heads group evenly over KV heads, the layer exists, and for every
// sequence the rows fit q and out and the pages it reads are in the pool.
func CheckAttention(outLen, qLen int, kv PagedKV, layer int, seqs []AttnSeq, heads int) {
	hd := kv.HeadDim
	if kv.KVHeads <= 0 || hd <= 0 || kv.PageSize <= 0 || heads <= 0 || heads%kv.KVHeads != 0 {
		panic(fmt.Sprintf("kernels: Attention with %d heads, %d KV heads, head dim %d, page size %d",
			heads, kv.KVHeads, hd, kv.PageSize))
	}
	if layer < 0 || layer >= kv.Layers {
		panic(fmt.Sprintf("kernels: Attention layer %d of %d", layer, kv.Layers))
	}
	npages, rowSize := kv.Pages(), heads*hd
	for si, s := range seqs {
		if s.QLen <= 0 {
			continue
		}
		if s.KVLen < s.QLen || s.QStart < 0 {
			panic(fmt.Sprintf("kernels: Attention seq %d: QStart %d QLen %d KVLen %d", si, s.QStart, s.QLen, s.KVLen))
		}
		need("Attention q", qLen, (s.QStart+s.QLen)*rowSize)
		need("Attention out", outLen, (s.QStart+s.QLen)*rowSize)
		used := (s.KVLen + kv.PageSize - 1) / kv.PageSize
		need("Attention Pages", len(s.Pages), used)
		for _, p := range s.Pages[:used] {
			if p < 0 || int(p) >= npages {
				panic(fmt.Sprintf("kernels: Attention page %d out of range [0,%d)", p, npages))
			}
		}
	}
}

// CheckExperts validates Experts(out, x, n, experts, pick, weight, k):
// experts of one shape, k of them a row, every pick one of them.
func CheckExperts(out, x []float32, n int, experts []Expert, pick []int32, weight []float32, k int) {
	if len(experts) == 0 || k <= 0 || k > len(experts) {
		panic(fmt.Sprintf("kernels: Experts with %d experts, %d a row", len(experts), k))
	}
	d, ff := experts[0].Gate.Cols, experts[0].Gate.Rows
	for e, ex := range experts {
		if ex.Gate.Rows != ff || ex.Gate.Cols != d || ex.Up.Rows != ff || ex.Up.Cols != d || ex.Down.Rows != d || ex.Down.Cols != ff {
			panic(fmt.Sprintf("kernels: Experts: expert %d is not %dx%d gate and up and %dx%d down as expert 0 is", e, ff, d, d, ff))
		}
	}
	need("Experts pick", len(pick), n*k)
	need("Experts weight", len(weight), n*k)
	need("Experts x", len(x), n*d)
	need("Experts out", len(out), n*d)
	for i, e := range pick[:n*k] {
		if e < 0 || int(e) >= len(experts) {
			panic(fmt.Sprintf("kernels: Experts pick[%d] = %d of %d experts", i, e, len(experts)))
		}
	}
}
