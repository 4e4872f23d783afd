package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
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

// tolQuantGemmEx is the tolerance of each block format's cuBLAS products
// (more than 8 rows), relative to Σ|w·x|: the decoded weights and x are
// each rounded to f16 (bk_dequant_rows_f16, bk_f32_to_f16), up to 2^-11
// of a value each, so a term is off by up to about 2^-10 (1e-3) of its
// size whatever the format: every format's decoded values carry more
// significant bits than f16 keeps (the f16 scale times a 4- to 8-bit
// quant, minus an offset), so each is rounded as an arbitrary float would
// be. Subnormal f16 (below 6e-5) rounds more coarsely, but only in
// absolute terms too small to show here. The rest is float32
// accumulation. The worst measured on the fake is in the test log; the
// bounds leave room for the tensor cores' summation order.
var tolQuantGemmEx = map[kernels.DType]float64{
	kernels.Q4_0: 1.5e-3, kernels.Q4_1: 1.5e-3, kernels.Q5_0: 1.5e-3, kernels.Q5_1: 1.5e-3,
	kernels.Q8_0: 1.5e-3, kernels.Q2_K: 1.5e-3, kernels.Q3_K: 1.5e-3, kernels.Q4_K: 1.5e-3,
	kernels.Q5_K: 1.5e-3, kernels.Q6_K: 1.5e-3,
}

func TestFakeQuant(t *testing.T) { testQuant(t, fakeBackend(t)) }

func TestGPUQuant(t *testing.T) { testQuant(t, gpuBackend(t)) }

// quantCols are row lengths for dt: one block, a few, more than a warp
// takes in one trip of the gemv kernels (32 blocks of 32, 4 of 256), and
// for the 32-element formats lengths that are not a multiple of 256.
func quantCols(dt kernels.DType) []int {
	if dt.BlockSize() == 32 {
		return []int{32, 96, 160, 1056}
	}
	return []int{256, 768, 1280}
}

// testQuant: every block format through Embed (bit-exact with
// Matrix.Row) and MatMul of 1 to 8 rows (the gemv kernels) and more, up
// to a prompt chunk of 33 (f16 chunks and GemmEx, float32 chunks and
// sgemm with exact products, and the gemv kernels 8 rows at a time when
// there is no cuBLAS), against the float64 reference.
func testQuant(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(41, 42))
	rb := ref.New()
	for _, dt := range quantFormats {
		var worst [2]float64 // own kernels or sgemm, GemmEx
		for _, cols := range quantCols(dt) {
			for _, rows := range []int{5, 13} {
				w := kernelstest.RandMatrix(rng, dt, rows, cols)
				checkEmbedExact(t, b, w, []int32{0, int32(rows - 1), 3, 3, 1})
				for _, n := range []int{1, 2, 3, 4, 5, 6, 7, 8, 12, 33} {
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
						i := 0
						if viaGemmEx(b, n) {
							i = 1
						}
						worst[i] = max(worst[i], checkQuantMatMul(t, b, fmt.Sprintf("MatMul %s %dx%d n=%d [%s]", dt, rows, cols, n, v.name),
							w, x, n, want))
						undo()
					}
				}
			}
		}
		t.Logf("%-5s worst |err|/Σ|w·x| %.2g (tolerance %.0e), GemmEx %.2g (tolerance %.1e)", dt, worst[0],
			tolQuant[dt], worst[1], tolQuantGemmEx[dt])
	}
}

func TestFakeDequantF16(t *testing.T) { testDequantF16(t, fakeBackend(t)) }

func TestGPUDequantF16(t *testing.T) { testDequantF16(t, gpuBackend(t)) }

// testDequantF16: bk_dequant_rows_f16, the f16 rows of the GemmEx
// products over block formats, writes kernels.F32ToF16 of Matrix.Row's
// values bit for bit, for every format, rows [2, 6) of 7, on a full grid
// and on one block striding; the halves past its rows stay as they were.
func testDequantF16(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(47, 48))
	const rows, lo, nrows, guard = 7, 2, 4, 6
	for _, dt := range quantFormats {
		for _, cols := range quantCols(dt) {
			w := kernelstest.RandMatrix(rng, dt, rows, cols)
			want := make([]uint16, nrows*cols)
			row := make([]float32, cols)
			for i := range nrows {
				w.Row(lo+i, row)
				for c, v := range row {
					want[i*cols+c] = kernels.F32ToF16(v)
				}
			}
			for _, grid := range []int{0, 1} {
				got := dequantF16(b, w, lo, nrows, grid, guard)
				for i, h := range want {
					if got[i] != h {
						t.Fatalf("%s cols=%d grid %d: row %d element %d: got %#04x, want %#04x (of %g)", dt, cols, grid,
							lo+i/cols, i%cols, got[i], h, kernels.F16ToF32(h))
					}
				}
				for i := len(want); i < len(got); i++ {
					if got[i] != 0xabcd {
						t.Fatalf("%s cols=%d grid %d: wrote past its rows", dt, cols, grid)
					}
				}
			}
		}
	}
}

// dequantF16 runs bk_dequant_rows_f16 on rows [lo, lo+nrows) of w (grid
// blocks; 0: one thread a slot) into a buffer of guard more halves, each
// 0xabcd before, and returns the buffer.
func dequantF16(b *Backend, w *kernels.Matrix, lo, nrows, grid, guard int) []uint16 {
	got := make([]uint16, nrows*w.Cols+guard)
	for i := range got {
		got[i] = 0xabcd
	}
	if grid == 0 {
		grid = blocks(nrows*w.Cols/8, elemThreads)
	}
	b.lock()
	defer b.unlock()
	m := b.weight(w)
	dst := upload(b, sDequant, got)
	b.launch(kDequantRowsF16, grid, 1, elemThreads, 0, dst, m.ptr, argI(int(w.DType)), argI(w.Cols), argI(lo), argI(nrows))
	b.d2h(unsafe.Pointer(&got[0]), dst, 2*len(got))
	return got
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
// to Σ|w·x|; it fails the test beyond the tolerance of the path b takes
// (mmTol).
func checkQuantMatMul(t *testing.T, b *Backend, what string, w *kernels.Matrix, x []float32, n int, want []float32) float64 {
	t.Helper()
	got := make([]float32, n*w.Rows+3)
	for i := range got {
		got[i] = 12345
	}
	b.MatMul(got, x, n, w)
	c := &checker{T: t, What: what, Tol: mmTol(b, w.DType, n)}
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
		// 12 rows exactly (float32 rows and sgemm): one weight is below
		// what GemmEx's f16 tolerance sees, whose decode is checked bit
		// for bit below instead.
		b.exactGEMM = true
		for _, n := range []int{3, 12} {
			want := make([]float32, n*4)
			xn := randVec(rng, n*cols, 1)
			ref.New().MatMul(want, xn, n, w)
			got := make([]float32, n*4)
			b.MatMul(got, xn, n, w)
			c := &checker{T: ft, What: "probe", Tol: mmTol(b, dt, n)}
			for i := range got {
				c.Check(i, got[i], want[i], kernelstest.MatMag(w, xn, i/4, i%4), 1e-30)
			}
			if c.Fails != n {
				t.Errorf("%s n=%d: %d failures, want %d (row 2 of every product)", dt, n, c.Fails, n)
			}
		}
		b.exactGEMM = false
		h := dequantF16(b, w, 0, 4, 0, 0)
		row := make([]float32, cols)
		for r := range 4 {
			w.Row(r, row)
			diff := 0
			for c, v := range row {
				if h[r*cols+c] != kernels.F32ToF16(v) {
					diff++
				}
			}
			if (diff > 0) != (r == 2) {
				t.Errorf("%s: the f16 rows for GemmEx differ from the host's row %d in %d elements", dt, r, diff)
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

// quantModelConfig is a small llama whose dimensions are multiples of 256,
// so that every matrix can be in a K format.
var quantModelConfig = model.Config{Arch: "llama", Vocab: 256, Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 64, FF: 512,
	ContextLength: 64, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 10000}}

// quantMixes are weight mixes of quantised GGUF files: Q4_K_M (Q4_K, with
// attn_v, ffn_down and the output in Q6_K) and Q4_0 (the output in Q8_0
// is llama.cpp's; here all Q4_0, the output Q6_K).
var quantMixes = []struct {
	name string
	pick func(kind string) kernels.DType
}{
	{"q4_k_m", func(kind string) kernels.DType {
		switch kind {
		case "attn_v", "ffn_down", "output":
			return kernels.Q6_K
		}
		return kernels.Q4_K
	}},
	{"q4_0", func(kind string) kernels.DType {
		if kind == "output" {
			return kernels.Q6_K
		}
		return kernels.Q4_0
	}},
}

// tolQuantModel: logits against the reference (exact weights, float64
// sums), relative to the largest |logit|: the prefill's products (more
// than 8 rows) round x and the decoded weights to f16 for GemmEx, as the
// f16 models' do (checkDummyConfig's bound; about 6e-4 measured on the
// fake), and the decode steps read the K/V that prefill wrote. Greedy
// steps compare the top-2 logprobs within 1e-3, as the stories260K test.
const tolQuantModel = 5e-3

// cpuMargin bounds how far the cpu backend's logprobs are from the
// reference's with block-format weights (it quantises x to 8 bits for
// its dot products; up to 0.015 measured on these models): where the
// reference's best two tokens are closer than this the cpu backend may
// pick the other, so its tokens are compared up to that step. The prompt
// is one whose first 4 steps have no such near tie in either mix (the
// dummy models' logits are flat: most gaps are a few hundredths).
const cpuMargin = 0.05

func TestFakeQuantModels(t *testing.T) { checkQuantModels(t, fakeBackend(t)) }

func TestGPUQuantModels(t *testing.T) { checkQuantModels(t, gpuBackend(t)) }

// checkQuantModels: greedy decoding of Q4_K_M- and Q4_0-mixed dummy
// models on the backend picks the reference's tokens with its logits
// within tolQuantModel, and the cpu backend's tokens.
func checkQuantModels(t *testing.T, b *Backend) {
	c := quantModelConfig
	prompt := []int32{167, 192, 142, 11, 48, 68, 19, 188, 68, 165, 255}
	const steps = 8
	for _, mix := range quantMixes {
		w, err := model.DummyWeights(&c, kernels.F32)
		if err != nil {
			t.Fatal(err)
		}
		w.Requantize(mix.pick)
		want, err := model.New(c, w, ref.New()).GreedyDecode(prompt, steps, 4, 5, 2)
		if err != nil {
			t.Fatal(err)
		}
		// Logits of every step: the prompt in chunks of 5 (products of 5
		// rows on the gemv kernels, and of 11 rows on cuBLAS when whole),
		// then one token at a time.
		for _, chunk := range []int{5, 64} {
			got, err := model.New(c, w, b).GreedyDecode(prompt, steps, 4, chunk, 2)
			if err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if got[i].ID != want[i].ID {
					t.Fatalf("%s chunk %d: token %d = %d, want %d", mix.name, chunk, i, got[i].ID, want[i].ID)
				}
				for j, wt := range want[i].Top {
					gt := got[i].Top[j]
					if gt.ID != wt.ID || math.Abs(float64(gt.Logprob-wt.Logprob)) > 1e-3 {
						t.Errorf("%s chunk %d: position %d top %d = %+v, want %+v", mix.name, chunk, i, j, gt, wt)
					}
				}
			}
		}
		checkQuantLogits(t, b, c, w, mix.name)
		onCPU, err := model.New(c, w, cpu.New(2)).GreedyDecode(prompt, steps, 4, 64, 2)
		if err != nil {
			t.Fatal(err)
		}
		same := 0
		for ; same < len(want); same++ {
			if top := want[same].Top; top[0].Logprob-top[1].Logprob < cpuMargin {
				break
			}
			if onCPU[same].ID != want[same].ID {
				t.Fatalf("%s: token %d = %d on the cpu backend, %d here", mix.name, same, onCPU[same].ID, want[same].ID)
			}
		}
		if same < 4 {
			t.Errorf("%s: a near tie at step %d: the prompt no longer tests the cpu backend's first 4 tokens", mix.name, same)
		}
		t.Logf("%s: %d greedy tokens as the reference's, the first %d as the cpu backend's", mix.name, steps, same)
	}
}

// checkQuantLogits compares whole logit rows of a prefill (11 rows:
// cuBLAS) and two decode steps (gemv) with the reference's.
func checkQuantLogits(t *testing.T, b *Backend, c model.Config, w *model.Weights, name string) {
	worst := compareLogits(t, b, c, w, name, 11, tolQuantModel)
	t.Logf("%s: worst logit error %.2g of the largest", name, worst)
}

// TestSupportsEveryDType: the backend takes every weight dtype kernels
// defines, so the loader refuses none on it; a dtype it has no kernel for
// is still refused.
func TestSupportsEveryDType(t *testing.T) {
	var b *Backend
	for _, dt := range benchDTypes {
		if !b.SupportsDType(dt) {
			t.Errorf("%s refused", dt)
		}
	}
	if dt := kernels.DType(len(gemvKernel)); b.SupportsDType(dt) {
		t.Errorf("%s taken", dt)
	}
}

// TestFakeExpertsQuant: Experts with every block format, its grouped gemv
// (bk_moe_gemv's cases) and its cuBLAS path, against the float64 layer
// and against the backend's own products, as testExperts does for the
// float types.
func TestFakeExpertsQuant(t *testing.T) { testExpertsQuant(t, fakeBackend(t)) }

func TestGPUExpertsQuant(t *testing.T) { testExpertsQuant(t, gpuBackend(t)) }

func testExpertsQuant(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(45, 46))
	for _, dt := range quantFormats {
		var worst [2]float64 // own kernels, with cuBLAS GemmEx
		// 3 rows: grouped gemv segments; 40: expert 0's 20 rows on cuBLAS
		// (or 8-row chunks of the grouped gemv without it).
		for _, n := range []int{3, 40} {
			c := newMoECase(rng, kernels.F32, n) // the routing; experts of dt below
			c.d, c.ff = 64, 96
			if dt.BlockSize() == 256 {
				c.d, c.ff = 256, 256
			}
			for e := range c.experts {
				c.experts[e] = kernels.Expert{Gate: randMatrix(rng, dt, c.ff, c.d), Up: randMatrix(rng, dt, c.ff, c.d),
					Down: randMatrix(rng, dt, c.d, c.ff)}
			}
			c.x = randVec(rng, n*c.d, 0.5)
			want, mag := c.want()
			vs := mmVariants(b)[:min(2, len(mmVariants(b)))] // default, own-kernels
			if n <= gemvMaxN {
				vs = vs[:1]
			}
			for _, v := range vs {
				undo := v.set(b)
				what := fmt.Sprintf("Experts %s n=%d [%s]", dt, n, v.name)
				got := make([]float32, n*c.d)
				b.Experts(got, c.x, n, c.experts, c.pick, c.weight, c.k)
				ck := &checker{T: t, What: what, Tol: mmTol(b, dt, n)}
				for i := range want {
					ck.Check(i, got[i], float32(want[i]), mag[i], 1e-30)
				}
				i := 0
				if viaGemmEx(b, n) {
					i = 1
				}
				worst[i] = max(worst[i], ck.Worst)
				host, hmag := c.hostPath(b)
				hc := &checker{T: t, What: what + " vs MatMul", Tol: tolMoEHost}
				for i, h := range host {
					hc.Check(i, got[i], h, hmag[i], 1e-30)
				}
				undo()
			}
		}
		t.Logf("%-5s worst |err|/Σ|terms| %.2g (tolerance %.0e), with GemmEx %.2g (tolerance %.1e)", dt, worst[0],
			tolQuant[dt], worst[1], tolQuantGemmEx[dt])
	}
}
