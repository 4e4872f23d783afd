package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
)

// stepModel is the model of c and w on b and a zeroed bf16 pool of
// pages pages of 4 slots on b for it (closed with the test); Close the
// model.
func stepModel(t *testing.T, b *Backend, c model.Config, w *model.Weights, pages int) (*model.Model, kernels.PagedKV) {
	t.Helper()
	kvh := kernels.PagedKV{PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: kernels.BF16}
	kvh.Data = make([]float32, pages*kvh.PageFloats())
	return model.New(c, w, b), toDevice(t, b, kvh)
}

// copiesPerDecodeStep runs a dummy model of the given depth on b (weights
// preloaded, a prompt of two 9-token chunks first) and returns how many
// host-to-device copies its second decode step made, and how many times
// it launched each kernel; and the launches of the second prefill chunk
// (the first also copies the kept buffers in).
func copiesPerDecodeStep(t *testing.T, b *Backend, layers int) (int, [numKernels]int, [numKernels]int) {
	t.Helper()
	c := model.Config{Arch: "llama", Vocab: 256, Dim: 64, Layers: layers, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 128,
		ContextLength: 64, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 16, Theta: 10000}}
	w, err := model.DummyWeights(&c, kernels.F16)
	if err != nil {
		t.Fatal(err)
	}
	ms := []*kernels.Matrix{w.Embed, w.Output}
	for _, ly := range w.Layers {
		ms = append(ms, ly.Q, ly.K, ly.V, ly.O, ly.Gate, ly.Up, ly.Down)
	}
	if err := b.Preload(ms...); err != nil {
		t.Fatal(err)
	}
	m, kv := stepModel(t, b, c, w, 8)
	defer m.Close()
	pages := []int32{3, 1, 6, 0, 7, 2}
	copies, launches, prefill := 0, [numKernels]int{}, [numKernels]int{}
	start := 0
	for step, n := range []int{9, 9, 1, 1} {
		bt := seqStep(start, n, c.Vocab, 53, 7, pages)
		before, launched := b.h2dCopies, b.launches
		if _, err := m.Forward(bt, kv); err != nil {
			t.Fatal(err)
		}
		copies = b.h2dCopies - before
		for k := range launches {
			launches[k] = b.launches[k] - launched[k]
		}
		if step == 1 {
			prefill = launches
		}
		start += n
	}
	return copies, launches, prefill
}

// TestFakeDecodeStepCopies: a decode step's copies to the device do not
// grow with the model's depth. Each layer passes the same positions,
// slots and attention tables; a copy from pageable memory first waits for
// every kernel queued, so copying them again per layer would stall the
// GPU once per table per layer.
func TestFakeDecodeStepCopies(t *testing.T) {
	b := fakeBackend(t)
	one, _, _ := copiesPerDecodeStep(t, b, 1)
	three, launches, prefill := copiesPerDecodeStep(t, b, 3)
	if one != three {
		t.Fatalf("a decode step copies %d times with 1 layer, %d with 3", one, three)
	}
	t.Logf("%d copies a decode step", three)
	// The fused kernels carry the step: a layer's rotation and KV store in
	// one launch, each residual add inside the next norm but the last.
	for k, want := range map[int]int{kRoPEStoreKV: 3, kRoPE: 0, kStoreKV: 0, kAddRMSNorm: 5, kAdd: 1, kRMSNorm: 2} {
		if launches[k] != want {
			t.Errorf("%s launched %d times in a 3-layer decode step, want %d", kernelNames[k], launches[k], want)
		}
	}
	// A 9-row prefill chunk's products of f16 weights find their inputs
	// rounded by the kernels that wrote them (halfShadow) but O's: at head
	// dim 16 attention is not the tensor-core kernel, which alone writes a
	// rounded copy (TestFakeHalfShadow).
	if got := prefill[kToF16]; got != 3 {
		t.Errorf("a 3-layer prefill chunk rounded inputs to f16 %d times, want %d", got, 3)
	}
}

// halfShadowRun runs a prefill of two 17-row chunks (enough rows for the tensor-core attention) and a decode step of a
// 2-layer dummy model (weights of dt, a bf16 pool, head dim hd) on b and
// returns the logits of each step and the cast launches (kToF16 and
// kToBF16) of the second chunk.
func halfShadowRun(t *testing.T, b *Backend, dt kernels.DType, hd int) ([][]float32, int) {
	t.Helper()
	c := model.Config{Arch: "llama", Vocab: 256, Dim: 4 * hd, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: hd, FF: 320,
		ContextLength: 64, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: hd, Theta: 10000}}
	w, err := model.DummyWeights(&c, dt)
	if err != nil {
		t.Fatal(err)
	}
	m, kv := stepModel(t, b, c, w, 12)
	defer m.Close()
	pages := []int32{3, 1, 6, 0, 7, 2, 9, 11, 4, 10}
	var logits [][]float32
	casts, start := 0, 0
	for step, n := range []int{17, 17, 1} {
		before := b.launches
		out, err := m.Forward(seqStep(start, n, c.Vocab, 53, 7, pages), kv)
		if err != nil {
			t.Fatal(err)
		}
		logits = append(logits, slices.Clone(out))
		if step == 1 {
			casts = b.launches[kToF16] - before[kToF16] + b.launches[kToBF16] - before[kToBF16]
		}
		start += n
	}
	return logits, casts
}

// TestFakeHalfShadow: the kernels that write a product's input (the
// norms, SwiGLU, the tensor-core prompt attention) also write it rounded
// for a GemmEx product, so a prompt chunk launches no cast kernel, and
// the logits are bit for bit those of casting each input on its own:
// both round the same float32 values the same way.
func TestFakeHalfShadow(t *testing.T) {
	testHalfShadow(t, func(t *testing.T) (plain, shadows *Backend) {
		// Scratch buffers grow and stay, as they do outside the tests: one
		// of exactly the size asked would move at each product of another
		// size, and a move forgets any rounded input.
		plain, shadows = fakeBackend(t), fakeBackend(t)
		plain.exactScratch, shadows.exactScratch = false, false
		return plain, shadows
	})
}

// TestGPUHalfShadow is TestFakeHalfShadow on the GPU, one backend run
// without the shadows and then with them (cuBLAS's products are
// deterministic on one device, so the logits must still be bit for bit
// equal).
func TestGPUHalfShadow(t *testing.T) {
	testHalfShadow(t, func(t *testing.T) (plain, shadows *Backend) {
		b := gpuBackend(t)
		if b.blas == nil {
			t.Skip("no cuBLAS here: no GemmEx product, so no shadow to check")
		}
		return b, b
	})
}

func testHalfShadow(t *testing.T, backends func(t *testing.T) (plain, shadows *Backend)) {
	for _, tc := range []struct {
		dt    kernels.DType
		hd    int
		casts int // of the second chunk, with the shadows
	}{
		{kernels.F16, 16, 2},  // attention.cuh at head dim 16: O's input is cast
		{kernels.F16, 64, 0},  // the tensor-core kernel writes O's input rounded too
		{kernels.BF16, 64, 0}, // likewise in bf16
		{kernels.Q8_0, 64, 0}, // block formats multiply in f16 (dequantised rows)
	} {
		t.Run(fmt.Sprintf("%s/hd%d", tc.dt, tc.hd), func(t *testing.T) {
			plain, shadows := backends(t)
			plain.noHalfShadow = true
			want, cast := halfShadowRun(t, plain, tc.dt, tc.hd)
			plain.noHalfShadow = false
			got, shadowed := halfShadowRun(t, shadows, tc.dt, tc.hd)
			if cast != 4*2 {
				t.Errorf("without shadows the chunk cast %d inputs, want %d", cast, 4*2)
			}
			if shadowed != tc.casts {
				t.Errorf("with shadows the chunk cast %d inputs, want %d", shadowed, tc.casts)
			}
			for s := range want {
				for i := range want[s] {
					if math.Float32bits(got[s][i]) != math.Float32bits(want[s][i]) {
						t.Fatalf("step %d logit %d: %v with shadows, %v without", s, i, got[s][i], want[s][i])
					}
				}
			}
		})
	}
}

// TestFakeSmallCopiesStaged: copies to the device of up to stageMax bytes
// go through the pinned stage (a copy from pageable memory would first
// wait for the stream), larger ones straight from Go memory, and the
// results are the same.
func TestFakeSmallCopiesStaged(t *testing.T) {
	b := fakeBackend(t)
	if b.stage == nil {
		t.Fatal("no pinned stage")
	}
	rng := rand.New(rand.NewPCG(57, 58))
	for _, cols := range []int{64, stageMax/4 + 64} {
		w := randMatrix(rng, kernels.F32, 2, cols)
		x := randVec(rng, cols, 1)
		got, want := make([]float32, 2), make([]float32, 2)
		b.MatMul(got, x, 1, w)
		ref.New().MatMul(want, x, 1, w)
		copies, staged := b.h2dCopies, b.stagedCopies
		b.MatMul(got, x, 1, w) // the weight is on the device now: x alone is copied
		if small := 4*cols <= stageMax; (b.stagedCopies-staged == 1) != small || b.h2dCopies-copies != 1 {
			t.Errorf("x of %d bytes: %d copies, %d staged", 4*cols, b.h2dCopies-copies, b.stagedCopies-staged)
		}
		ck := &checker{T: t, What: fmt.Sprintf("MatMul of %d columns", cols), Tol: tolMatMul}
		for i := range got {
			ck.Check(i, got[i], want[i], kernelstest.MatMag(w, x, 0, i), 1e-30)
		}
	}
}

// TestFakeStageRefills: copies that would run past the pinned stage wait
// for the stream first and start it again from its beginning, so a stage
// byte is never rewritten while a copy from it may be queued, nor written
// past its end.
func TestFakeStageRefills(t *testing.T) {
	b := fakeBackend(t)
	b.lock()
	defer b.unlock()
	const n = stageMax / 4
	src := make([]float32, n)
	dst := b.buf(sX, stageMax)
	b.sync()
	for i := range 2*stageBytes/stageMax + 1 {
		before := b.staged
		src[0] = float32(i)
		b.h2d(dst, unsafe.Pointer(&src[0]), stageMax)
		if b.staged > stageBytes {
			t.Fatalf("copy %d: %d bytes staged in a stage of %d", i, b.staged, stageBytes)
		}
		if refilled := b.staged < before; refilled != (before+stageMax > stageBytes) {
			t.Fatalf("copy %d with %d bytes staged: started again %v", i, before, refilled)
		}
	}
	got := make([]float32, 1)
	b.d2h(unsafe.Pointer(&got[0]), dst, 4)
	if got[0] != float32(2*stageBytes/stageMax) {
		t.Fatalf("the last copy landed %g", got[0])
	}
}

// TestFakeHalfInputForgotten: a buffer an f16 product rounded, then
// overwritten by a cuBLAS product (no launch of the backend's own), is
// rounded again when the next f16 product reads it, not taken from the
// stale rounding.
func TestFakeHalfInputForgotten(t *testing.T) {
	b := fakeBackend(t)
	rng := rand.New(rand.NewPCG(61, 62))
	const n, cols = 12, 64 // over 8 rows: cuBLAS products
	w16 := randMatrix(rng, kernels.F16, cols, cols)
	w32 := randMatrix(rng, kernels.F32, cols, cols)
	x, y := randVec(rng, n*cols, 1), randVec(rng, n*cols, 1)
	out1, out2 := make([]float32, n*cols), make([]float32, n*cols)
	b.Keep(x, y, out1, out2)
	b.MatMul(out2, y, n, w32) // y and out2 on the device: no copy below forgets the rounding
	before := b.launches[kToF16]
	b.MatMul(out1, x, n, w16) // rounds x to f16
	b.MatMul(x, y, n, w32)    // sgemm writes x on the device
	b.MatMul(out2, x, n, w16) // must round the new x
	casts := b.launches[kToF16] - before
	b.Host(x, out2)
	want := make([]float32, n*cols)
	ref.New().MatMul(want, x, n, w16)
	ck := &checker{T: t, What: "f16 product of an overwritten input", Tol: tolMatMulF16}
	for i := range want {
		ck.Check(i, out2[i], want[i], kernelstest.MatMag(w16, x, i/cols, i%cols), 1e-30)
	}
	if casts < 2 {
		t.Errorf("%d roundings to f16 for two products of different inputs", casts)
	}
}
