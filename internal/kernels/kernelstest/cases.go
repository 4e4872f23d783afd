package kernelstest

import (
	"math"
	"math/rand/v2"

	"github.com/batonlm/baton/internal/kernels"
)

// MatMag is Σ|w[r,c]·x[i,c]|, the scale against which element (i, r) of
// a product's error is measured.
func MatMag(w *kernels.Matrix, x []float32, i, r int) float64 {
	row := make([]float32, w.Cols)
	w.Row(r, row)
	var s float64
	for c, v := range row {
		s += math.Abs(float64(v) * float64(x[i*w.Cols+c]))
	}
	return s
}

// SameBits says a and b are the same float32 (any NaN matches any NaN).
func SameBits(a, b float32) bool {
	if math.IsNaN(float64(a)) {
		return math.IsNaN(float64(b))
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// RoPECase is one rotation the parity tests check: Heads heads of HD.
type RoPECase struct {
	Heads, HD int
	R         kernels.RoPE
}

// RoPECases are normal and NeoX pairs, llama3 frequency factors, linear
// position scaling, partial rotation and odd sizes.
func RoPECases(rng *rand.Rand) []RoPECase {
	factors := func(n int) []float32 {
		f := make([]float32, n)
		for i := range f {
			f[i] = float32(1 + 7*rng.Float64())
		}
		return f
	}
	return []RoPECase{
		{4, 64, kernels.RoPE{Dim: 64, Theta: 10000}},
		{4, 64, kernels.RoPE{Dim: 64, Theta: 10000, NeoX: true}},
		{3, 128, kernels.RoPE{Dim: 128, Theta: 500000, NeoX: true, Factors: factors(64)}},
		{3, 128, kernels.RoPE{Dim: 128, Theta: 500000, Factors: factors(64)}},
		{2, 80, kernels.RoPE{Dim: 32, Theta: 10000, PosScale: 0.25}},
		{2, 80, kernels.RoPE{Dim: 32, Theta: 10000, PosScale: 0.25, NeoX: true}},
		{5, 8, kernels.RoPE{Dim: 6, Theta: 1e6, NeoX: true}},
		{1, 10, kernels.RoPE{Dim: 2, Theta: 10000}},
	}
}

// AttnCase is an attention call over a host pool whose pages are drawn at
// random (neighbours in position are not neighbours in memory), with
// random garbage everywhere not written.
type AttnCase struct {
	KV    kernels.PagedKV // 2 layers
	Seqs  []kernels.AttnSeq
	Q     []float32
	Heads int
	Rows  int // query rows of all sequences
}

// NewAttnCase makes one sequence per shape (QLen, KVLen), their query rows
// in reverse order so that QStart is not monotone.
func NewAttnCase(rng *rand.Rand, heads, kvHeads, hd, ps int, shapes [][2]int) AttnCase {
	totalPages := 3
	for _, s := range shapes {
		totalPages += (s[1] + ps - 1) / ps
	}
	kv := kernels.PagedKV{PageSize: ps, Layers: 2, KVHeads: kvHeads, HeadDim: hd}
	kv.Data = RandVec(rng, totalPages*kv.PageFloats(), 1)
	perm := rng.Perm(totalPages)
	c := AttnCase{KV: kv, Heads: heads}
	for _, s := range shapes {
		c.Rows += s[0]
	}
	row := c.Rows
	for _, s := range shapes {
		qlen, kvlen := s[0], s[1]
		pages := make([]int32, (kvlen+ps-1)/ps)
		for j := range pages {
			pages[j] = int32(perm[0])
			perm = perm[1:]
		}
		row -= qlen
		c.Seqs = append(c.Seqs, kernels.AttnSeq{Pages: pages, QStart: row, QLen: qlen, KVLen: kvlen})
	}
	c.Q = RandVec(rng, c.Rows*heads*hd, 1)
	return c
}

// InOrder lays the rows out as the model does (QStart increasing from 0).
func (c AttnCase) InOrder() AttnCase {
	r := 0
	c.Seqs = append([]kernels.AttnSeq(nil), c.Seqs...)
	for i := range c.Seqs {
		c.Seqs[i].QStart = r
		r += c.Seqs[i].QLen
	}
	return c
}

// NarrowKV is kv's pool stored in dt: the same elements at the same
// offsets (garbage included), rounded as StoreKV rounds them.
func NarrowKV(kv kernels.PagedKV, dt kernels.DType) kernels.PagedKV {
	n := kv
	n.DType = dt
	n.Data = make([]float32, len(kv.Data)/kv.PageFloats()*n.PageFloats())
	for off := 0; off < len(kv.Data); off += kv.RowFloats() {
		n.StoreRow(off, kv.Data[off:off+kv.RowFloats()])
	}
	return n
}
