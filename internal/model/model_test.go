package model

import (
	"math"
	"strings"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/ref"
	testref "github.com/batonlm/baton/test/reference"
)

type reference = testref.Greedy

func loadReference(t testing.TB) reference { return testref.Load(t) }

// generate is Model.GreedyDecode with the top-5 alternatives, split into
// token ids and alternatives.
func generate(t testing.TB, m *Model, prompt []int32, steps, pageSize, chunk int) ([]int32, [][]TokenLogprob) {
	t.Helper()
	res, err := m.GreedyDecode(prompt, steps, pageSize, chunk, 5)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int32, len(res))
	tops := make([][]TokenLogprob, len(res))
	for i, r := range res {
		ids[i], tops[i] = r.ID, r.Top
	}
	return ids, tops
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

// TestReserveKeepsScratch: after Reserve, steps up to the reserved size run
// in the same scratch (no step allocates it again), and give the logits a
// model without a reserve gives.
func TestReserveKeepsScratch(t *testing.T) {
	load := func() *Model {
		l, err := Load(LoadOptions{}, ref.New())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Model.Close() })
		return l.Model
	}
	reserved, plain := load(), load()
	reserved.Reserve(48, 3)
	bases := func(m *Model) []*float32 {
		s := &m.s
		var ps []*float32
		for _, b := range [][]float32{s.x, s.h, s.q, s.k, s.v, s.attn, s.o, s.gate, s.up, s.last, s.logits} {
			ps = append(ps, unsafe.SliceData(b))
		}
		return ps
	}
	before := bases(reserved)
	for i, p := range before {
		if p == nil {
			t.Fatalf("scratch %d not reserved", i)
		}
	}
	c := &reserved.Config
	for _, shape := range [][2]int{{1, 5}, {2, 16}, {3, 16}} { // growing steps, the last 48 rows
		nseq, plen := shape[0], shape[1]
		kv, tables := benchKV(c, nseq, plen, 4)
		kv2, _ := benchKV(c, nseq, plen, 4)
		bt := prefillBatch(c, tables, nseq, plen)
		got, err := reserved.Forward(bt, kv)
		if err != nil {
			t.Fatal(err)
		}
		got = append([]float32(nil), got...)
		want, err := plain.Forward(bt, kv2)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != nseq*c.Vocab || len(want) != len(got) {
			t.Fatalf("%d x %d: %d logits, want %d", nseq, plen, len(got), nseq*c.Vocab)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%d x %d: logit %d = %v, without the reserve %v", nseq, plen, i, got[i], want[i])
			}
		}
		for i, p := range bases(reserved) {
			if p != before[i] {
				t.Fatalf("%d x %d: scratch %d was allocated again", nseq, plen, i)
			}
		}
	}
}

// refusesQ4K is a backend that multiplies every weight dtype but Q4_K.
type refusesQ4K struct{ kernels.Backend }

func (refusesQ4K) SupportsDType(dt kernels.DType) bool { return dt != kernels.Q4_K }

// A weight dtype the backend does not run is refused at load, naming the
// format, the tensor and the way out, dense and mixture of experts alike.
func TestLoadRefusesDTypeByName(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		set  func(w *Weights)
		name string
	}{
		{Config{Arch: "llama", Vocab: 64, Dim: 32, Layers: 2, Heads: 2, KVHeads: 2, HeadDim: 16, FF: 64, ContextLength: 32, NormEps: 1e-5},
			func(w *Weights) { w.Layers[1].Down.DType = kernels.Q4_K }, "blk.1.ffn_down.weight"},
		{Config{Arch: "qwen3moe", Vocab: 64, Dim: 32, Layers: 2, Heads: 2, KVHeads: 2, HeadDim: 16, FF: 32, ContextLength: 32, NormEps: 1e-5,
			QKNorm: true, Experts: 4, ExpertsUsed: 2}, func(w *Weights) { w.Layers[0].Experts[3].Up.DType = kernels.Q4_K }, "blk.0.ffn_up_exps.weight[3]"},
	} {
		w, err := DummyWeights(&c.cfg, kernels.F32)
		if err != nil {
			t.Fatal(err)
		}
		be := refusesQ4K{ref.New()}
		if err := checkDTypes(w, be); err != nil {
			t.Fatalf("every f32 weight refused: %v", err)
		}
		c.set(w)
		err = checkDTypes(w, be)
		if err == nil || !strings.Contains(err.Error(), c.name) || !strings.Contains(err.Error(), "q4_k") || !strings.Contains(err.Error(), "--device cpu") {
			t.Errorf("%s: %v, want the tensor, its format and --device cpu named", c.name, err)
		}
	}
}
