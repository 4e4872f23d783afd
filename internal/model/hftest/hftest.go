// Package hftest writes small Hugging Face checkpoints (config.json and
// model.safetensors) with random weights, for tests of the loader and of
// the processes that serve them. Only tests use it.
package hftest

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// Spec is a small model of one of the supported architectures.
type Spec struct {
	Arch                                            string // config.json architecture, e.g. Qwen3ForCausalLM
	Vocab, Dim, Layers, Heads, KVHeads, HeadDim, FF int
	Tie                                             bool
	DType                                           string // F32, F16 or BF16
	// Experts and ExpertsUsed make a mixture of experts
	// (Qwen3MoeForCausalLM, MixtralForCausalLM) whose experts' FFN size is
	// FF; NormTopK is Qwen3-MoE's norm_topk_prob.
	Experts, ExpertsUsed int
	NormTopK             bool
}

// QKNorm says the architecture normalises q and k per head (Qwen3).
func (s Spec) QKNorm() bool { return s.Arch == "Qwen3ForCausalLM" || s.Arch == "Qwen3MoeForCausalLM" }

// Router is layer l's router tensor, for a mixture of experts.
func (s Spec) Router(l int) string {
	if s.Arch == "MixtralForCausalLM" {
		return fmt.Sprintf("model.layers.%d.block_sparse_moe.gate.weight", l)
	}
	return fmt.Sprintf("model.layers.%d.mlp.gate.weight", l)
}

// Expert is the tensor of layer l's expert e for which of gate, up and
// down.
func (s Spec) Expert(l, e int, which string) string {
	if s.Arch == "MixtralForCausalLM" {
		w := map[string]string{"gate": "w1", "up": "w3", "down": "w2"}[which]
		return fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, w)
	}
	return fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, which)
}

// QKVBias says the architecture has q/k/v biases (Qwen2).
func (s Spec) QKVBias() bool { return s.Arch == "Qwen2ForCausalLM" }

// ModelType is config.json's model_type for the architecture.
func (s Spec) ModelType() string {
	return map[string]string{"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
		"Qwen3MoeForCausalLM": "qwen3_moe", "MixtralForCausalLM": "mixtral"}[s.Arch]
}

// Config is the model's config.json.
func (s Spec) Config() map[string]any {
	c := s.denseConfig()
	switch s.Arch {
	case "Qwen3MoeForCausalLM":
		// intermediate_size is a dense FFN's, which no layer has.
		c["intermediate_size"], c["moe_intermediate_size"] = 3*s.FF, s.FF
		c["num_experts"], c["num_experts_per_tok"], c["norm_topk_prob"] = s.Experts, s.ExpertsUsed, s.NormTopK
		c["decoder_sparse_step"], c["mlp_only_layers"] = 1, []int{}
	case "MixtralForCausalLM":
		c["num_local_experts"], c["num_experts_per_tok"], c["sliding_window"] = s.Experts, s.ExpertsUsed, nil
	}
	return c
}

func (s Spec) denseConfig() map[string]any {
	return map[string]any{
		"architectures": []string{s.Arch}, "model_type": s.ModelType(), "vocab_size": s.Vocab, "hidden_size": s.Dim,
		"num_hidden_layers": s.Layers, "num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads, "head_dim": s.HeadDim,
		"intermediate_size": s.FF, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
		"tie_word_embeddings": s.Tie, "hidden_act": "silu", "attention_bias": s.QKVBias(), "rope_scaling": nil,
		"torch_dtype":  map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[s.DType],
		"bos_token_id": 151643, "eos_token_id": 151645,
	}
}

// Write writes config.json and model.safetensors into dir and returns
// every tensor's values as stored (rounded to the dtype).
func Write(tb testing.TB, dir string, s Spec, seed uint64) map[string][]float32 {
	tb.Helper()
	WriteJSON(tb, filepath.Join(dir, "config.json"), s.Config())
	rng := rand.New(rand.NewPCG(seed, 7))
	dt := dtypes[s.DType]
	vals := map[string][]float32{}
	var tensors []Tensor
	add := func(name string, shape []int64, center, amp float32) {
		n := 1
		for _, d := range shape {
			n *= int(d)
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = center + amp*(2*rng.Float32()-1)
		}
		raw := make([]byte, dt.RowBytes(n))
		kernels.EncodeRow(raw, v, dt)
		m := kernels.Matrix{DType: dt, Rows: 1, Cols: n, Data: raw}
		m.Row(0, v) // what the file holds
		vals[name] = v
		tensors = append(tensors, Tensor{Name: name, DType: s.DType, Shape: shape, Raw: raw})
	}
	vec := func(name string, n int, center, amp float32) { add(name, []int64{int64(n)}, center, amp) }
	mat := func(name string, rows, cols int) {
		add(name, []int64{int64(rows), int64(cols)}, 0, float32(1/math.Sqrt(float64(cols))))
	}
	qd, kvd := s.Heads*s.HeadDim, s.KVHeads*s.HeadDim
	mat("model.embed_tokens.weight", s.Vocab, s.Dim)
	vec("model.norm.weight", s.Dim, 1, 0.2)
	if !s.Tie {
		mat("lm_head.weight", s.Vocab, s.Dim)
	}
	for l := 0; l < s.Layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		vec(p+"input_layernorm.weight", s.Dim, 1, 0.2)
		vec(p+"post_attention_layernorm.weight", s.Dim, 1, 0.2)
		mat(p+"self_attn.q_proj.weight", qd, s.Dim)
		mat(p+"self_attn.k_proj.weight", kvd, s.Dim)
		mat(p+"self_attn.v_proj.weight", kvd, s.Dim)
		mat(p+"self_attn.o_proj.weight", s.Dim, qd)
		if s.Experts == 0 {
			mat(p+"mlp.gate_proj.weight", s.FF, s.Dim)
			mat(p+"mlp.up_proj.weight", s.FF, s.Dim)
			mat(p+"mlp.down_proj.weight", s.Dim, s.FF)
		} else {
			// A router with a wide spread, so that the choice of experts
			// is clear of rounding and a wrong choice shows.
			add(s.Router(l), []int64{int64(s.Experts), int64(s.Dim)}, 0, float32(4/math.Sqrt(float64(s.Dim))))
			for e := range s.Experts {
				mat(s.Expert(l, e, "gate"), s.FF, s.Dim)
				mat(s.Expert(l, e, "up"), s.FF, s.Dim)
				mat(s.Expert(l, e, "down"), s.Dim, s.FF)
			}
		}
		if s.QKVBias() {
			vec(p+"self_attn.q_proj.bias", qd, 0, 0.5)
			vec(p+"self_attn.k_proj.bias", kvd, 0, 0.5)
			vec(p+"self_attn.v_proj.bias", kvd, 0, 0.5)
		}
		if s.QKNorm() {
			vec(p+"self_attn.q_norm.weight", s.HeadDim, 1, 0.5)
			vec(p+"self_attn.k_norm.weight", s.HeadDim, 1, 0.5)
		}
	}
	WriteSafetensors(tb, filepath.Join(dir, "model.safetensors"), tensors, map[string]string{"format": "pt"})
	return vals
}

var dtypes = map[string]kernels.DType{"F32": kernels.F32, "F16": kernels.F16, "BF16": kernels.BF16}

// Tensor is one tensor of a safetensors file: Vals stored in DType, or Raw
// as is when set (any DType string then).
type Tensor struct {
	Name  string
	DType string
	Shape []int64
	Vals  []float32
	Raw   []byte
}

// EncodeSafetensors lays tensors out in the order given, contiguously,
// with the header padded to a multiple of 8 as the reference writer does.
func EncodeSafetensors(tensors []Tensor, meta map[string]string) []byte {
	var header bytes.Buffer
	header.WriteByte('{')
	if meta != nil {
		mb, _ := json.Marshal(meta)
		fmt.Fprintf(&header, `"__metadata__":%s`, mb)
	}
	var data []byte
	for i, t := range tensors {
		raw := t.Raw
		if raw == nil {
			dt := dtypes[t.DType]
			raw = make([]byte, dt.RowBytes(len(t.Vals)))
			kernels.EncodeRow(raw, t.Vals, dt)
		}
		if i > 0 || meta != nil {
			header.WriteByte(',')
		}
		shape, _ := json.Marshal(t.Shape)
		fmt.Fprintf(&header, `%q:{"dtype":%q,"shape":%s,"data_offsets":[%d,%d]}`, t.Name, t.DType, shape, len(data), len(data)+len(raw))
		data = append(data, raw...)
	}
	header.WriteByte('}')
	for header.Len()%8 != 0 {
		header.WriteByte(' ')
	}
	out := binary.LittleEndian.AppendUint64(nil, uint64(header.Len()))
	out = append(out, header.Bytes()...)
	return append(out, data...)
}

// WriteSafetensors writes EncodeSafetensors' file to path.
func WriteSafetensors(tb testing.TB, path string, tensors []Tensor, meta map[string]string) {
	tb.Helper()
	if err := os.WriteFile(path, EncodeSafetensors(tensors, meta), 0o644); err != nil {
		tb.Fatal(err)
	}
}

// WriteJSON writes v, indented, to path.
func WriteJSON(tb testing.TB, path string, v any) {
	tb.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		tb.Fatal(err)
	}
}
