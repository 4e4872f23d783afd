package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// testAddRMSNorm: the fused residual add and norm gives, bit for bit, what
// Add then RMSNorm give on this backend, and both the sum and the norm
// agree with ref.
func testAddRMSNorm(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(51, 52))
	for _, c := range []struct{ n, d int }{{1, 64}, {3, 2048}, {5, 100}} {
		x := randVec(rng, c.n*c.d, 3)
		delta := randVec(rng, c.n*c.d, 1)
		w := randVec(rng, c.d, 1)
		wantX, wantOut := slices.Clone(x), make([]float32, c.n*c.d)
		b.Add(wantX, wantX, delta)
		b.RMSNorm(wantOut, wantX, w, c.n, 1e-6)
		gotX, gotOut := slices.Clone(x), make([]float32, c.n*c.d)
		b.AddRMSNorm(gotOut, gotX, delta, w, c.n, 1e-6)
		for i := range gotX {
			if math.Float32bits(gotX[i]) != math.Float32bits(wantX[i]) || math.Float32bits(gotOut[i]) != math.Float32bits(wantOut[i]) {
				t.Fatalf("n=%d d=%d element %d: fused x %g out %g, Add then RMSNorm %g %g", c.n, c.d, i, gotX[i], gotOut[i], wantX[i], wantOut[i])
			}
		}
		refX, refOut := slices.Clone(x), make([]float32, c.n*c.d)
		kernels.AddRMSNorm(ref.New(), refOut, refX, delta, w, c.n, 1e-6)
		ck := &checker{T: t, What: fmt.Sprintf("AddRMSNorm n=%d d=%d", c.n, c.d), Tol: tolRMSNorm}
		for i := range refOut {
			if gotX[i] != refX[i] {
				t.Fatalf("AddRMSNorm sum %d: %g, ref %g", i, gotX[i], refX[i])
			}
			ck.Check(i, gotOut[i], refOut[i], math.Abs(float64(refOut[i])), 1e-30)
		}
	}
}

// testRoPEStoreKV: the fused rotation and store leaves q and k rotated as
// ApplyRoPE does and the pool as StoreKV of the rotated k does (ref's, bit
// for bit in every KV dtype), with a partial rotary dimension and NeoX
// pairs too.
func testRoPEStoreKV(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(53, 54))
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
		for _, r := range []kernels.RoPE{{Dim: 16, Theta: 10000}, {Dim: 8, Theta: 500000, NeoX: true}} {
			const heads, kvh, hd = 8, 2, 16
			host := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: kvh, HeadDim: hd, DType: dt}
			host.Data = randVec(rng, 6*host.PageFloats(), 1)
			kv := toDevice(t, b, host)
			slots := []int32{5, 6, 7, 8, 22}
			positions := []int32{5, 6, 7, 8, 900}
			q := randVec(rng, len(slots)*heads*hd, 1)
			k := randVec(rng, len(slots)*kvh*hd, 1)
			v := randVec(rng, len(slots)*kvh*hd, 1)
			wantQ, wantK := slices.Clone(q), slices.Clone(k)
			kernels.RoPEStoreKV(ref.New(), wantQ, wantK, v, positions, heads, r, host, 1, slots)
			b.RoPEStoreKV(q, k, v, positions, heads, r, kv, 1, slots)
			what := fmt.Sprintf("RoPEStoreKV %s dim %d neox %v", dt, r.Dim, r.NeoX)
			ck := &checker{T: t, What: what, Tol: tolRoPE}
			for i := range q {
				ck.Check(i, q[i], wantQ[i], 1, 0)
			}
			for i := range k {
				ck.Check(len(q)+i, k[i], wantK[i], 1, 0)
			}
			// The pool holds the backend's own rotated k, rounded to dt.
			want := host
			want.Data = slices.Clone(host.Data)
			ref.New().StoreKV(want, 1, slots, k, v)
			for i, f := range fromDevice(t, kv) {
				if math.Float32bits(f) != math.Float32bits(want.Data[i]) {
					t.Fatalf("%s: pool word %d is %#x, want %#x", what, i, math.Float32bits(f), math.Float32bits(want.Data[i]))
				}
			}
		}
	}
}

// testGatherRows: rows copied in the order asked, repeats included, and a
// row outside src refused.
func testGatherRows(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(55, 56))
	const width = 37
	src := randVec(rng, 9*width, 1)
	rows := []int32{8, 0, 3, 3, 5}
	got := make([]float32, len(rows)*width)
	b.GatherRows(got, src, width, rows)
	for i, r := range rows {
		if !slices.Equal(got[i*width:(i+1)*width], src[int(r)*width:(int(r)+1)*width]) {
			t.Fatalf("row %d is not src row %d", i, r)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("GatherRows of row 9 of 9 did not panic")
		}
	}()
	b.GatherRows(got, src, width, []int32{9})
}
