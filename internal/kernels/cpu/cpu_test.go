package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// Tolerances against the reference (which accumulates in float64). Each is
// a bound on |got - want| for one output element, stated relative to the
// natural magnitude of that element:
const (
	// MatMul: relative to Σ|w·x| over the dot product (float32
	// accumulation in 8+ independent lanes; measured worst ~1e-7).
	tolMatMul = 2e-6
	// RMSNorm: relative to |want| (the same double arithmetic; 1 ulp).
	tolRMSNorm = 2.5e-7
	// RoPE: relative to the largest |x| of the rotated pair (double math
	// as the reference; only sin/cos implementations differ).
	tolRoPE = 2.5e-7
	// SwiGLU: relative to |want|, plus 1e-30·|up| absolute (the SIMD path
	// uses a float32 exp of about 1 ulp).
	tolSwiGLU = 1e-6
	// Attention: relative to the largest |v| of the head (the output is a
	// convex combination of V rows; scores and exp are float32).
	tolAttn = 5e-6
)

type variant struct {
	name string
	b    *Backend
}

// variants covers the SIMD and scalar paths, single-threaded and split
// across 3 threads at any size, and the BLAS / own-kernel choice for f32.
func variants(t testing.TB) []variant {
	initCPU()
	mk := func(simd bool, threads, blasMinN, minWork int) *Backend {
		b := New(threads)
		b.simd = simd
		b.blasMinN = blasMinN
		b.minWork = minWork
		return b
	}
	var v []variant
	if cpuHasSIMD {
		v = append(v,
			variant{"simd/1t/default", mk(true, 1, defaultBLASMinN, defaultMinWork)},
			variant{"simd/3t/own", mk(true, 3, 0, 1)},
			variant{"simd/2t/blas>=1", mk(true, 2, 1, 1)},
		)
		if cpuHasAVX512 {
			b := mk(true, 3, 0, 1)
			b.avx512 = false
			v = append(v, variant{"avx2/3t/own", b})
			avx2Split := mk(true, 2, 0, 1)
			avx2Split.avx512 = false
			avx2Split.splitXPanels, avx2Split.splitXWeights, avx2Split.splitXRows = 1, 1, 16
			v = append(v, variant{"avx2/2t/split-x", avx2Split})
			split := mk(true, 2, 0, 1)
			split.splitXPanels, split.splitXWeights, split.splitXRows = 1, 1, 16
			v = append(v, variant{"avx512/2t/split-x", split})
			if cpuHasVNNI {
				b := mk(true, 2, 0, 1)
				b.vnni = false
				v = append(v, variant{"avx512-float/2t/own", b})
			} else {
				t.Log("no avx512-vnni: the int8 gemm is not tested")
			}
		} else {
			t.Log("no avx512f+bw+vl: the AVX-512 kernels are not tested")
		}
	} else {
		t.Log("no avx2+fma+f16c (CPU, or built with -DBK_NO_SIMD): only the scalar path is tested")
	}
	v = append(v,
		variant{"scalar/1t/own", mk(false, 1, 0, defaultMinWork)},
		variant{"scalar/3t/own", mk(false, 3, 0, 1)},
		// Without AVX2, non-f32 prefill products dequantise and use sgemm.
		variant{"scalar/2t/blas>=1", mk(false, 2, 1, 1)},
	)
	return v
}

func randMatrix(rng *rand.Rand, dt kernels.DType, rows, cols int) *kernels.Matrix {
	return kernelstest.RandMatrix(rng, dt, rows, cols)
}

func randVec(rng *rand.Rand, n int, scale float64) []float32 {
	return kernelstest.RandVec(rng, n, scale)
}

type checker = kernelstest.Checker

// TestCheckerCatchesErrors shows the comparisons can fail on this
// backend's output (kernelstest tests the checker itself): a real kernel
// output with one element nudged is caught.
func TestCheckerCatchesErrors(t *testing.T) {
	ft := &testing.T{}
	rng := rand.New(rand.NewPCG(9, 9))
	w := randMatrix(rng, kernels.F16, 8, 64)
	x := randVec(rng, 64, 1)
	want, got := make([]float32, 8), make([]float32, 8)
	ref.New().MatMul(want, x, 1, w)
	New(1).MatMul(got, x, 1, w)
	got[3] += float32(math.Abs(float64(got[3]))*1e-4) + 1e-3
	c := &checker{T: ft, What: "probe", Tol: tolMatMul}
	for i := range got {
		c.Check(i, got[i], want[i], kernelstest.MatMag(w, x, 0, i), 0)
	}
	if c.Fails != 1 {
		t.Fatalf("nudged MatMul output: %d failures, want 1", c.Fails)
	}
}

func TestMatMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vs := variants(t)
	rb := ref.New()
	dtypes := []kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.Q8_0}
	colsList := []int{32, 64, 96, 4096, 33, 100, 1056, 1030}
	rowsList := []int{1, 2, 3, 4, 5, 7, 8, 13, 17}
	nList := []int{1, 2, 3, 4, 5, 8, 13, 16, 17, 33}
	if testing.Short() {
		colsList, nList = []int{32, 96, 33}, []int{1, 3, 16}
	}
	worst := map[string]float64{}
	for _, dt := range dtypes {
		for _, cols := range colsList {
			if dt == kernels.Q8_0 && cols%32 != 0 {
				continue
			}
			for _, rows := range rowsList {
				w := randMatrix(rng, dt, rows, cols)
				for _, n := range nList {
					if cols > 1000 && n*rows > 64 {
						continue // keep the float64 reference quick
					}
					if useQdot(dt, n) {
						continue // x quantised to 8 bits: TestMatMulQuant
					}
					x := randVec(rng, n*cols, 1)
					want := make([]float32, n*rows)
					rb.MatMul(want, x, n, w)
					mag := make([]float64, n*rows)
					for i := 0; i < n; i++ {
						for r := 0; r < rows; r++ {
							mag[i*rows+r] = kernelstest.MatMag(w, x, i, r)
						}
					}
					for _, v := range vs {
						got := make([]float32, n*rows+3)
						for i := range got {
							got[i] = 12345
						}
						v.b.MatMul(got, x, n, w)
						c := &checker{T: t, What: fmt.Sprintf("MatMul %s %dx%d n=%d [%s]", dt, rows, cols, n, v.name), Tol: tolMatMul}
						quant := v.b.quantisesX(dt, n, cols) // the int8 gemm
						for i := range want {
							abs := 1e-30
							if quant {
								abs = qbound(w, x, i/rows, i%rows) + 1e-5*mag[i]
							}
							c.Check(i, got[i], want[i], mag[i], abs)
						}
						for i := n * rows; i < len(got); i++ {
							if got[i] != 12345 {
								t.Fatalf("%s: wrote past the output", c.What)
							}
						}
						if !quant {
							worst[v.name+" "+dt.String()] = max(worst[v.name+" "+dt.String()], c.Worst)
						}
					}
				}
			}
		}
	}
	// Bigger shapes, so every thread gets several row panels.
	for _, dt := range dtypes {
		w := randMatrix(rng, dt, 301, 256)
		for _, n := range []int{1, 6} {
			if useQdot(dt, n) {
				continue // TestMatMulQuant
			}
			x := randVec(rng, n*256, 1)
			want := make([]float32, n*301)
			rb.MatMul(want, x, n, w)
			for _, v := range vs {
				got := make([]float32, n*301)
				v.b.MatMul(got, x, n, w)
				c := &checker{T: t, What: fmt.Sprintf("MatMul %s 301x256 n=%d [%s]", dt, n, v.name), Tol: tolMatMul}
				for i := range want {
					c.Check(i, got[i], want[i], kernelstest.MatMag(w, x, i/301, i%301), 1e-30)
				}
			}
		}
	}
	for k, v := range worst {
		t.Logf("worst |err|/Σ|w·x|  %-28s %.2g", k, v)
	}
}

// TestMatMulUnaligned passes f32 weights whose data is not 4-byte aligned
// (BLAS is skipped then) and rows that are not 32-byte aligned.
func TestMatMulUnaligned(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.Q8_0} {
		w := randMatrix(rng, dt, 9, 64)
		buf := make([]byte, len(w.Data)+1)
		copy(buf[1:], w.Data)
		wu := &kernels.Matrix{DType: dt, Rows: 9, Cols: 64, Data: buf[1:]}
		x := randVec(rng, 5*64, 1)
		want := make([]float32, 5*9)
		ref.New().MatMul(want, x, 5, w)
		for _, v := range variants(t) {
			got := make([]float32, 5*9)
			v.b.MatMul(got, x, 5, wu)
			c := &checker{T: t, What: fmt.Sprintf("unaligned MatMul %s [%s]", dt, v.name), Tol: tolMatMul}
			for i := range want {
				c.Check(i, got[i], want[i], kernelstest.MatMag(w, x, i/9, i%9), 1e-30)
			}
		}
	}
}

func TestRMSNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, d := range []int{1, 7, 8, 33, 64, 96, 4096} {
		for _, n := range []int{1, 2, 5, 17} {
			x := randVec(rng, n*d, 3)
			w := randVec(rng, d, 1)
			want := make([]float32, n*d)
			ref.New().RMSNorm(want, x, w, n, 1e-5)
			for _, v := range variants(t) {
				got := make([]float32, n*d)
				v.b.RMSNorm(got, x, w, n, 1e-5)
				c := &checker{T: t, What: fmt.Sprintf("RMSNorm d=%d n=%d [%s]", d, n, v.name), Tol: tolRMSNorm}
				for i := range want {
					c.Check(i, got[i], want[i], math.Abs(float64(want[i])), 1e-37)
				}
			}
		}
	}
}

func TestRoPE(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for ci, c := range kernelstest.RoPECases(rng) {
		for _, ntok := range []int{1, 3, 17} {
			pos := make([]int32, ntok)
			for i := range pos {
				pos[i] = int32(rng.IntN(1 << uint(rng.IntN(18))))
			}
			x := randVec(rng, ntok*c.Heads*c.HD, 2)
			want := append([]float32(nil), x...)
			ref.New().ApplyRoPE(want, pos, c.Heads, c.HD, c.R)
			for _, v := range variants(t) {
				got := append([]float32(nil), x...)
				v.b.ApplyRoPE(got, pos, c.Heads, c.HD, c.R)
				ck := &checker{T: t, What: fmt.Sprintf("RoPE case %d ntok=%d [%s]", ci, ntok, v.name), Tol: tolRoPE}
				for i := range want {
					// Magnitude: the larger element of the head (covers
					// both members of any pair).
					h := i / c.HD
					var m float64
					for _, e := range x[h*c.HD : (h+1)*c.HD] {
						m = max(m, math.Abs(float64(e)))
					}
					ck.Check(i, got[i], want[i], m, 1e-37)
				}
			}
		}
	}
}

func TestSwiGLUAdd(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 7, 8, 9, 100, 4099, 70000} {
		g := randVec(rng, n, 4)
		u := randVec(rng, n, 1)
		extremes := []float32{0, -0, 100, -100, 1000, -1000, 88, -88, 1e-20, -1e-20, 30, -30}
		for i := 0; i < len(extremes) && i < n; i++ {
			g[rng.IntN(n)] = extremes[i]
		}
		want := make([]float32, n)
		ref.New().SwiGLU(want, g, u)
		wantAdd := make([]float32, n)
		ref.New().Add(wantAdd, g, u)
		for _, v := range variants(t) {
			got := make([]float32, n)
			v.b.SwiGLU(got, g, u)
			c := &checker{T: t, What: fmt.Sprintf("SwiGLU n=%d [%s]", n, v.name), Tol: tolSwiGLU}
			for i := range want {
				c.Check(i, got[i], want[i], math.Abs(float64(want[i])), 1e-30*math.Abs(float64(u[i])))
			}
			v.b.Add(got, g, u)
			for i := range wantAdd {
				if got[i] != wantAdd[i] {
					t.Fatalf("Add n=%d [%s]: element %d: got %g want %g", n, v.name, i, got[i], wantAdd[i])
				}
			}
		}
	}
}

func TestEmbed(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, dt := range append([]kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.Q8_0}, kernels.QuantDTypes...) {
		for _, cols := range []int{32, 96, 4096, 33, 512} {
			if cols%dt.BlockSize() != 0 {
				continue
			}
			w := randMatrix(rng, dt, 50, cols)
			ids := []int32{0, 49, 7, 7, 3, 22, 48}
			want := make([]float32, len(ids)*cols)
			ref.New().Embed(want, w, ids)
			for _, v := range variants(t) {
				got := make([]float32, len(ids)*cols)
				v.b.Embed(got, w, ids)
				for i := range want {
					if !kernelstest.SameBits(got[i], want[i]) {
						t.Fatalf("Embed %s cols=%d [%s]: element %d: got %g want %g", dt, cols, v.name, i, got[i], want[i])
					}
				}
			}
		}
	}
	// Every f16 bit pattern (subnormals, infinities, NaNs) converts as
	// kernels.F16ToF32 does, in both paths.
	all := &kernels.Matrix{DType: kernels.F16, Rows: 1, Cols: 65536, Data: make([]byte, 2*65536)}
	for i := 0; i < 65536; i++ {
		binary.LittleEndian.PutUint16(all.Data[2*i:], uint16(i))
	}
	for _, v := range variants(t) {
		got := make([]float32, 65536)
		v.b.Embed(got, all, []int32{0})
		for i := range got {
			if want := kernels.F16ToF32(uint16(i)); !kernelstest.SameBits(got[i], want) {
				t.Fatalf("f16 %#04x [%s]: got %g (%#x), want %g (%#x)", i, v.name, got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
			}
		}
	}
}

func TestEmbedBadID(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Embed with an out-of-range id did not panic")
		}
	}()
	w := randMatrix(rand.New(rand.NewPCG(1, 1)), kernels.F32, 4, 32)
	New(1).Embed(make([]float32, 32), w, []int32{4})
}

func TestAttention(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	vs := variants(t)
	// (QLen, KVLen): decode steps, whole prefills, and prefill chunks whose
	// earlier positions are in earlier pages.
	// A QLen 0 sequence contributes nothing.
	shapes := [][2]int{{1, 1}, {1, 17}, {1, 150}, {23, 23}, {5, 70}, {0, 5}, {17, 64}, {2, 3}}
	type geo struct{ heads, kvh int }
	// GQA groups of 1, 2, 4, 8, and 32 (more than one work item's worth),
	// and 24 heads without GQA (a decode row's heads are worked together,
	// at most BK_ATTN_MAX_MEMBERS of them at a time).
	geos := []geo{{8, 8}, {8, 4}, {8, 2}, {8, 1}, {32, 1}, {24, 24}}
	worst := map[string]float64{}
	for _, hd := range []int{8, 64, 128, 12} {
		for _, gq := range geos {
			kvh := gq.kvh
			for _, ps := range []int{1, 16, 64} {
				if testing.Short() && (ps == 16 || kvh == 4) || gq.heads > 8 && (ps != 16 || hd != 64) {
					continue
				}
				c := kernelstest.NewAttnCase(rng, gq.heads, kvh, hd, ps, shapes)
				scale := float32(1 / math.Sqrt(float64(hd)))
				if hd == 8 {
					scale = 3 // sharper softmax
				}
				want := make([]float32, len(c.Q))
				ref.New().Attention(want, c.Q, c.KV, 1, c.Seqs, c.Heads, scale)
				for _, v := range vs {
					got := make([]float32, len(c.Q))
					v.b.Attention(got, c.Q, c.KV, 1, c.Seqs, c.Heads, scale)
					ck := &checker{T: t, What: fmt.Sprintf("Attention hd=%d heads=%d/%d ps=%d [%s]", hd, gq.heads, kvh, ps, v.name), Tol: tolAttn}
					// |V| is ~N(0,1); 5 is above any sample here.
					for i := range want {
						ck.Check(i, got[i], want[i], 5, 0)
					}
					worst[v.name] = max(worst[v.name], ck.Worst)
				}
			}
		}
	}
	for k, v := range worst {
		t.Logf("worst |err|/5 %-20s %.2g", k, v)
	}
}

func TestStoreKV(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	kv := kernels.PagedKV{PageSize: 16, Layers: 3, KVHeads: 2, HeadDim: 8}
	kv.Data = randVec(rng, 5*kv.PageFloats(), 1)
	want := kv
	want.Data = append([]float32(nil), kv.Data...)
	slots := []int32{0, 17, 79, 40, 41}
	k := randVec(rng, len(slots)*kv.RowFloats(), 1)
	v := randVec(rng, len(slots)*kv.RowFloats(), 1)
	ref.New().StoreKV(want, 2, slots, k, v)
	New(1).StoreKV(kv, 2, slots, k, v)
	for i := range want.Data {
		if kv.Data[i] != want.Data[i] {
			t.Fatalf("StoreKV: element %d differs", i)
		}
	}
}

func TestFeatures(t *testing.T) {
	b := New(0)
	t.Log(b.Features())
	if b.Threads() < 1 {
		t.Fatal("no threads")
	}
	b.simd = false
	b.blasMinN = 0
	t.Log(b.Features())
}

// TestConcurrentUse calls one backend from several goroutines at once:
// callers that find the thread pool busy run their operation alone, and
// every result must still be right.
func TestConcurrentUse(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	b := New(2)
	b.minWork = 1
	w := randMatrix(rng, kernels.F16, 67, 256) // float products: the 1e-3 below holds
	x := randVec(rng, 3*256, 1)
	want := make([]float32, 3*67)
	ref.New().MatMul(want, x, 3, w)
	c := kernelstest.NewAttnCase(rng, 8, 2, 64, 16, [][2]int{{1, 40}, {7, 30}})
	wantA := make([]float32, len(c.Q))
	ref.New().Attention(wantA, c.Q, c.KV, 1, c.Seqs, 8, 0.125)
	errs := make(chan string, 8)
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			got := make([]float32, len(want))
			gotA := make([]float32, len(wantA))
			for it := 0; it < 200; it++ {
				b.MatMul(got, x, 3, w)
				b.Attention(gotA, c.Q, c.KV, 1, c.Seqs, 8, 0.125)
				for i := range want {
					if d := math.Abs(float64(got[i] - want[i])); d > 1e-3 {
						errs <- fmt.Sprintf("MatMul element %d off by %g", i, d)
						return
					}
				}
				for i := range wantA {
					if d := math.Abs(float64(gotA[i] - wantA[i])); d > 1e-4 {
						errs <- fmt.Sprintf("Attention element %d off by %g", i, d)
						return
					}
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// qbound is how far a product with x quantised to 8 bits (bk_quant_x, the
// integer path of the ggml block formats: one scale per 32 elements, per
// 256 for the K formats) may be from the exact one: each x element moves
// by at most half its block's step amax/127, so the sum moves by at most
// Σ_blocks Σ|w|·step/2.
func qbound(w *kernels.Matrix, x []float32, i, r int) float64 {
	row := make([]float32, w.Cols)
	w.Row(r, row)
	bs := min(w.DType.BlockSize(), 256)
	var s float64
	for b := 0; b < w.Cols/bs; b++ {
		var amax, wsum float64
		for e := bs * b; e < bs*b+bs; e++ {
			amax = max(amax, math.Abs(float64(x[i*w.Cols+e])))
			wsum += math.Abs(float64(row[e]))
		}
		s += wsum * amax / 127 / 2
	}
	return s
}

// TestMatMulQuant: the ggml block formats against the reference
// (dequantise, then multiply in float64). Where the backend quantises x
// to 8 bits (qdot, qgemm) the result is within qbound of the reference;
// elsewhere the product is float32 on dequantised weights, within
// tolMatMul. The integer paths (SIMD, scalar, the int8 gemm) compute the
// same integer sums, so they agree with each other to float rounding.
func TestMatMulQuant(t *testing.T) {
	rng := rand.New(rand.NewPCG(21, 22))
	vs := variants(t)
	rb := ref.New()
	colsList, rowsList, nList := []int{256, 512, 1280}, []int{1, 5, 13}, []int{1, 2, 3, 4, 5, 17, 33}
	if testing.Short() {
		colsList, nList = []int{256}, []int{1, 3, 5}
	}
	for _, dt := range append([]kernels.DType{kernels.Q8_0}, kernels.QuantDTypes...) {
		for _, cols := range colsList {
			for _, rows := range rowsList {
				w := randMatrix(rng, dt, rows, cols)
				for _, n := range nList {
					x := randVec(rng, n*cols, 1)
					want := make([]float32, n*rows)
					rb.MatMul(want, x, n, w)
					mag, qb := make([]float64, n*rows), make([]float64, n*rows)
					for i := 0; i < n; i++ {
						for r := 0; r < rows; r++ {
							mag[i*rows+r] = kernelstest.MatMag(w, x, i, r)
							qb[i*rows+r] = qbound(w, x, i, r)
						}
					}
					var first []float32
					for _, v := range vs {
						got := make([]float32, n*rows+3)
						for i := range got {
							got[i] = 12345
						}
						v.b.MatMul(got, x, n, w)
						what := fmt.Sprintf("MatMul %s %dx%d n=%d [%s]", dt, rows, cols, n, v.name)
						for i := range want {
							d := math.Abs(float64(got[i] - want[i]))
							bound := tolMatMul*mag[i] + 1e-30
							quant := v.b.quantisesX(dt, n, cols)
							if quant {
								bound = 1e-5*mag[i] + qb[i]
							}
							if !(d <= bound) {
								t.Fatalf("%s: element %d: got %g, want %g (|diff| %g > bound %g)", what, i, got[i], want[i], d, bound)
							}
							if first != nil && quant {
								if e := math.Abs(float64(got[i] - first[i])); !(e <= 1e-5*(mag[i]+qb[i])) {
									t.Fatalf("%s: element %d: %g, but %g on [%s]", what, i, got[i], first[i], vs[0].name)
								}
							}
						}
						for i := n * rows; i < len(got); i++ {
							if got[i] != 12345 {
								t.Fatalf("%s: wrote past the output", what)
							}
						}
						if first == nil && v.b.quantisesX(dt, n, cols) {
							first = got
						}
					}
				}
			}
		}
	}
}

// TestMatMulPrefill: prefill-sized products (n >= deqBLASMinN) of every
// non-f32 dtype, which dequantise weight rows for sgemm where BLAS is on
// and use the own gemm where it is off, against the reference.
func TestMatMulPrefill(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	const rows, cols, n = 53, 512, deqBLASMinN + 5
	for _, dt := range append([]kernels.DType{kernels.F16, kernels.BF16, kernels.Q8_0}, kernels.QuantDTypes...) {
		checkMatMulRef(t, rng, dt, rows, cols, n)
	}
}

// checkMatMulRef multiplies random weights and x with every variant and
// checks each result against the float64 reference.
func checkMatMulRef(t *testing.T, rng *rand.Rand, dt kernels.DType, rows, cols, n int) {
	t.Helper()
	checkMatMulRefOn(t, variants(t), rng, dt, rows, cols, n)
}

// checkMatMulRefOn is checkMatMulRef on the backends vs.
func checkMatMulRefOn(t *testing.T, vs []variant, rng *rand.Rand, dt kernels.DType, rows, cols, n int) {
	t.Helper()
	w := randMatrix(rng, dt, rows, cols)
	x := randVec(rng, n*cols, 1)
	want := make([]float32, n*rows)
	ref.New().MatMul(want, x, n, w)
	for _, v := range vs {
		got := make([]float32, n*rows)
		v.b.MatMul(got, x, n, w)
		c := &checker{T: t, What: fmt.Sprintf("MatMul %s %dx%d n=%d [%s]", dt, rows, cols, n, v.name), Tol: tolMatMul}
		quant := v.b.quantisesX(dt, n, cols)
		for i := range want {
			mag := kernelstest.MatMag(w, x, i/rows, i%rows)
			if quant {
				c.Check(i, got[i], want[i], mag, qbound(w, x, i/rows, i%rows)+1e-5*mag)
				continue
			}
			c.Check(i, got[i], want[i], mag, 1e-30)
		}
	}
}

// TestMatMulBlocked covers the gemm's blocking: x panels whose rows do not
// fit the L2 budget (slices of columns, the last one short), more panels
// than one block holds, and weight rows that are not a multiple of the
// micro-tile's.
func TestMatMulBlocked(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	const rows, n = 21, 700 // 44 panels: more than one block holds
	for _, dt := range append([]kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.Q8_0}, kernels.QuantDTypes...) {
		cols := 1030
		if dt != kernels.F32 && dt != kernels.F16 && dt != kernels.BF16 {
			cols = 1280 // whole 256-element super-blocks
		}
		checkMatMulRef(t, rng, dt, rows, cols, n)
	}
}

// TestGemmAVX2DequantChunks: the AVX2 gemm dequantises non-f32 weights
// GD_BYTES of rows at a time (102 rows of 2560 columns); one thread's 250
// rows are three chunks, the last not a multiple of the 6-row tile.
func TestGemmAVX2DequantChunks(t *testing.T) {
	initCPU()
	if !cpuHasSIMD {
		t.Skip("no avx2+fma+f16c: the AVX2 gemm does not run here")
	}
	rng := rand.New(rand.NewPCG(37, 38))
	b := New(1)
	b.avx512, b.blasMinN = false, 0
	const rows, cols, n = 250, 2560, 40
	for _, dt := range []kernels.DType{kernels.F16, kernels.Q4_K} {
		if b.matmulPath(dt, n, cols, true) != pathGemm {
			t.Fatalf("%s, %d rows: not the gemm", dt, n)
		}
		checkMatMulRefOn(t, []variant{{"avx2/1t", b}}, rng, dt, rows, cols, n)
	}
}

// TestMatMulQGemm covers the int8 gemm's blocking: more weight rows than
// one group holds (84 of 2560 columns), and weight and x rows that are not
// multiples of its 3x4 tile; and rows of 32-element blocks that are not a
// whole number of 256 elements, which it leaves to the float gemm.
func TestMatMulQGemm(t *testing.T) {
	if !cpuHasVNNI {
		t.Log("no avx512-vnni: this covers the float gemm only")
	}
	rng := rand.New(rand.NewPCG(35, 36))
	for _, dt := range []kernels.DType{kernels.Q4_K, kernels.Q5_K, kernels.Q6_K, kernels.Q3_K, kernels.Q2_K,
		kernels.Q8_0, kernels.Q4_0, kernels.Q4_1, kernels.Q5_0, kernels.Q5_1} {
		checkMatMulRef(t, rng, dt, 89, 2560, 37)
		if dt.BlockSize() == 32 {
			checkMatMulRef(t, rng, dt, 7, 288, 33)
		}
		if cpuHasVNNI {
			checkQGemmMatchesQdot(t, rng, dt)
		}
	}
}

// checkQGemmMatchesQdot: the int8 gemm quantises x exactly as the integer
// dot products do (the same scales, per 32 or 256 elements, and rounding),
// so the two agree to float rounding, far closer than either is to the
// float product.
func checkQGemmMatchesQdot(t *testing.T, rng *rand.Rand, dt kernels.DType) {
	t.Helper()
	const rows, cols, n = 13, 768, 35
	w := randMatrix(rng, dt, rows, cols)
	x := randVec(rng, n*cols, 1)
	b := New(2)
	// The CPU has VNNI (the caller checks): compare the two kernels even
	// where BATON_CPU_AVX512=0 or BATON_CPU_VNNI=0 keeps a backend off them.
	b.avx512, b.vnni = true, true
	if !b.useQGemm(dt, n, cols) {
		t.Fatalf("%s: the int8 gemm does not take %d rows of %d", dt, n, cols)
	}
	got, want := make([]float32, n*rows), make([]float32, n*rows)
	b.MatMul(got, x, n, w)
	b.qdot(want, x, n, w, unsafe.Pointer(unsafe.SliceData(w.Data)), n*rows*cols)
	for i := range want {
		tol := 1e-5 * (kernelstest.MatMag(w, x, i/rows, i%rows) + qbound(w, x, i/rows, i%rows))
		if d := math.Abs(float64(got[i] - want[i])); !(d <= tol) {
			t.Fatalf("%s: element %d: int8 gemm %g, integer dot products %g (|diff| %g > %g)", dt, i, got[i], want[i], d, tol)
		}
	}
}

// TestMatMulPropagatesNaN: a NaN or an infinity in one x row (what a read
// of poisoned KV leaves in the attention output) makes every output of
// that row non-finite on every path, the integer ones included (their
// 8-bit quantisation of x would otherwise turn it into finite logits and
// hide the poisoned read), and leaves the other rows finite.
func TestMatMulPropagatesNaN(t *testing.T) {
	rng := rand.New(rand.NewPCG(37, 38))
	const rows, cols = 7, 512
	for _, dt := range append([]kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.Q8_0}, kernels.QuantDTypes...) {
		w := randMatrix(rng, dt, rows, cols)
		for _, n := range []int{1, 2, 3, 5, 8, 17, 40} {
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1))} {
				x := randVec(rng, n*cols, 1)
				x[(n-1)*cols+300] = bad
				for _, v := range variants(t) {
					got := make([]float32, n*rows)
					v.b.MatMul(got, x, n, w)
					for i, g := range got {
						finite := !math.IsNaN(float64(g)) && !math.IsInf(float64(g), 0)
						if i/rows == n-1 && finite {
							t.Fatalf("%s n=%d [%s]: x row %d holds %g, but output %d is %g", dt, n, v.name, n-1, bad, i, g)
						}
						if i/rows != n-1 && !finite {
							t.Fatalf("%s n=%d [%s]: output %d of a finite x row is %g", dt, n, v.name, i, g)
						}
					}
				}
			}
		}
	}
}

// TestQuantXPathsAgree: the SIMD quantiser of x is the scalar one bit for
// bit (quants, scales, sums), for the 32- and 256-element blocks, on
// ordinary rows and on blocks with a NaN, an infinity, all zeros, tiny
// subnormals, values near FLT_MAX and halves that round to even.
func TestQuantXPathsAgree(t *testing.T) {
	initCPU()
	if !cpuHasSIMD {
		t.Skip("no SIMD path on this CPU")
	}
	rng := rand.New(rand.NewPCG(41, 42))
	const cols = 1024
	for _, block := range []int{32, 256} {
		var x []float32
		add := func(f func(j int) float32) {
			for j := 0; j < cols; j++ {
				x = append(x, f(j))
			}
		}
		add(func(int) float32 { return float32(rng.NormFloat64()) })
		add(func(int) float32 { return float32(rng.NormFloat64() * 1e30) })
		add(func(j int) float32 { // scale 1: every other quant is a tie to round to even
			if j%32 == 0 {
				return 127
			}
			return float32(j%200-100) + 0.5
		})
		add(func(int) float32 { return 0 })
		add(func(j int) float32 { return math.Float32frombits(uint32(j%3) * 200) }) // subnormals: 1/scale is +Inf
		add(func(j int) float32 { return math.MaxFloat32 * float32(j%5-2) / 2 })
		bad := func(v float32) {
			add(func(j int) float32 {
				if j%(2*block) == 7 {
					return v
				}
				return float32(rng.NormFloat64())
			})
		}
		bad(float32(math.NaN()))
		bad(float32(math.Inf(1)))
		bad(float32(math.Inf(-1)))
		n := len(x) / cols
		qs0, d0, s0 := quantX(0, x, n, cols, block)
		qs1, d1, s1 := quantX(1, x, n, cols, block)
		for i := range qs0 {
			if qs0[i] != qs1[i] {
				t.Fatalf("block %d: quant %d (row %d) is %d on the SIMD path, %d on the scalar", block, i, i/cols, qs1[i], qs0[i])
			}
		}
		for i := range d0 {
			if math.Float32bits(d0[i]) != math.Float32bits(d1[i]) {
				t.Fatalf("block %d: scale %d is %v on the SIMD path, %v on the scalar", block, i, d1[i], d0[i])
			}
		}
		for i := range s0 {
			if s0[i] != s1[i] {
				t.Fatalf("block %d: sum %d is %d on the SIMD path, %d on the scalar", block, i, s1[i], s0[i])
			}
		}
		if !math.IsNaN(float64(d1[6*cols/block])) {
			t.Errorf("block %d: a block with a NaN has scale %v, want NaN", block, d1[6*cols/block])
		}
	}
}
