// Package model holds the Llama-family model: its configuration, its
// weights (GGUF or deterministic dummy) and the forward pass, written once
// against kernels.Backend.
package model

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// Config is the shape of a model and the constants of its forward pass.
type Config struct {
	Arch          string // llama, mistral, qwen2
	Name          string
	Vocab         int
	Dim           int
	Layers        int
	Heads         int
	KVHeads       int
	HeadDim       int
	FF            int
	ContextLength int
	NormEps       float32
	RoPE          kernels.RoPE
	QKVBias       bool
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
	default:
		return c, fmt.Errorf("model: unsupported architecture %q (llama, mistral and qwen2 are)", arch)
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

// hfConfig is the subset of a Hugging Face config.json that gives a shape.
type hfConfig struct {
	Architectures []string `json:"architectures"`
	Vocab         int      `json:"vocab_size"`
	Hidden        int      `json:"hidden_size"`
	Layers        int      `json:"num_hidden_layers"`
	Heads         int      `json:"num_attention_heads"`
	KVHeads       int      `json:"num_key_value_heads"`
	HeadDim       int      `json:"head_dim"`
	FF            int      `json:"intermediate_size"`
	MaxPos        int      `json:"max_position_embeddings"`
	Eps           float32  `json:"rms_norm_eps"`
	Theta         float32  `json:"rope_theta"`
}

// ConfigFromJSON reads a model shape from a Hugging Face style config.json
// (used with --load-format dummy, for benchmarks of shapes that have no weights here).
func ConfigFromJSON(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var h hfConfig
	if err := json.Unmarshal(b, &h); err != nil {
		return Config{}, fmt.Errorf("model: %s: %w", path, err)
	}
	c := Config{Arch: "llama", Name: "dummy", Vocab: h.Vocab, Dim: h.Hidden, Layers: h.Layers, Heads: h.Heads,
		KVHeads: h.KVHeads, HeadDim: h.HeadDim, FF: h.FF, ContextLength: h.MaxPos, NormEps: h.Eps}
	if len(h.Architectures) > 0 && h.Architectures[0] == "Qwen2ForCausalLM" {
		c.Arch, c.QKVBias, c.RoPE.NeoX = "qwen2", true, true
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 && c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	if c.NormEps == 0 {
		c.NormEps = 1e-5
	}
	if c.ContextLength == 0 {
		c.ContextLength = 2048
	}
	c.RoPE.Dim, c.RoPE.Theta = c.HeadDim, h.Theta
	if c.RoPE.Theta == 0 {
		c.RoPE.Theta = 10000
	}
	return c, c.Validate()
}
