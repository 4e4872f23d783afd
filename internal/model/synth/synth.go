// Package synth writes Llama GGUF files of real shapes with random
// weights: the models the side-by-side benchmarks (make bench-peer) serve,
// so that their figures can be reproduced from the repository alone. The
// weights are normal with a small standard deviation and the norms are
// ones, so the text they produce is noise; only the shapes, the bytes
// moved and the FLOPs are those of the real models, and those are what a
// speed comparison measures.
//
// Everything is derived from the seed: the same shape, seed and
// vocabulary give the same file, byte for byte.
package synth

import (
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// Shape is a Llama model's shape and weight dtype (F32, F16 or BF16; the
// norms are F32 whatever it is, as in converted GGUFs). Experts > 0 makes
// a mixture of experts, ExpertsUsed of them run per token, each with an
// FFN of FF: a qwen3moe (per-head q/k norms) when Arch says so, else a
// Mixtral-style llama.
type Shape struct {
	Vocab, Dim, Layers, Heads, KVHeads, FF, Context int
	DType                                           string
	Arch                                            string // llama (""), qwen3moe
	Experts, ExpertsUsed                            int
}

// The shapes of the benchmark tables: a 134M Llama (768×12, the 32000
// vocabulary of Llama 2, F32) and TinyLlama 1.1B's shape in F16.
var Shapes = map[string]Shape{
	"134m": {Vocab: 32000, Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, FF: 2048, Context: 2048, DType: "F32"},
	"1.1b": {Vocab: 32000, Dim: 2048, Layers: 22, Heads: 32, KVHeads: 4, FF: 5632, Context: 2048, DType: "F16"},
	// A small Qwen3-MoE (hidden 1024, 24 layers, 64 experts of ffn 512,
	// 8 used): 2.5B parameters, 0.4B of them read a token.
	"moe-2.5b": {Vocab: 32000, Dim: 1024, Layers: 24, Heads: 16, KVHeads: 4, FF: 512, Context: 2048, DType: "F16",
		Arch: "qwen3moe", Experts: 64, ExpertsUsed: 8},
}

// Options are what is not the shape.
type Options struct {
	Seed uint64
	// Std is the weights' standard deviation (0: 0.02).
	Std float64
	// Vocab is a GGUF whose tokenizer.* metadata the model takes (e.g. a
	// vocab-only GGUF of llama.cpp's); empty: the bundled model's tokenizer.
	// Either is padded with unused pieces up to the shape's vocabulary.
	Vocab string
	// Name is general.name (default: the file's base name).
	Name string
}

var ggmlTypes = map[string]struct {
	t        gguf.Type
	k        kernels.DType
	fileType uint32 // general.file_type: llama.cpp's LLAMA_FTYPE_*
}{
	"F32":  {gguf.TypeF32, kernels.F32, 0},
	"F16":  {gguf.TypeF16, kernels.F16, 1},
	"BF16": {gguf.TypeBF16, kernels.BF16, 32},
}

// Params is the number of weights s holds.
func (s Shape) Params() int64 {
	hd := s.Dim / s.Heads
	layer := 2*s.Dim + s.Dim*s.Heads*hd*2 + 2*s.Dim*s.KVHeads*hd + 3*s.Dim*s.FF
	if s.Experts > 0 {
		layer += (s.Experts-1)*3*s.Dim*s.FF + s.Experts*s.Dim
	}
	if s.Arch == "qwen3moe" {
		layer += 2 * hd
	}
	return int64(2*s.Vocab*s.Dim+s.Dim) + int64(s.Layers)*int64(layer)
}

func (s Shape) check() error {
	if s.Vocab < 1 || s.Dim < 1 || s.Layers < 1 || s.Heads < 1 || s.KVHeads < 1 || s.FF < 1 || s.Context < 1 {
		return fmt.Errorf("synth: shape %+v: every size must be positive", s)
	}
	if s.Dim%s.Heads != 0 || s.Heads%s.KVHeads != 0 || (s.Dim/s.Heads)%2 != 0 {
		return fmt.Errorf("synth: shape %+v: hidden size must split into heads of an even size, and heads into kv heads", s)
	}
	if s.Arch != "" && s.Arch != "llama" && s.Arch != "qwen3moe" {
		return fmt.Errorf("synth: architecture %q (llama or qwen3moe)", s.Arch)
	}
	if s.Experts < 0 || (s.Experts > 0 || s.Arch == "qwen3moe") && (s.ExpertsUsed < 1 || s.ExpertsUsed > s.Experts) {
		return fmt.Errorf("synth: shape %+v: a mixture of experts uses between 1 and all of its experts", s)
	}
	if _, ok := ggmlTypes[strings.ToUpper(s.DType)]; !ok {
		return fmt.Errorf("synth: dtype %q (F32, F16 or BF16; quantise with llama.cpp's llama-quantize)", s.DType)
	}
	return nil
}

// vocabulary is the tokenizer.* metadata the file carries, padded to at
// least s.Vocab tokens, and the vocabulary's size.
func vocabulary(path string, vocab int) ([]gguf.KV, int, error) {
	var f *gguf.File
	var err error
	if path == "" {
		f, err = gguf.Parse(bundled.Stories260K)
	} else {
		f, err = gguf.Open(path)
	}
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	kvs := f.MetaKVs("tokenizer.")
	var tokens []string
	var scores []float32
	var types []int32
	for _, kv := range kvs {
		switch kv.Key {
		case "tokenizer.ggml.tokens":
			tokens, _ = kv.Value.([]string)
		case "tokenizer.ggml.scores":
			scores, _ = kv.Value.([]float32)
		case "tokenizer.ggml.token_type":
			types, _ = kv.Value.([]int32)
		}
	}
	if len(tokens) == 0 {
		return nil, 0, fmt.Errorf("synth: %s has no tokenizer.ggml.tokens", path)
	}
	if (scores != nil && len(scores) != len(tokens)) || (types != nil && len(types) != len(tokens)) {
		return nil, 0, fmt.Errorf("synth: %s: tokenizer arrays of different lengths", path)
	}
	// Unused pieces (type 5) never come out of encoding: no merge of real
	// pieces spells "<unused…>". The slices are copies, so the source's
	// mapping can be closed.
	tokens, scores, types = slices.Clone(tokens), slices.Clone(scores), slices.Clone(types)
	for n := len(tokens); n < vocab; n++ {
		tokens = append(tokens, fmt.Sprintf("<unused%d>", n))
		if scores != nil {
			scores = append(scores, -1e9)
		}
		if types != nil {
			types = append(types, 5)
		}
	}
	for i, kv := range kvs {
		switch kv.Key {
		case "tokenizer.ggml.tokens":
			kvs[i].Value = tokens
		case "tokenizer.ggml.scores":
			kvs[i].Value = scores
		case "tokenizer.ggml.token_type":
			kvs[i].Value = types
		}
	}
	return kvs, len(tokens), nil
}

type tensor struct {
	name     string
	out, in  int // rows, row length; in == 0: a vector of out
	experts  int // > 0: that many out×in matrices stacked, as llama.cpp stores experts
	constant bool
	f32      bool // kept in F32 whatever the dtype (a router, as llama.cpp keeps it)
}

// Write writes the model to path.
func Write(path string, s Shape, o Options) error {
	s.DType = strings.ToUpper(s.DType)
	if err := s.check(); err != nil {
		return err
	}
	if o.Std == 0 {
		o.Std = 0.02
	}
	tok, vocab, err := vocabulary(o.Vocab, s.Vocab)
	if err != nil {
		return err
	}
	s.Vocab = vocab
	if o.Name == "" {
		o.Name = strings.TrimSuffix(filepath.Base(path), ".gguf")
	}
	dt := ggmlTypes[s.DType]
	hd := s.Dim / s.Heads
	arch := "llama"
	if s.Arch != "" {
		arch = s.Arch
	}
	a := arch + "."
	kvs := []gguf.KV{
		{Key: "general.architecture", Value: arch},
		{Key: "general.name", Value: o.Name},
		{Key: "general.description", Value: fmt.Sprintf("random normal weights (std %g, seed %d) of a %s shape, for speed tests; the output is noise", o.Std, o.Seed, map[string]string{"llama": "Llama", "qwen3moe": "Qwen3-MoE"}[arch])},
		{Key: "general.file_type", Value: dt.fileType},
		{Key: a + "context_length", Value: uint32(s.Context)},
		{Key: a + "embedding_length", Value: uint32(s.Dim)},
		{Key: a + "block_count", Value: uint32(s.Layers)},
		{Key: a + "feed_forward_length", Value: uint32(s.FF)},
		{Key: a + "attention.head_count", Value: uint32(s.Heads)},
		{Key: a + "attention.head_count_kv", Value: uint32(s.KVHeads)},
		{Key: a + "rope.dimension_count", Value: uint32(hd)},
		{Key: a + "rope.freq_base", Value: float32(10000)},
		{Key: a + "attention.layer_norm_rms_epsilon", Value: float32(1e-5)},
		{Key: a + "vocab_size", Value: uint32(s.Vocab)},
	}
	if s.Experts > 0 {
		kvs = append(kvs, gguf.KV{Key: a + "expert_count", Value: uint32(s.Experts)},
			gguf.KV{Key: a + "expert_used_count", Value: uint32(s.ExpertsUsed)})
		if arch == "qwen3moe" {
			kvs = append(kvs, gguf.KV{Key: a + "expert_feed_forward_length", Value: uint32(s.FF)})
		}
	}
	kvs = append(kvs, tok...)

	plan := []tensor{{name: "token_embd.weight", out: s.Vocab, in: s.Dim}}
	for l := range s.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		plan = append(plan,
			tensor{name: p + "attn_norm.weight", out: s.Dim, constant: true},
			tensor{name: p + "attn_q.weight", out: s.Heads * hd, in: s.Dim},
			tensor{name: p + "attn_k.weight", out: s.KVHeads * hd, in: s.Dim},
			tensor{name: p + "attn_v.weight", out: s.KVHeads * hd, in: s.Dim},
			tensor{name: p + "attn_output.weight", out: s.Dim, in: s.Heads * hd},
			tensor{name: p + "ffn_norm.weight", out: s.Dim, constant: true})
		if arch == "qwen3moe" {
			plan = append(plan, tensor{name: p + "attn_q_norm.weight", out: hd, constant: true},
				tensor{name: p + "attn_k_norm.weight", out: hd, constant: true})
		}
		if s.Experts == 0 {
			plan = append(plan,
				tensor{name: p + "ffn_gate.weight", out: s.FF, in: s.Dim},
				tensor{name: p + "ffn_up.weight", out: s.FF, in: s.Dim},
				tensor{name: p + "ffn_down.weight", out: s.Dim, in: s.FF})
			continue
		}
		plan = append(plan,
			tensor{name: p + "ffn_gate_inp.weight", out: s.Experts, in: s.Dim, f32: true},
			tensor{name: p + "ffn_gate_exps.weight", out: s.FF, in: s.Dim, experts: s.Experts},
			tensor{name: p + "ffn_up_exps.weight", out: s.FF, in: s.Dim, experts: s.Experts},
			tensor{name: p + "ffn_down_exps.weight", out: s.Dim, in: s.FF, experts: s.Experts})
	}
	plan = append(plan, tensor{name: "output_norm.weight", out: s.Dim, constant: true},
		tensor{name: "output.weight", out: s.Vocab, in: s.Dim})

	infos := make([]gguf.TensorInfo, len(plan))
	for i, t := range plan {
		infos[i] = gguf.TensorInfo{Name: t.name, Dims: []int64{int64(t.out)}, Type: gguf.TypeF32}
		switch {
		case t.experts > 0:
			infos[i] = gguf.TensorInfo{Name: t.name, Dims: []int64{int64(t.in), int64(t.out), int64(t.experts)}, Type: dt.t}
		case t.in > 0 && t.f32:
			infos[i] = gguf.TensorInfo{Name: t.name, Dims: []int64{int64(t.in), int64(t.out)}, Type: gguf.TypeF32}
		case t.in > 0:
			infos[i] = gguf.TensorInfo{Name: t.name, Dims: []int64{int64(t.in), int64(t.out)}, Type: dt.t}
		}
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	err = gguf.Write(f, kvs, infos, func(i int, w io.Writer) error {
		t := plan[i]
		if t.constant {
			ones := make([]float32, t.out)
			for j := range ones {
				ones[j] = 1
			}
			raw := make([]byte, 4*t.out)
			kernels.EncodeRow(raw, ones, kernels.F32)
			_, err := w.Write(raw)
			return err
		}
		// Each tensor has its own stream, so a tensor's values do not
		// depend on the shape of those before it.
		rng := rand.New(rand.NewPCG(o.Seed, uint64(i)))
		k := dt.k
		if t.f32 {
			k = kernels.F32
		}
		total := t.out * max(1, t.experts)
		rows := max(1, (1<<20)/t.in)
		vals := make([]float32, rows*t.in)
		raw := make([]byte, k.RowBytes(rows*t.in))
		for r := 0; r < total; r += rows {
			n := min(rows, total-r) * t.in
			for j := range vals[:n] {
				vals[j] = float32(rng.NormFloat64() * o.Std)
			}
			b := raw[:k.RowBytes(n)]
			kernels.EncodeRow(b, vals[:n], k)
			if _, err := w.Write(b); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}
