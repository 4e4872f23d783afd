package model

import (
	"math"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// The K rows a forward pass stores are rotated by each token's absolute
// position. Greedy output cannot see a shift of every position (q and k
// move together, so attention only sees relative positions), but a prefix
// cache or a handoff that pairs KV from one pass with queries from another
// would. Layer 0's K depends on its own token alone, so it is computed
// here in float64 from the weights and the textbook rotation (angle =
// position * theta^(-2i/dim) on adjacent pairs), independently of the
// kernels' RoPE code, and compared with what the pool holds.
func TestKVRowsAtAbsolutePositions(t *testing.T) {
	for _, be := range []kernels.Backend{ref.New(), cpu.New(1)} {
		l, err := Load(LoadOptions{}, be)
		if err != nil {
			t.Fatal(err)
		}
		m := l.Model
		c := &m.Config
		if c.RoPE.NeoX || c.RoPE.Factors != nil || c.RoPE.PositionScale() != 1 || m.Weights.Layers[0].QNorm != nil || m.Weights.Layers[0].KBias != nil {
			t.Fatalf("the check below is for plain llama RoPE; the bundled model has %+v", c.RoPE)
		}
		const n, pageSize = 40, 16
		kv := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
		kv.Data = make([]float32, 3*kv.PageFloats())
		b := &Batch{Seqs: []kernels.AttnSeq{{Pages: []int32{0, 1, 2}, QLen: n, KVLen: n}}}
		for p := range n {
			b.Tokens = append(b.Tokens, int32(1+(p*37)%(c.Vocab-1)))
			b.Positions = append(b.Positions, int32(p))
			b.Slots = append(b.Slots, int32(p))
		}
		if _, err := m.Forward(b, kv); err != nil {
			t.Fatal(err)
		}
		for _, p := range []int{0, 1, 17, 39} {
			want := layer0K(m, b.Tokens[p], p)
			got := kv.Data[kv.KOffset(p/pageSize, 0, p%pageSize):][:len(want)]
			for i := range want {
				if math.Abs(float64(got[i])-want[i]) > 1e-4*(1+math.Abs(want[i])) {
					t.Fatalf("%s: position %d, K[%d] = %v, want %v", be.Name(), p, i, got[i], want[i])
				}
			}
		}
		m.Close()
	}
}

// layer0K is layer 0's rotated K row of token at position pos, in float64.
func layer0K(m *Model, token int32, pos int) []float64 {
	c := &m.Config
	ly := &m.Weights.Layers[0]
	x := make([]float32, c.Dim)
	m.Weights.Embed.Row(int(token), x)
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	inv := 1 / math.Sqrt(ss/float64(c.Dim)+float64(c.NormEps))
	h := make([]float64, c.Dim)
	for i, v := range x {
		h[i] = float64(v) * inv * float64(ly.AttnNorm[i])
	}
	k := make([]float64, c.KVHeads*c.HeadDim)
	row := make([]float32, c.Dim)
	for r := range k {
		ly.K.Row(r, row)
		for i, w := range row {
			k[r] += float64(w) * h[i]
		}
	}
	for hd := 0; hd < c.KVHeads; hd++ {
		v := k[hd*c.HeadDim:]
		for i := 0; i < c.RoPE.Dim/2; i++ {
			ang := float64(pos) * math.Pow(float64(c.RoPE.Theta), -2*float64(i)/float64(c.RoPE.Dim))
			s, co := math.Sincos(ang)
			x0, x1 := v[2*i], v[2*i+1]
			v[2*i], v[2*i+1] = x0*co-x1*s, x0*s+x1*co
		}
	}
	return k
}
