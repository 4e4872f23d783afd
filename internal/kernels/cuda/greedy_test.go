package cuda

import (
	"math"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/model"
	testref "github.com/batonlm/baton/test/reference"
)

// The stories260K greedy reference (llama.cpp, CPU) through this backend:
// the bundled model, every token and the top-5 logprobs within 1e-3, with
// the prompt fed whole, one token at a time and in chunks, over a pool
// poisoned with NaN so that reading any unwritten slot would show.

type greedyRef = testref.Greedy

func loadGreedyRef(t testing.TB) greedyRef { return testref.Load(t) }

// generate is Model.GreedyDecode with the top-5 alternatives, split into
// token ids and alternatives.
func generate(t testing.TB, m *model.Model, prompt []int32, steps, pageSize, chunk int) ([]int32, [][]model.TokenLogprob) {
	t.Helper()
	res, err := m.GreedyDecode(prompt, steps, pageSize, chunk, 5)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int32, len(res))
	tops := make([][]model.TokenLogprob, len(res))
	for i, r := range res {
		ids[i], tops[i] = r.ID, r.Top
	}
	return ids, tops
}

func checkGreedy(t *testing.T, b *Backend) {
	want := loadGreedyRef(t)
	l, err := model.Load(model.LoadOptions{}, b)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {1, 2}, {64, 3}} {
		got, tops := generate(t, l.Model, want.PromptIDs, len(want.GeneratedIDs), tc.page, tc.chunk)
		for i := range got {
			if got[i] != want.GeneratedIDs[i] {
				t.Fatalf("page %d chunk %d: token %d = %d, want %d", tc.page, tc.chunk, i, got[i], want.GeneratedIDs[i])
			}
			for j, w := range want.Top5[i] {
				g := tops[i][j]
				if g.ID != w.ID || math.Abs(float64(g.Logprob)-w.Logprob) > 1e-3 {
					t.Fatalf("page %d chunk %d: position %d top %d = %+v, want %+v", tc.page, tc.chunk, i, j, g, w)
				}
			}
		}
	}
	t.Logf("%d tokens match the reference (%s weights)", len(want.GeneratedIDs), l.Model.Weights.DType())
}

func TestFakeGreedyStories260K(t *testing.T) { checkGreedy(t, fakeBackend(t)) }

func TestGPUGreedyStories260K(t *testing.T) { checkGreedy(t, gpuBackend(t)) }

// checkDummyModels runs small dummy models of every weight dtype through
// the backend and ref: a 12-token prefill (products of 12 rows: cuBLAS,
// GemmEx for f16/bf16) then decode steps (gemv kernels), comparing logits.
func checkDummyModels(t *testing.T, b *Backend) {
	c := model.Config{Arch: "qwen2", Vocab: 256, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 128,
		ContextLength: 64, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 16, Theta: 10000, NeoX: true}, QKVBias: true}
	checkDummyConfig(t, b, c)
}

// checkDummyMoE does the same for a mixture of experts (8 experts, 2 a
// token, renormalised as Qwen3-MoE's norm_topk_prob): the rows of a step
// are routed on the host and the backend runs the experts over them on
// the device (Experts, every MoE layer of every step: the model never
// gathers rows on the host here).
func checkDummyMoE(t *testing.T, b *Backend) {
	c := dummyMoE
	calls := b.expertCalls
	checkDummyConfig(t, b, c)
	if want := len(allDTypes) * 3 * c.Layers; b.expertCalls-calls != want {
		t.Errorf("Experts ran %d times, want %d (every layer of 3 steps of %d dtypes)", b.expertCalls-calls, want, len(allDTypes))
	}
}

var dummyMoE = model.Config{Arch: "qwen3moe", Vocab: 256, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 32,
	ContextLength: 64, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 16, Theta: 10000, NeoX: true}, QKNorm: true,
	Experts: 8, ExpertsUsed: 2, ExpertNorm: true}

// TestFakeMoEStepCopiesNoWeights: with a mixture of experts' weights on
// the device, a decode step copies in its token, position and slot, the
// routing tables and the like, less in all than one expert matrix: no
// expert's weights travel per step.
func TestFakeMoEStepCopiesNoWeights(t *testing.T) {
	b := fakeBackend(t)
	c := dummyMoE
	w, err := model.DummyWeights(&c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	ms := []*kernels.Matrix{w.Embed, w.Output}
	for _, ly := range w.Layers {
		ms = append(ms, ly.Q, ly.K, ly.V, ly.O, ly.Router)
		for _, ex := range ly.Experts {
			ms = append(ms, ex.Gate, ex.Up, ex.Down)
		}
	}
	if err := b.Preload(ms...); err != nil {
		t.Fatal(err)
	}
	m := model.New(c, w, b)
	kvh := kernels.PagedKV{PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	kvh.Data = make([]float32, 8*kvh.PageFloats())
	kv := toDevice(t, b, kvh)
	pages := []int32{3, 1, 6, 0, 2}
	expert := 4 * c.FF * c.Dim
	start, n := 0, 12
	for step := range 6 {
		bt := seqStep(start, n, c.Vocab, 53, 7, pages)
		before, calls := b.h2dBytes, b.expertCalls
		if _, err := m.Forward(bt, kv); err != nil {
			t.Fatal(err)
		}
		copied := b.h2dBytes - before
		if b.expertCalls-calls != c.Layers {
			t.Fatalf("step %d: Experts ran %d times for %d layers", step, b.expertCalls-calls, c.Layers)
		}
		if step > 0 && copied >= expert {
			t.Errorf("decode step %d copied %d bytes to the device, an expert matrix is %d", step, copied, expert)
		}
		t.Logf("step %d (%d rows): %d bytes copied in", step, n, copied)
		start, n = start+n, 1
	}
}

func checkDummyConfig(t *testing.T, b *Backend, c model.Config) {
	// Logit tolerance relative to the largest |logit|: f16/bf16 prefill
	// rounds activations (and q8_0's decoded weights, to f16) for the
	// tensor cores.
	tol := map[kernels.DType]float64{kernels.F32: 1e-4, kernels.F16: 5e-3, kernels.BF16: 3e-2, kernels.Q8_0: 5e-3}
	for _, dt := range allDTypes {
		w, err := model.DummyWeights(&c, dt)
		if err != nil {
			t.Fatal(err)
		}
		// Biases that change the result: they are added on the host, between
		// products whose activations otherwise stay on the device.
		for l := range w.Layers {
			for _, bias := range [][]float32{w.Layers[l].QBias, w.Layers[l].KBias, w.Layers[l].VBias} {
				for i := range bias {
					bias[i] = float32((i*7+l*3)%11-5) * 0.05
				}
			}
		}
		worst := compareLogits(t, b, c, w, dt.String(), 12, tol[dt])
		t.Logf("%s: worst logit error %.2g of the largest", dt, worst)
	}
}

func TestFakeDummyModels(t *testing.T) { checkDummyModels(t, fakeBackend(t)) }

func TestGPUDummyModels(t *testing.T) { checkDummyModels(t, gpuBackend(t)) }

func TestFakeDummyMoE(t *testing.T) { checkDummyMoE(t, fakeBackend(t)) }

func TestGPUDummyMoE(t *testing.T) { checkDummyMoE(t, gpuBackend(t)) }

// TotalMemory reports the device's memory (the fake driver's), what
// --mem-fraction-static is a fraction of.
func TestFakeTotalMemory(t *testing.T) {
	b := fakeBackend(t)
	total, err := b.TotalMemory()
	if err != nil || total <= 0 {
		t.Fatalf("TotalMemory: %d, %v", total, err)
	}
}

// The stories260K reference over narrow KV pools (f16, bf16, fp8) on this backend:
// the first 24 greedy tokens (the emulation is slow; the whole reference
// runs over f32 KV above) are the reference's and each chosen token's
// log-probability moves no more than the rounding allows (the cpu
// backend's bounds, internal/model's TestGreedyKVDTypeMatchesReference).
func checkGreedyKVDType(t *testing.T, b *Backend) {
	want := loadGreedyRef(t)
	l, err := model.Load(model.LoadOptions{}, b)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	tol := map[kernels.DType]float64{kernels.F16: 6e-3, kernels.BF16: 3e-2, kernels.F8E4M3: 0.25}
	for _, dt := range narrowKV {
		res, err := l.Model.GreedyDecodeKV(want.PromptIDs, min(24, len(want.GeneratedIDs)), 16, 7, 1, dt)
		if err != nil {
			t.Fatal(err)
		}
		worst := 0.0
		for i, r := range res {
			if r.ID != want.GeneratedIDs[i] {
				t.Fatalf("%s KV: token %d = %d, want %d", dt, i, r.ID, want.GeneratedIDs[i])
			}
			d := math.Abs(float64(r.Top[0].Logprob) - want.Top5[i][0].Logprob)
			worst = max(worst, d)
			if d > tol[dt] {
				t.Fatalf("%s KV: position %d logprob %v, reference %v", dt, i, r.Top[0].Logprob, want.Top5[i][0].Logprob)
			}
		}
		t.Logf("%s KV: worst chosen-token logprob difference %.2g", dt, worst)
	}
}

func TestFakeGreedyKVDType(t *testing.T) { checkGreedyKVDType(t, fakeBackend(t)) }

func TestGPUGreedyKVDType(t *testing.T) { checkGreedyKVDType(t, gpuBackend(t)) }
