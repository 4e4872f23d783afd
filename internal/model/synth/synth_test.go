package synth

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/inspect"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/tokenizer"
)

var tiny = Shape{Vocab: 600, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FF: 96, Context: 256, DType: "F16"}

// A synthesised file loads as a model with its shape and the bundled
// tokenizer padded to its vocabulary, tokenizes text, and runs forward
// steps to finite logits.
func TestSynthLoadsAndRuns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := Write(path, tiny, Options{Seed: 1}); err != nil {
		t.Fatal(err)
	}
	out, err := inspect.Inspect(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"architecture:    llama", "shape:           vocab 600, hidden 64, layers 2, heads 4, kv heads 2, head dim 16, ffn 96",
		"loads:           yes", "600 tokens", "context length:  256"} {
		if !strings.Contains(out, want) {
			t.Errorf("model inspect lacks %q:\n%s", want, out)
		}
	}
	if p := tiny.Params(); !strings.Contains(out, "parameters:      "+commas(p)) {
		t.Errorf("model inspect does not count %s parameters:\n%s", commas(p), out)
	}

	l, err := model.Load(model.LoadOptions{Path: path}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	defer l.GGUF.Close()
	tok, err := tokenizer.FromGGUF(l.GGUF)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Encode("Once upon a time", true, false)
	if len(ids) < 3 {
		t.Fatalf("encoded to %v", ids)
	}
	for _, id := range ids {
		if id >= 512 {
			t.Errorf("text encoded to a padding piece %d", id)
		}
	}
	got, err := l.Model.GreedyDecode(ids, 4, 16, 64, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("%d tokens generated, want 4", len(got))
	}
	for _, s := range got {
		if s.ID < 0 || int(s.ID) >= tiny.Vocab || math.IsNaN(float64(s.Logprob)) {
			t.Errorf("generated %+v", s)
		}
	}
}

// The same shape and seed give the same file; another seed another.
func TestSynthDeterministic(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, seed uint64) []byte {
		p := filepath.Join(dir, name+".gguf")
		if err := Write(p, tiny, Options{Seed: seed, Name: "tiny"}); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b, c := write("a", 7), write("b", 7), write("c", 8)
	if !bytes.Equal(a, b) {
		t.Error("two files of one seed differ")
	}
	if bytes.Equal(a, c) {
		t.Error("two seeds gave the same file")
	}
}

func TestSynthRefusesBadShapes(t *testing.T) {
	for _, s := range []Shape{
		{Vocab: 10, Dim: 60, Layers: 1, Heads: 8, KVHeads: 8, FF: 8, Context: 8, DType: "F32"}, // 60 / 8
		{Vocab: 10, Dim: 64, Layers: 1, Heads: 4, KVHeads: 3, FF: 8, Context: 8, DType: "F32"}, // 4 / 3
		{Vocab: 10, Dim: 64, Layers: 1, Heads: 4, KVHeads: 4, FF: 8, Context: 8, DType: "Q4_K"},
	} {
		if err := Write(filepath.Join(t.TempDir(), "x.gguf"), s, Options{}); err == nil {
			t.Errorf("shape %+v accepted", s)
		}
	}
}

// The benchmark shapes have the parameter counts their tables name.
func TestShapes(t *testing.T) {
	if p := Shapes["134m"].Params(); p/1e6 != 134 {
		t.Errorf("134m has %d parameters", p)
	}
	if p := Shapes["1.1b"].Params(); p/1e8 != 11 {
		t.Errorf("1.1b has %d parameters", p)
	}
}

func commas(n int64) string {
	s := []byte{}
	d := []byte(itoa(n))
	for i := range d {
		if i > 0 && (len(d)-i)%3 == 0 {
			s = append(s, ',')
		}
		s = append(s, d[i])
	}
	return string(s)
}

func itoa(n int64) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}

// tinyMoE are small mixtures of experts of each architecture the writer
// makes.
var tinyMoE = map[string]Shape{
	"qwen3moe": {Vocab: 600, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FF: 32, Context: 256, DType: "F16", Arch: "qwen3moe", Experts: 8, ExpertsUsed: 2},
	"mixtral":  {Vocab: 600, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FF: 96, Context: 256, DType: "BF16", Experts: 4, ExpertsUsed: 2},
}

// Mixtures of experts of both architectures load, with every expert
// counted, the experts shown by model inspect, and generate.
func TestSynthMoE(t *testing.T) {
	for name, s := range tinyMoE {
		path := filepath.Join(t.TempDir(), name+".gguf")
		if err := Write(path, s, Options{Seed: 3, Std: 0.2}); err != nil {
			t.Fatal(err)
		}
		out, err := inspect.Inspect(path)
		if err != nil {
			t.Fatal(err)
		}
		arch := "llama"
		if s.Arch != "" {
			arch = s.Arch
		}
		for _, want := range []string{"architecture:    " + arch, "loads:           yes", "parameters:      " + commas(s.Params()),
			"experts:         " + itoa(int64(s.Experts)) + ", 2 used per token (ffn " + itoa(int64(s.FF)) + " each"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: model inspect lacks %q:\n%s", name, want, out)
			}
		}
		l, err := model.Load(model.LoadOptions{Path: path}, ref.New())
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.Model.GreedyDecode([]int32{1, 2, 3}, 4, 16, 64, 0)
		if err != nil || len(got) != 4 {
			t.Fatalf("%s: %v %v", name, got, err)
		}
		l.Model.Close()
	}
	if p := Shapes["moe-2.5b"].Params(); p/1e8 != 25 {
		t.Errorf("moe-2.5b has %d parameters", p)
	}
}
