package model

import (
	"math"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
)

// wrongGrapher is a backend whose "graphs" compute something else: the
// first run of each (after EndGraphStep says it was fresh) has its LM
// head's output shifted, as a graph replaying stale tables would give.
type wrongGrapher struct {
	kernels.Backend
	vocab   int
	inGraph bool
	fresh   bool
	wrong   []string
	steps   int
	right   bool // its graphs compute what direct launches do
}

func (g *wrongGrapher) GraphRows(_ uint64, n int) int {
	if len(g.wrong) > 0 {
		return 0 // turned off
	}
	return n
}
func (g *wrongGrapher) BeginGraphStep(uint64, int) { g.inGraph, g.fresh = true, g.steps == 0 }
func (g *wrongGrapher) EndGraphStep() bool {
	g.inGraph = false
	g.steps++
	return g.fresh
}
func (g *wrongGrapher) GraphWrong(_ uint64, _ int, why string) { g.wrong = append(g.wrong, why) }

func (g *wrongGrapher) MatMul(out, x []float32, n int, w *kernels.Matrix) {
	g.Backend.MatMul(out, x, n, w)
	if g.inGraph && g.fresh && !g.right && w.Rows == g.vocab {
		out[0] += 1
	}
}

// A graph whose first run differs from direct launches is caught before
// any token is drawn from it: the step returns the direct logits, the
// bucket is turned off, and the next steps run directly. A graph that
// agrees (every later step here) is not reported.
func TestGraphFirstRunChecked(t *testing.T) {
	c := Config{Arch: "llama", Vocab: 64, Dim: 32, Layers: 1, Heads: 2, KVHeads: 1, HeadDim: 16, FF: 64,
		ContextLength: 32, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 16, Theta: 10000}}
	w, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	g := &wrongGrapher{Backend: cpu.New(1), vocab: c.Vocab}
	graphed, direct := New(c, w, g), New(c, w, cpu.New(1))
	kv := func() kernels.PagedKV {
		kv := kernels.PagedKV{PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
		kv.Data = make([]float32, 4*kv.PageFloats())
		return kv
	}
	kvg, kvd := kv(), kv()
	for pos := range 3 {
		b := &Batch{Tokens: []int32{int32(5 + pos)}, Positions: []int32{int32(pos)}, Slots: []int32{int32(pos)},
			Seqs: []kernels.AttnSeq{{Pages: []int32{0}, QLen: 1, KVLen: pos + 1}}}
		got, err := graphed.ForwardDevice(b, kvg)
		if err != nil {
			t.Fatal(err)
		}
		want, err := direct.ForwardDevice(b, kvd)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("step %d: logit %d = %g, direct %g", pos, i, got[i], want[i])
			}
		}
	}
	if len(g.wrong) != 1 || !strings.Contains(g.wrong[0], "logit 0") {
		t.Fatalf("GraphWrong calls %q; want one, naming logit 0", g.wrong)
	}
	right := &wrongGrapher{Backend: cpu.New(1), vocab: c.Vocab, right: true}
	b := &Batch{Tokens: []int32{5}, Positions: []int32{0}, Slots: []int32{0}, Seqs: []kernels.AttnSeq{{Pages: []int32{0}, QLen: 1, KVLen: 1}}}
	if _, err := New(c, w, right).ForwardDevice(b, kv()); err != nil {
		t.Fatal(err)
	}
	if right.steps != 1 || len(right.wrong) != 0 {
		t.Fatalf("a right graph: %d graph steps, GraphWrong %q", right.steps, right.wrong)
	}
}
