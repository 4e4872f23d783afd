package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// quantFormats are the ggml block formats the backend runs.
var quantFormats = []kernels.DType{kernels.Q4_0, kernels.Q4_1, kernels.Q5_0, kernels.Q5_1, kernels.Q8_0,
	kernels.Q2_K, kernels.Q3_K, kernels.Q4_K, kernels.Q5_K, kernels.Q6_K}

// tolQuant is the MatMul tolerance of each block format, relative to
// Σ|w·x| as tolMatMul. The kernels decode the exact weights of
// kernels.Matrix.Row (Embed checks that bit for bit), so what is left is
// float32 accumulation, as for f32 weights: the gemv kernels sum 8
// products a lane, then over a block's lanes and the warp; the larger
// products are cuBLAS sgemm over the dequantised rows. Worst measured on
// the fake is about 2e-7 for every format.
var tolQuant = map[kernels.DType]float64{
	kernels.Q4_0: tolMatMul, kernels.Q4_1: tolMatMul, kernels.Q5_0: tolMatMul, kernels.Q5_1: tolMatMul,
	kernels.Q8_0: tolMatMul, kernels.Q2_K: tolMatMul, kernels.Q3_K: tolMatMul, kernels.Q4_K: tolMatMul,
	kernels.Q5_K: tolMatMul, kernels.Q6_K: tolMatMul,
}

func TestFakeQuant(t *testing.T) { testQuant(t, fakeBackend(t)) }

func TestGPUQuant(t *testing.T) { testQuant(t, gpuBackend(t)) }

// quantCols are row lengths for dt: one block, a few, and for the
// 32-element formats lengths that are not a multiple of 256.
func quantCols(dt kernels.DType) []int {
	if dt.BlockSize() == 32 {
		return []int{32, 96, 160, 1056}
	}
	return []int{256, 768}
}

// testQuant: every block format through Embed (bit-exact with
// Matrix.Row) and MatMul of 1 to 8 rows (the gemv kernels) and more
// (dequantised chunks and sgemm, and the gemv kernels 8 rows at a time
// when there is no cuBLAS), against the float64 reference.
func testQuant(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(41, 42))
	rb := ref.New()
	for _, dt := range quantFormats {
		worst := 0.0
		for _, cols := range quantCols(dt) {
			for _, rows := range []int{5, 13} {
				w := kernelstest.RandMatrix(rng, dt, rows, cols)
				checkEmbedExact(t, b, w, []int32{0, int32(rows - 1), 3, 3, 1})
				for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 12} {
					if cols > 1000 && n > 8 && rows > 5 {
						continue
					}
					x := randVec(rng, n*cols, 1)
					want := make([]float32, n*rows)
					rb.MatMul(want, x, n, w)
					vs := mmVariants(b)
					if n <= gemvMaxN {
						vs = vs[:1] // the same gemv kernel in every variant
					}
					for _, v := range vs {
						undo := v.set(b)
						worst = max(worst, checkQuantMatMul(t, b, fmt.Sprintf("MatMul %s %dx%d n=%d [%s]", dt, rows, cols, n, v.name),
							w, x, n, want))
						undo()
					}
				}
			}
		}
		t.Logf("%-5s worst |err|/Σ|w·x| %.2g (tolerance %.0e)", dt, worst, tolQuant[dt])
	}
}

// checkEmbedExact: rows ids of w through Embed are Matrix.Row's, bit for bit.
func checkEmbedExact(t *testing.T, b *Backend, w *kernels.Matrix, ids []int32) {
	t.Helper()
	got := make([]float32, len(ids)*w.Cols)
	b.Embed(got, w, ids)
	row := make([]float32, w.Cols)
	for i, id := range ids {
		w.Row(int(id), row)
		for c, v := range row {
			if g := got[i*w.Cols+c]; !kernelstest.SameBits(g, v) {
				t.Fatalf("Embed %s cols=%d: row %d element %d: got %g (%#x), want %g (%#x)", w.DType, w.Cols, id, c,
					g, math.Float32bits(g), v, math.Float32bits(v))
			}
		}
	}
}

// checkQuantMatMul runs one product and returns the worst error relative
// to Σ|w·x|; it fails the test beyond tolQuant.
func checkQuantMatMul(t *testing.T, b *Backend, what string, w *kernels.Matrix, x []float32, n int, want []float32) float64 {
	t.Helper()
	got := make([]float32, n*w.Rows+3)
	for i := range got {
		got[i] = 12345
	}
	b.MatMul(got, x, n, w)
	c := &checker{T: t, What: what, Tol: tolQuant[w.DType]}
	for i := range want {
		c.Check(i, got[i], want[i], kernelstest.MatMag(w, x, i/w.Rows, i%w.Rows), 1e-30)
	}
	for i := n * w.Rows; i < len(got); i++ {
		if got[i] != 12345 {
			t.Fatalf("%s: wrote past the output", what)
		}
	}
	return c.Worst
}

// TestFakeQuantCatchesBug: for every format, the checks of testQuant see
// one wrong weight. A quant byte of row 2 is changed after upload (the
// device keeps the old copy, as a decoder misreading that byte would):
// the product and the Embed of that row, and only they, disagree with
// the reference.
func TestFakeQuantCatchesBug(t *testing.T) {
	b := fakeBackend(t)
	rng := rand.New(rand.NewPCG(43, 44))
	for _, dt := range quantFormats {
		cols := 2 * dt.BlockSize()
		w := kernelstest.RandMatrix(rng, dt, 4, cols)
		x := randVec(rng, 3*cols, 1)
		b.MatMul(make([]float32, 3*4), x, 3, w) // uploads w
		before := make([]float32, cols)
		w.Row(2, before)
		changeOneWeight(w, 2)
		ft := &testing.T{}
		for _, n := range []int{3, 12} {
			want := make([]float32, n*4)
			xn := randVec(rng, n*cols, 1)
			ref.New().MatMul(want, xn, n, w)
			got := make([]float32, n*4)
			b.MatMul(got, xn, n, w)
			c := &checker{T: ft, What: "probe", Tol: tolQuant[dt]}
			for i := range got {
				c.Check(i, got[i], want[i], kernelstest.MatMag(w, xn, i/4, i%4), 1e-30)
			}
			if c.Fails != n {
				t.Errorf("%s n=%d: %d failures, want %d (row 2 of every product)", dt, n, c.Fails, n)
			}
		}
		got := make([]float32, cols)
		b.Embed(got, w, []int32{2})
		same := 0
		for i := range got {
			if kernelstest.SameBits(got[i], before[i]) {
				same++
			}
		}
		if same != cols {
			t.Errorf("%s: Embed of the uploaded row 2 differs from it in %d elements", dt, cols-same)
		}
	}
}

// changeOneWeight flips bits of one quant byte of row r so that the row's
// values change, scanning from the block's middle (past the scales of
// every format) for a byte that does.
func changeOneWeight(w *kernels.Matrix, r int) {
	rb := w.DType.RowBytes(w.Cols)
	before, after := make([]float32, w.Cols), make([]float32, w.Cols)
	w.Row(r, before)
	for off := rb / 4; off < rb; off++ {
		w.Data[r*rb+off] ^= 0x55
		w.Row(r, after)
		for i := range after {
			if after[i] != before[i] {
				return
			}
		}
		w.Data[r*rb+off] ^= 0x55
	}
	panic("no byte changes row " + fmt.Sprint(r))
}
