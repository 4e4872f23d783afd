// Package model holds the Llama-family model (Llama, Mistral, Qwen2,
// Qwen3, and the mixtures of experts Mixtral and Qwen3-MoE): its configuration, its weights (GGUF, a Hugging Face directory
// of safetensors, or deterministic dummy) and the forward pass, written
// once against kernels.Backend.
package model

import (
	"fmt"
	"os"
	"strings"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// Config is the shape of a model and the constants of its forward pass.
type Config struct {
	Arch    string // llama, mistral, qwen2, qwen3, qwen3moe, mixtral
	Name    string
	Vocab   int
	Dim     int
	Layers  int
	Heads   int
	KVHeads int
	HeadDim int
	// FF is the feed-forward hidden size: each expert's in a mixture of
	// experts, which is the size a token's FFN work and the scratch go by.
	FF            int
	ContextLength int
	NormEps       float32
	RoPE          kernels.RoPE
	QKVBias       bool // q, k and v projections have biases (Qwen2)
	QKNorm        bool // per-head RMSNorm of q and k before RoPE (Qwen3)
	// TieEmbeddings says the output projection is the embedding table
	// (dummy weights follow it; loaders tie when the file has no output).
	TieEmbeddings bool
	// Experts is the number of FFN experts of a mixture of experts (0: a
	// dense model); each token runs ExpertsUsed of them, chosen by the
	// layer's router. ExpertNorm says the chosen experts' weights are a
	// softmax over the chosen alone (Mixtral, and Qwen3-MoE with
	// norm_topk_prob) rather than their share of a softmax over all.
	Experts, ExpertsUsed int
	ExpertNorm           bool
}

// Validate checks the shape is one the forward pass can run.
func (c *Config) Validate() error {
	switch {
	case c.Vocab <= 0 || c.Dim <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.FF <= 0:
		return fmt.Errorf("model: incomplete config %+v", *c)
	case c.KVHeads <= 0 || c.Heads%c.KVHeads != 0:
		return fmt.Errorf("model: %d heads cannot be grouped over %d KV heads", c.Heads, c.KVHeads)
	case c.HeadDim <= 0 || c.RoPE.Dim <= 0 || c.RoPE.Dim > c.HeadDim || c.RoPE.Dim%2 != 0:
		return fmt.Errorf("model: head dim %d with rotary dim %d", c.HeadDim, c.RoPE.Dim)
	case c.ContextLength <= 0:
		return fmt.Errorf("model: context length %d", c.ContextLength)
	case c.Experts < 0 || c.Experts > 0 && (c.ExpertsUsed <= 0 || c.ExpertsUsed > c.Experts):
		return fmt.Errorf("model: %d experts with %d used per token", c.Experts, c.ExpertsUsed)
	case c.Experts == 0 && c.ExpertsUsed != 0:
		return fmt.Errorf("model: %d experts used per token of a model without experts", c.ExpertsUsed)
	}
	return nil
}

// KVRowFloats is the number of floats one token's K (or V) takes per layer.
func (c *Config) KVRowFloats() int { return c.KVHeads * c.HeadDim }

// KVBytesPerToken is the KV cache cost of one token over all layers (f32 K and V).
func (c *Config) KVBytesPerToken() int { return c.Layers * 2 * c.KVRowFloats() * 4 }

// ConfigFromGGUF reads the model shape from GGUF metadata.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	arch, _ := f.String("general.architecture")
	c := Config{Arch: arch}
	c.Name, _ = f.String("general.name")
	switch arch {
	case "llama", "mistral":
	case "qwen2":
		c.RoPE.NeoX = true
		c.QKVBias = true
	case "qwen3", "qwen3moe":
		c.RoPE.NeoX = true
		c.QKNorm = true
	default:
		if why := unsupportedGGUFArchs[arch]; why != "" {
			return c, fmt.Errorf("model: architecture %q is not supported: %s", arch, why)
		}
		return c, fmt.Errorf("model: unsupported architecture %q (llama, mistral, qwen2, qwen3 and qwen3moe are)", arch)
	}
	u := func(key string, dst *int, required bool) error {
		v, ok := f.Uint(arch + "." + key)
		if !ok {
			if required {
				return fmt.Errorf("model: GGUF lacks %s.%s", arch, key)
			}
			return nil
		}
		if v > 1<<31 {
			return fmt.Errorf("model: %s.%s = %d is implausible", arch, key, v)
		}
		*dst = int(v)
		return nil
	}
	for _, k := range []struct {
		key string
		dst *int
	}{{"embedding_length", &c.Dim}, {"block_count", &c.Layers}, {"attention.head_count", &c.Heads}, {"feed_forward_length", &c.FF}, {"context_length", &c.ContextLength}} {
		if err := u(k.key, k.dst, true); err != nil {
			return c, err
		}
	}
	if err := moeFromGGUF(f, arch, &c, u); err != nil {
		return c, err
	}
	c.KVHeads = c.Heads
	_ = u("attention.head_count_kv", &c.KVHeads, false)
	if c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	_ = u("attention.key_length", &c.HeadDim, false)
	c.RoPE.Dim = c.HeadDim
	_ = u("rope.dimension_count", &c.RoPE.Dim, false)
	_ = u("vocab_size", &c.Vocab, false)
	if c.Vocab == 0 {
		if toks, ok := f.Strings("tokenizer.ggml.tokens"); ok {
			c.Vocab = len(toks)
		}
	}
	c.RoPE.Theta = 10000
	if v, ok := f.Float(arch + ".rope.freq_base"); ok {
		c.RoPE.Theta = float32(v)
	}
	c.NormEps = 1e-5
	if v, ok := f.Float(arch + ".attention.layer_norm_rms_epsilon"); ok {
		c.NormEps = float32(v)
	}
	if typ, _ := f.String(arch + ".rope.scaling.type"); typ == "linear" {
		if v, ok := f.Float(arch + ".rope.scaling.factor"); ok && v > 0 {
			c.RoPE.PosScale = float32(1 / v)
		}
	}
	return c, c.Validate()
}

// unsupportedGGUFArchs are mixtures of experts whose GGUF architecture
// names what baton's forward pass lacks, so that refusing one says why.
var unsupportedGGUFArchs = map[string]string{
	"qwen2moe":  "it has shared experts, which baton does not run",
	"deepseek":  "it has shared experts, which baton does not run",
	"deepseek2": "it has MLA attention, shared experts and expert groups, which baton does not run",
	"gpt-oss":   "it has attention sinks, sliding-window layers and biased experts, which baton does not run",
}

// moeFromGGUF reads the expert metadata of a mixture of experts (Mixtral is
// a llama file with expert_count set) and refuses layouts the forward pass
// does not run, naming them, rather than serving them wrong.
func moeFromGGUF(f *gguf.File, arch string, c *Config, u func(string, *int, bool) error) error {
	if err := u("expert_count", &c.Experts, arch == "qwen3moe"); err != nil {
		return err
	}
	if c.Experts == 0 {
		return nil
	}
	if err := u("expert_used_count", &c.ExpertsUsed, true); err != nil {
		return err
	}
	// Mixtral's files give the experts' size as feed_forward_length;
	// qwen3moe's give the dense size there and the experts' apart.
	if err := u("expert_feed_forward_length", &c.FF, arch == "qwen3moe"); err != nil {
		return err
	}
	// llama.cpp renormalises the chosen experts' weights for both
	// architectures unless the file says otherwise.
	c.ExpertNorm = true
	if v, ok := f.Bool(arch + ".expert_weights_norm"); ok {
		c.ExpertNorm = v
	}
	var missing []string
	if v, ok := f.Uint(arch + ".expert_shared_count"); ok && v > 0 {
		missing = append(missing, fmt.Sprintf("shared experts (%s.expert_shared_count = %d)", arch, v))
	}
	if v, ok := f.Uint(arch + ".expert_group_count"); ok && v > 1 {
		missing = append(missing, fmt.Sprintf("expert groups (%s.expert_group_count = %d)", arch, v))
	}
	if _, ok := f.Uint(arch + ".attention.kv_lora_rank"); ok {
		missing = append(missing, "MLA attention ("+arch+".attention.kv_lora_rank)")
	}
	// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX is 1; sigmoid
	// gating (2) scores experts otherwise.
	if v, ok := f.Uint(arch + ".expert_gating_func"); ok && v != 1 {
		missing = append(missing, fmt.Sprintf("expert gating function %d (softmax, 1, is supported)", v))
	}
	if v, ok := f.Float(arch + ".expert_weights_scale"); ok && v != 1 && v != 0 {
		missing = append(missing, fmt.Sprintf("scaled expert weights (%s.expert_weights_scale = %g)", arch, v))
	}
	if f.HasTensor("blk.0.ffn_gate_inp_shexp.weight") || f.HasTensor("blk.0.ffn_up_shexp.weight") {
		missing = append(missing, "shared experts (blk.N.ffn_*_shexp tensors)")
	}
	if f.HasTensor("blk.0.ffn_gate.0.weight") {
		missing = append(missing, "per-expert 2-D tensors (blk.N.ffn_gate.E.weight, an old Mixtral layout: convert again with a current llama.cpp)")
	}
	if len(missing) > 0 {
		return fmt.Errorf("model: this %s mixture of experts needs what baton does not run: %s", arch, strings.Join(missing, "; "))
	}
	return nil
}

// ConfigFromJSON reads a model shape from a Hugging Face config.json. It
// is lenient, as benchmarks of --load-format dummy want: an architecture it
// does not know is run as a Llama of the same shape, and RoPE scaling it
// cannot apply is ignored. Loading real weights uses the strict reading.
func ConfigFromJSON(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	c, err := parseHFConfig(b, false)
	if err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	if c.Name == "" {
		c.Name = "dummy"
	}
	return c, nil
}
