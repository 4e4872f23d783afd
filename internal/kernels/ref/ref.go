// Package ref is the plain-Go definition of every kernel: slow, obvious,
// and the yardstick that optimised backends are tested against.
package ref

import (
	"math"

	"github.com/batonlm/baton/internal/kernels"
)

// Backend is the reference implementation.
type Backend struct{}

// New returns the reference backend.
func New() *Backend { return &Backend{} }

// Name implements kernels.Backend.
func (*Backend) Name() string { return "ref" }

// SupportsKVDType implements kernels.KVDTypeSupporter: StoreRow and LoadRow
// define every KV dtype, and they are all this backend uses.
func (*Backend) SupportsKVDType(d kernels.DType) bool { return kernels.ValidKVDType(d) }

// MatMul implements kernels.Backend.
func (*Backend) MatMul(out, x []float32, n int, w *kernels.Matrix) {
	row := make([]float32, w.Cols)
	for r := 0; r < w.Rows; r++ {
		w.Row(r, row)
		for i := 0; i < n; i++ {
			xi := x[i*w.Cols : (i+1)*w.Cols]
			var s float64
			for c, v := range row {
				s += float64(v) * float64(xi[c])
			}
			out[i*w.Rows+r] = float32(s)
		}
	}
}

// RMSNorm implements kernels.Backend.
func (*Backend) RMSNorm(out, x, weight []float32, n int, eps float32) {
	d := len(weight)
	for i := 0; i < n; i++ {
		xi := x[i*d : (i+1)*d]
		var ss float64
		for _, v := range xi {
			ss += float64(v) * float64(v)
		}
		scale := 1 / math.Sqrt(ss/float64(d)+float64(eps))
		for j, v := range xi {
			out[i*d+j] = float32(float64(v)*scale) * weight[j]
		}
	}
}

// ApplyRoPE implements kernels.Backend.
func (*Backend) ApplyRoPE(x []float32, positions []int32, heads, headDim int, r kernels.RoPE) {
	half := r.Dim / 2
	scale := r.PositionScale()
	freqs := r.Frequencies()
	for t, pos := range positions {
		for h := 0; h < heads; h++ {
			v := x[(t*heads+h)*headDim:]
			for i := 0; i < half; i++ {
				ang := float64(pos) * scale * freqs[i]
				s, c := math.Sincos(ang)
				a, b := 2*i, 2*i+1
				if r.NeoX {
					a, b = i, i+half
				}
				x0, x1 := float64(v[a]), float64(v[b])
				v[a] = float32(x0*c - x1*s)
				v[b] = float32(x0*s + x1*c)
			}
		}
	}
}

// SwiGLU implements kernels.Backend.
func (*Backend) SwiGLU(out, gate, up []float32) {
	for i, g := range gate {
		out[i] = float32(float64(g)/(1+math.Exp(-float64(g)))) * up[i]
	}
}

// Add implements kernels.Backend.
func (*Backend) Add(out, a, b []float32) {
	for i := range out {
		out[i] = a[i] + b[i]
	}
}

// Embed implements kernels.Backend.
func (*Backend) Embed(out []float32, table *kernels.Matrix, ids []int32) {
	for i, id := range ids {
		table.Row(int(id), out[i*table.Cols:(i+1)*table.Cols])
	}
}

// StoreKV implements kernels.Backend.
func (*Backend) StoreKV(kv kernels.PagedKV, layer int, slots []int32, k, v []float32) {
	kernels.CheckHostKV("the ref backend", kv)
	rf := kv.RowFloats()
	for i, s := range slots {
		p, o := int(s)/kv.PageSize, int(s)%kv.PageSize
		kv.StoreRow(kv.KOffset(p, layer, o), k[i*rf:(i+1)*rf])
		kv.StoreRow(kv.VOffset(p, layer, o), v[i*rf:(i+1)*rf])
	}
}

// Attention implements kernels.Backend.
func (*Backend) Attention(out, q []float32, kv kernels.PagedKV, layer int, seqs []kernels.AttnSeq, heads int, scale float32) {
	kernels.CheckHostKV("the ref backend", kv)
	hd := kv.HeadDim
	group := heads / kv.KVHeads
	kr, vr := make([]float32, hd), make([]float32, hd)
	for _, s := range seqs {
		for i := 0; i < s.QLen; i++ {
			last := s.KVLen - s.QLen + i // inclusive
			row := s.QStart + i
			for h := 0; h < heads; h++ {
				qh := q[(row*heads+h)*hd : (row*heads+h+1)*hd]
				kh := h / group
				scores := make([]float64, last+1)
				maxv := math.Inf(-1)
				for p := 0; p <= last; p++ {
					pg, o := int(s.Pages[p/kv.PageSize]), p%kv.PageSize
					kv.LoadRow(kv.KOffset(pg, layer, o)+kh*hd, kr)
					var d float64
					for j := range qh {
						d += float64(qh[j]) * float64(kr[j])
					}
					scores[p] = d * float64(scale)
					maxv = math.Max(maxv, scores[p])
				}
				var sum float64
				for p := range scores {
					scores[p] = math.Exp(scores[p] - maxv)
					sum += scores[p]
				}
				acc := make([]float64, hd)
				for p := range scores {
					pg, o := int(s.Pages[p/kv.PageSize]), p%kv.PageSize
					kv.LoadRow(kv.VOffset(pg, layer, o)+kh*hd, vr)
					w := scores[p] / sum
					for j := range acc {
						acc[j] += w * float64(vr[j])
					}
				}
				o := out[(row*heads+h)*hd:]
				for j := range acc {
					o[j] = float32(acc[j])
				}
			}
		}
	}
}
