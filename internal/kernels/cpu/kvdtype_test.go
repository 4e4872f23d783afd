package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// TestAttentionKVDType: over an F16 or BF16 pool the cpu backend matches
// the reference reading the same stored values (as tight as over F32),
// and both stay within the dtype's rounding of attention over the
// unrounded F32 pool.
//
// Groups of 1 and 2 query heads per KV head read the stored rows in place
// when decoding, a group of 4 widens them into a copy first; head sizes
// of 64 and 48 take the AVX-512 path where there is one (48 also its
// 16-wide column tail), 12 the AVX2 or scalar one.
func TestAttentionKVDType(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	vs := variants(t)
	shapes := [][2]int{{1, 1}, {1, 17}, {1, 150}, {23, 23}, {5, 70}, {0, 5}, {17, 64}, {2, 3}}
	type geo struct{ heads, kvh int }
	geos := []geo{{8, 2}, {4, 4}, {8, 4}}
	// Rounding each K and V element to the dtype's 2^-11 (F16) or 2^-8
	// (BF16) relative step moves a score by about that times |q||k| scale
	// and the output by about that times |v|; measured worst (relative to
	// 5, above any |v| here) is 2.8e-4 for F16 and 1.6e-3 for BF16.
	tolRound := map[kernels.DType]float64{kernels.F16: 1e-3, kernels.BF16: 6e-3}
	for _, dt := range []kernels.DType{kernels.F16, kernels.BF16} {
		for _, hd := range []int{64, 48, 12} {
			for _, gq := range geos {
				for _, ps := range []int{1, 16} {
					c := kernelstest.NewAttnCase(rng, gq.heads, gq.kvh, hd, ps, shapes)
					scale := float32(1 / math.Sqrt(float64(hd)))
					exact := make([]float32, len(c.Q))
					ref.New().Attention(exact, c.Q, c.KV, 1, c.Seqs, c.Heads, scale)
					nk := kernelstest.NarrowKV(c.KV, dt)
					want := make([]float32, len(c.Q))
					ref.New().Attention(want, c.Q, nk, 1, c.Seqs, c.Heads, scale)
					what := fmt.Sprintf("%s KV hd=%d heads=%d/%d ps=%d", dt, hd, gq.heads, gq.kvh, ps)
					ck := &checker{T: t, What: "ref " + what + " vs f32", Tol: tolRound[dt]}
					for i := range want {
						ck.Check(i, want[i], exact[i], 5, 0)
					}
					t.Logf("%s: worst rounding |err|/5 %.2g", what, ck.Worst)
					for _, v := range vs {
						got := make([]float32, len(c.Q))
						v.b.Attention(got, c.Q, nk, 1, c.Seqs, c.Heads, scale)
						ck := &checker{T: t, What: fmt.Sprintf("Attention %s [%s]", what, v.name), Tol: tolAttn}
						for i := range want {
							ck.Check(i, got[i], want[i], 5, 0)
						}
					}
				}
			}
		}
	}
}

// TestStoreKVDType: StoreKV into an F16/BF16 pool writes each element
// rounded to nearest, touches nothing else, and the pool takes half the
// words of an F32 one.
func TestStoreKVDType(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	for _, dt := range []kernels.DType{kernels.F16, kernels.BF16} {
		f := kernels.PagedKV{PageSize: 16, Layers: 3, KVHeads: 2, HeadDim: 8}
		kv := f
		kv.DType = dt
		if 2*kv.PageFloats() != f.PageFloats() || 2*kv.PackedBytes(5) != f.PackedBytes(5) {
			t.Fatalf("%s page is %d words (packed %d bytes), f32 %d (%d)", dt, kv.PageFloats(), kv.PackedBytes(5), f.PageFloats(), f.PackedBytes(5))
		}
		kv.Data = randVec(rng, 5*kv.PageFloats(), 1)
		before := append([]uint16(nil), kv.Halves()...)
		slots := []int32{0, 17, 79, 40, 41}
		rf := kv.RowFloats()
		k := randVec(rng, len(slots)*rf, 1)
		v := randVec(rng, len(slots)*rf, 1)
		wantKV := kv
		wantKV.Data = append([]float32(nil), kv.Data...)
		ref.New().StoreKV(wantKV, 2, slots, k, v)
		New(1).StoreKV(kv, 2, slots, k, v)
		written := map[int]float32{}
		for i, s := range slots {
			p, o := int(s)/kv.PageSize, int(s)%kv.PageSize
			for j := 0; j < rf; j++ {
				written[kv.KOffset(p, 2, o)+j] = k[i*rf+j]
				written[kv.VOffset(p, 2, o)+j] = v[i*rf+j]
			}
		}
		round := kernels.F32ToF16
		if dt == kernels.BF16 {
			round = kernels.F32ToBF16
		}
		for i, h := range kv.Halves() {
			want := before[i]
			if x, ok := written[i]; ok {
				want = round(x)
			}
			if h != want || wantKV.Halves()[i] != want {
				t.Fatalf("%s element %d: cpu %#x ref %#x, want %#x", dt, i, h, wantKV.Halves()[i], want)
			}
		}
	}
}

// TestStoreKVF16Bits: the F16C rounding StoreKV uses gives exactly
// kernels.F32ToF16 on every kind of float32: random bit patterns (NaNs
// with payloads, infinities, subnormals, values past the half range),
// ties to even at both ends of the half range, and rows whose length is
// not a multiple of the vector; on the SIMD and scalar paths.
func TestStoreKVF16Bits(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 46))
	kv := kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 20, DType: kernels.F16}
	rf := kv.RowFloats()
	var vals []float32
	for range 4000 {
		vals = append(vals, math.Float32frombits(rng.Uint32()))
	}
	for e := uint32(100); e < 145; e++ { // exponents from below half subnormals to past 65504
		for _, low := range []uint32{0x1000, 0x0fff, 0x1001, 0x3000, 0x2000 | 0x1000} {
			b := e<<23 | rng.Uint32()&0x7fe000 | low
			vals = append(vals, math.Float32frombits(b), -math.Float32frombits(b))
		}
	}
	vals = append(vals, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 65504, 65520, -65520, 0, float32(math.Copysign(0, -1)))
	for len(vals)%(2*rf) != 0 {
		vals = append(vals, 1)
	}
	bes := []variant{{"scalar", New(1)}}
	bes[0].b.simd = false
	if cpuHasSIMD {
		bes = append(bes, variant{"simd", New(1)})
	}
	for _, be := range bes {
		for at := 0; at < len(vals); at += 2 * rf {
			kv.Data = make([]float32, kv.PageFloats())
			k, v := vals[at:at+rf], vals[at+rf:at+2*rf]
			be.b.StoreKV(kv, 0, []int32{1}, k, v)
			h := kv.Halves()
			for j := 0; j < rf; j++ {
				if got, want := h[kv.KOffset(0, 0, 1)+j], kernels.F32ToF16(k[j]); got != want {
					t.Fatalf("[%s] %g (%#x): %#x, want %#x", be.name, k[j], math.Float32bits(k[j]), got, want)
				}
				if got, want := h[kv.VOffset(0, 0, 1)+j], kernels.F32ToF16(v[j]); got != want {
					t.Fatalf("[%s] %g (%#x): %#x, want %#x", be.name, v[j], math.Float32bits(v[j]), got, want)
				}
			}
		}
	}
}

// TestPoisonedHalfKVReadsNaN: a pool filled with kernels.KVNaN reads as
// NaN in every dtype, so attention over KV nobody wrote yields NaN.
func TestPoisonedHalfKVReadsNaN(t *testing.T) {
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
		kv := kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8, DType: dt}
		kv.Data = make([]float32, 2*kv.PageFloats())
		for i := range kv.Data {
			kv.Data[i] = kernels.KVNaN
		}
		q := make([]float32, 8)
		for _, v := range variants(t) {
			out := make([]float32, 8)
			v.b.Attention(out, q, kv, 0, []kernels.AttnSeq{{Pages: []int32{1}, QLen: 1, KVLen: 3}}, 1, 1)
			for i, x := range out {
				if !math.IsNaN(float64(x)) {
					t.Fatalf("%s [%s]: out[%d] = %v over poisoned KV", dt, v.name, i, x)
				}
			}
		}
	}
}

// TestAttentionNaNInKOrVReadsNaN: one NaN element in the K row, or in the
// V row, of a position (a slot half written, as a landing transfer can
// leave it) makes the output of every query row that attends to it NaN,
// for decode rows and prefill chunks, every kernel and KV dtype: the
// exp's clamp must not turn a NaN score into a finite weight. Rows that
// do not reach the position stay finite.
func TestAttentionNaNInKOrVReadsNaN(t *testing.T) {
	rng := rand.New(rand.NewPCG(39, 40))
	const heads, kvHeads, hd, ctx, qlen = 4, 2, 64, 40, 12
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
		for _, inV := range []bool{false, true} {
			kv := kernels.PagedKV{PageSize: 16, Layers: 1, KVHeads: kvHeads, HeadDim: hd, DType: dt}
			kv.Data = make([]float32, 3*kv.PageFloats())
			pages := []int32{2, 0, 1}
			for p := 0; p < ctx; p++ {
				off := kv.KOffset(int(pages[p/16]), 0, p%16)
				kv.StoreRow(off, randVec(rng, kvHeads*hd, 1))
				kv.StoreRow(kv.VOffset(int(pages[p/16]), 0, p%16), randVec(rng, kvHeads*hd, 1))
			}
			// Position 30, KV head 1, element 5.
			const bad = 30
			off := kv.KOffset(int(pages[bad/16]), 0, bad%16)
			if inV {
				off = kv.VOffset(int(pages[bad/16]), 0, bad%16)
			}
			row := randVec(rng, kvHeads*hd, 1)
			row[hd+5] = float32(math.NaN())
			kv.StoreRow(off, row)
			for _, n := range []int{1, qlen} { // a decode row, a prefill chunk
				q := randVec(rng, n*heads*hd, 1)
				seqs := []kernels.AttnSeq{{Pages: pages, QLen: n, KVLen: ctx}}
				for _, v := range variants(t) {
					out := make([]float32, n*heads*hd)
					v.b.Attention(out, q, kv, 0, seqs, heads, hd)
					for r := 0; r < n; r++ {
						pos := ctx - n + r
						for h := 0; h < heads; h++ {
							reads := pos >= bad && h/(heads/kvHeads) == 1
							for d := 0; d < hd; d++ {
								x := float64(out[(r*heads+h)*hd+d])
								if reads && !math.IsNaN(x) && (!inV || d == 5) {
									t.Fatalf("%s NaN in %s, n=%d [%s]: row %d head %d out[%d] = %v, want NaN", dt, map[bool]string{false: "K", true: "V"}[inV], n, v.name, r, h, d, x)
								}
								if !reads && math.IsNaN(x) {
									t.Fatalf("%s NaN in %s, n=%d [%s]: row %d head %d does not read position %d, but out[%d] is NaN", dt, map[bool]string{false: "K", true: "V"}[inV], n, v.name, r, h, bad, d)
								}
							}
						}
					}
				}
			}
		}
	}
}
