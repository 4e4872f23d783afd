// Package model holds the Llama-family model (Llama, Mistral, Qwen2,
// Qwen3): its configuration, its weights (GGUF, a Hugging Face directory
// of safetensors, or deterministic dummy) and the forward pass, written
// once against kernels.Backend.
package model

import (
	"fmt"
	"os"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/kernels"
)

// Config is the shape of a model and the constants of its forward pass.
type Config struct {
	Arch          string // llama, mistral, qwen2, qwen3
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
	QKVBias       bool // q, k and v projections have biases (Qwen2)
	QKNorm        bool // per-head RMSNorm of q and k before RoPE (Qwen3)
	// TieEmbeddings says the output projection is the embedding table
	// (dummy weights follow it; loaders tie when the file has no output).
	TieEmbeddings bool
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
	case "qwen3":
		c.RoPE.NeoX = true
		c.QKNorm = true
	default:
		return c, fmt.Errorf("model: unsupported architecture %q (llama, mistral, qwen2 and qwen3 are)", arch)
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
