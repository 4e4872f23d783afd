package gpu

import (
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
)

// llama1B is a Llama-3.2-1B-shaped config: about 1.24 billion parameters.
func llama1B() model.Config {
	return model.Config{Arch: "llama", Name: "dummy-1b", Vocab: 128256, Dim: 2048, Layers: 16, Heads: 32, KVHeads: 8,
		HeadDim: 64, FF: 8192, ContextLength: 4096, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 500000},
		TieEmbeddings: true}
}

// moe25B is the mixture of experts the CPU benchmarks serve side by side
// with llama.cpp (synth's moe-2.5b): 24 layers of 64 experts, 8 a token,
// about 2.5 billion parameters with 0.35 billion a token.
func moe25B() model.Config {
	return model.Config{Arch: "qwen3moe", Name: "dummy-moe-2.5b", Vocab: 32000, Dim: 1024, Layers: 24, Heads: 16,
		KVHeads: 4, HeadDim: 64, FF: 512, ContextLength: 2048, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 64, Theta: 1e6, NeoX: true},
		QKNorm: true, Experts: 64, ExpertsUsed: 8, ExpertNorm: true}
}

func matrices(w *model.Weights) []*kernels.Matrix {
	ms := []*kernels.Matrix{w.Embed, w.Output}
	for i := range w.Layers {
		l := &w.Layers[i]
		for _, m := range []*kernels.Matrix{l.Q, l.K, l.V, l.O, l.Gate, l.Up, l.Down, l.Router} {
			if m != nil {
				ms = append(ms, m)
			}
		}
		for _, ex := range l.Experts {
			ms = append(ms, ex.Gate, ex.Up, ex.Down)
		}
	}
	return ms
}

// pool makes a KV pool of seqs sequences of up to tokens positions each,
// in the backend's memory when it holds the pool (a GPU's; freed with tb),
// of the dtype a server stores there by default (--kv-cache-dtype auto).
func pool(tb testing.TB, be kernels.Backend, c *model.Config, seqs, tokens int) (kernels.PagedKV, [][]int32) {
	const ps = 16
	kv := kernels.PagedKV{PageSize: ps, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		DType: kernels.AutoKVDType(be)}
	per := (tokens + ps - 1) / ps
	if a, ok := be.(kernels.KVAllocator); ok {
		dev, err := a.AllocKV(kv, seqs*per)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { dev.Close() })
		kv.Device = dev
	} else {
		kv.Data = make([]float32, seqs*per*kv.PageFloats())
	}
	tables := make([][]int32, seqs)
	for s := range tables {
		for p := 0; p < per; p++ {
			tables[s] = append(tables[s], int32(s*per+p))
		}
	}
	return kv, tables
}

func checkLogits(t testing.TB, logits []float32) {
	for i, v := range logits {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %d is %g", i, v)
		}
	}
}

// prefill is batch sequences of plen prompt tokens each, in one step.
func prefill(tb testing.TB, be kernels.Backend, c *model.Config, batch, plen int) (*model.Batch, kernels.PagedKV) {
	kv, tables := pool(tb, be, c, batch, plen)
	bt := &model.Batch{}
	for s := 0; s < batch; s++ {
		q0 := len(bt.Tokens)
		for p := 0; p < plen; p++ {
			bt.Tokens = append(bt.Tokens, int32((s*7919+p*31)%c.Vocab))
			bt.Positions = append(bt.Positions, int32(p))
			bt.Slots = append(bt.Slots, tables[s][p/16]*16+int32(p%16))
		}
		bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: q0, QLen: plen, KVLen: plen})
	}
	return bt, kv
}

// decode is one new token for each of batch sequences at position ctx.
func decode(tb testing.TB, be kernels.Backend, c *model.Config, batch, ctx int) (*model.Batch, kernels.PagedKV) {
	kv, tables := pool(tb, be, c, batch, ctx+1)
	bt := &model.Batch{}
	for s := 0; s < batch; s++ {
		bt.Tokens = append(bt.Tokens, int32((s*13+5)%c.Vocab))
		bt.Positions = append(bt.Positions, int32(ctx))
		bt.Slots = append(bt.Slots, tables[s][ctx/16]*16+int32(ctx%16))
		bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: s, QLen: 1, KVLen: ctx + 1})
	}
	return bt, kv
}

// BenchmarkGPUModel1B: tokens per second of a dummy 1B model with f16
// weights on GPU 0, prefill (batch 1 x 512 and x 4096 prompt tokens,
// batch 32 x 128; also in TFLOP/s, prefillFLOPs) and decode (one token
// per sequence at context 512, batch 1 and 32). Activations stay on the
// device (kernels.Resident); each step copies in its token ids, positions
// and slots and copies out the last rows and the logits, and these
// figures include that.
func BenchmarkGPUModel1B(b *testing.B) { benchModel(b, llama1B(), "dummy 1B") }

// BenchmarkGPUModelMoE is the same for the mixture of experts moe25B.
func BenchmarkGPUModelMoE(b *testing.B) { benchModel(b, moe25B(), "dummy MoE 2.5B") }

func benchModel(b *testing.B, c model.Config, what string) {
	be, err := cuda.Open(0)
	if err != nil {
		if os.Getenv("BATON_REQUIRE_GPU") == "1" {
			b.Fatalf("BATON_REQUIRE_GPU=1 and cuda.Open(0): %v", err)
		}
		b.Skipf("no usable CUDA GPU here (%v): run on a GPU machine (test/gpu/run.sh)", err)
	}
	defer be.Close()
	start := time.Now()
	w, err := model.DummyWeights(&c, kernels.F16)
	if err != nil {
		b.Fatal(err)
	}
	built := time.Since(start)
	if err := be.Preload(matrices(w)...); err != nil {
		b.Fatal(err)
	}
	b.Logf("%s: %.2fB params, f16, %s KV; built in %v, uploaded in %v; %s", what, float64(w.Params())/1e9,
		kernels.AutoKVDType(be), built, time.Since(start)-built, be.Describe())
	m := model.New(c, w, be)
	// step times Forward over the batch mk makes, tokens (and flops) per call.
	step := func(name string, tokens int, flops float64, mk func(b *testing.B) (*model.Batch, kernels.PagedKV)) {
		b.Run(name, func(b *testing.B) {
			bt, kv := mk(b)
			logits, err := m.Forward(bt, kv)
			if err != nil {
				b.Fatal(err)
			}
			checkLogits(b, logits)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := m.Forward(bt, kv); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(tokens*b.N)/b.Elapsed().Seconds(), "tok/s")
			if flops > 0 {
				b.ReportMetric(flops*float64(b.N)/b.Elapsed().Seconds()/1e12, "TFLOP/s")
			}
		})
	}
	for _, p := range [][2]int{{1, 512}, {1, 4096}, {32, 128}} {
		batch, plen := p[0], p[1]
		if plen > c.ContextLength {
			continue
		}
		step(fmt.Sprintf("prefill/batch%d/prompt%d", batch, plen), batch*plen, prefillFLOPs(&c, batch, plen),
			func(b *testing.B) (*model.Batch, kernels.PagedKV) { return prefill(b, be, &c, batch, plen) })
	}
	for _, batch := range []int{1, 32} {
		step(fmt.Sprintf("decode/batch%d/ctx512", batch), batch, 0, func(b *testing.B) (*model.Batch, kernels.PagedKV) {
			return decode(b, be, &c, batch, 512)
		})
	}
}

// prefillFLOPs is the arithmetic of a prefill step of batch prompts of
// plen tokens on a dense model: 2 a weight a token in the layers'
// matrices, the LM head on each sequence's last row only (the step
// computes no other logits), and causal attention, Q·Kᵀ and P·V over the
// positions each row sees (4·hd·heads·plen(plen+1)/2 a layer and prompt).
// Embedding lookups, norms and activations are not counted.
func prefillFLOPs(c *model.Config, batch, plen int) float64 {
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	layer := float64(c.Dim*qd + 2*c.Dim*kvd + qd*c.Dim + 3*c.Dim*c.FF)
	tokens := float64(batch * plen)
	attn := 4 * float64(c.HeadDim*c.Heads) * float64(plen) * float64(plen+1) / 2
	return 2*layer*float64(c.Layers)*tokens + 2*float64(c.Vocab*c.Dim)*float64(batch) +
		attn*float64(c.Layers)*float64(batch)
}

// TestParams keeps the benchmark's model at about a billion parameters.
func TestParams(t *testing.T) {
	c := llama1B()
	qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	params := c.Vocab*c.Dim + c.Layers*(c.Dim*qd+2*c.Dim*kvd+qd*c.Dim+3*c.Dim*c.FF)
	if params < 1.0e9 || params > 1.5e9 {
		t.Fatalf("%d parameters", params)
	}
	t.Logf("%.3fB parameters in the matrices", float64(params)/1e9)
	m := moe25B()
	qd, kvd = m.Heads*m.HeadDim, m.KVHeads*m.HeadDim
	moe := m.Vocab*m.Dim + m.Layers*(m.Dim*qd+2*m.Dim*kvd+qd*m.Dim+m.Experts*(m.Dim+3*m.Dim*m.FF))
	if moe < 2.3e9 || moe > 2.7e9 {
		t.Fatalf("the mixture of experts has %d parameters", moe)
	}
	// 512 tokens: 2·(params - embeddings)·512 + the head's last row +
	// attention, 16 x 4·64·32·(512·513/2).
	want := 2*float64(params-c.Vocab*c.Dim)*512 + 2*float64(c.Vocab*c.Dim) + 16*4*64*32*512*513/2.0
	if got := prefillFLOPs(&c, 1, 512); math.Abs(got-want) > 1e-9*want {
		t.Fatalf("prefillFLOPs = %g, want %g", got, want)
	}
}

// TestBatchesSmoke runs the benchmark's batches through a tiny model on the
// reference backend, with the pool in host memory and in memory the
// backend holds (as on the GPU), so their construction is checked without
// a GPU.
func TestBatchesSmoke(t *testing.T) {
	c := model.Config{Arch: "llama", Vocab: 300, Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, FF: 64,
		ContextLength: 64, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 8, Theta: 10000}, TieEmbeddings: true}
	w, err := model.DummyWeights(&c, kernels.F16)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(matrices(w)); got != 2+7*c.Layers {
		t.Fatalf("%d matrices", got)
	}
	moe := model.Config{Arch: "qwen3moe", Vocab: 300, Dim: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, FF: 16,
		ContextLength: 64, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 8, Theta: 10000, NeoX: true}, QKNorm: true,
		Experts: 4, ExpertsUsed: 2, ExpertNorm: true}
	mw, err := model.DummyWeights(&moe, kernels.F16)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(matrices(mw)); got != 2+5*moe.Layers+3*moe.Experts*moe.Layers {
		t.Fatalf("%d matrices of the mixture of experts", got)
	}
	for _, be := range []kernels.Backend{ref.New(), kernelstest.Device{Backend: ref.New()}} {
		smokeBatches(t, be, c, w)
		smokeBatches(t, be, moe, mw)
	}
}

// smokeBatches runs prefill and decode batches of 1 and 3 sequences.
func smokeBatches(t *testing.T, be kernels.Backend, c model.Config, w *model.Weights) {
	m := model.New(c, w, be)
	for _, batch := range []int{1, 3} {
		for _, mk := range []func() (*model.Batch, kernels.PagedKV){
			func() (*model.Batch, kernels.PagedKV) { return prefill(t, be, &c, batch, 20) },
			func() (*model.Batch, kernels.PagedKV) { return decode(t, be, &c, batch, 40) },
		} {
			bt, kv := mk()
			logits, err := m.Forward(bt, kv)
			if err != nil {
				t.Fatal(err)
			}
			if len(logits) != batch*c.Vocab {
				t.Fatalf("%d logits", len(logits))
			}
			checkLogits(t, logits)
		}
	}
}
