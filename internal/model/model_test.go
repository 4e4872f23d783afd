package model

import (
	"math"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/ref"
	testref "github.com/batonlm/baton/test/reference"
)

type reference = testref.Greedy

func loadReference(t testing.TB) reference { return testref.Load(t) }

// generate runs greedy decoding through Forward with a simple page table
// (pages in reverse order, so the page indirection is exercised), feeding
// the prompt in chunks of chunk tokens.
func generate(t testing.TB, m *Model, prompt []int32, steps, pageSize, chunk int) ([]int32, [][]TokenLogprob) {
	c := &m.Config
	npages := (len(prompt)+steps)/pageSize + 2
	kv := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	kv.Data = make([]float32, npages*kv.PageFloats())
	for i := range kv.Data {
		kv.Data[i] = float32(math.NaN()) // any read of an unwritten slot poisons the logits
	}
	pages := make([]int32, npages)
	for i := range pages {
		pages[i] = int32(npages - 1 - i)
	}
	slot := func(pos int) int32 { return pages[pos/pageSize]*int32(pageSize) + int32(pos%pageSize) }
	var s Sampler
	seq := append([]int32(nil), prompt...)
	var out []int32
	var tops [][]TokenLogprob
	done := 0
	for len(out) < steps {
		end := min(len(seq), done+chunk)
		b := &Batch{}
		for p := done; p < end; p++ {
			b.Tokens = append(b.Tokens, seq[p])
			b.Positions = append(b.Positions, int32(p))
			b.Slots = append(b.Slots, slot(p))
		}
		b.Seqs = []kernels.AttnSeq{{Pages: pages, QStart: 0, QLen: end - done, KVLen: end}}
		logits, err := m.Forward(b, kv)
		if err != nil {
			t.Fatal(err)
		}
		done = end
		if done < len(seq) {
			continue
		}
		r := s.Sample(logits[:c.Vocab], Sampling{TopLogprobs: 5}, nil)
		out = append(out, r.ID)
		tops = append(tops, r.Top)
		seq = append(seq, r.ID)
	}
	return out, tops
}

func TestGreedyMatchesReference(t *testing.T) {
	ref0 := loadReference(t)
	l, err := Load(LoadOptions{}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	if l.Name != "stories260K" || l.Model.Config.Vocab != 512 || l.Model.Config.KVHeads != 4 {
		t.Fatalf("unexpected bundled model %q %+v", l.Name, l.Model.Config)
	}
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {1, 2}, {64, 3}} {
		got, tops := generate(t, l.Model, ref0.PromptIDs, len(ref0.GeneratedIDs), tc.page, tc.chunk)
		for i := range got {
			if got[i] != ref0.GeneratedIDs[i] {
				t.Fatalf("page %d chunk %d: token %d = %d, want %d", tc.page, tc.chunk, i, got[i], ref0.GeneratedIDs[i])
			}
			for j, want := range ref0.Top5[i] {
				g := tops[i][j]
				if g.ID != want.ID || math.Abs(float64(g.Logprob)-want.Logprob) > 1e-3 {
					t.Fatalf("page %d chunk %d: position %d top %d = %+v, want %+v", tc.page, tc.chunk, i, j, g, want)
				}
			}
		}
	}
}

func TestDummyDeterministic(t *testing.T) {
	c := Config{Arch: "llama", Vocab: 64, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 96, ContextLength: 64, NormEps: 1e-5,
		RoPE: kernels.RoPE{Dim: 16, Theta: 10000}}
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.Q8_0} {
		a, _ := DummyWeights(&c, dt)
		b, _ := DummyWeights(&c, dt)
		m1, m2 := New(c, a, ref.New()), New(c, b, ref.New())
		x, _ := generate(t, m1, []int32{1, 2, 3}, 5, 4, 2)
		y, _ := generate(t, m2, []int32{1, 2, 3}, 5, 4, 2)
		for i := range x {
			if x[i] != y[i] {
				t.Fatalf("%s: dummy weights not deterministic: %v vs %v", dt, x, y)
			}
		}
	}
}
