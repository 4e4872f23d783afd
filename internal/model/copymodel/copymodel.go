// Package copymodel writes a Llama checkpoint whose weights are
// constructed, not trained, to copy its input: an induction circuit that,
// at position i holding tokens (a, b) at i-1 and i, finds an earlier
// position j where the same pair was followed by c and predicts c. A model
// of random weights never does that, and no trained model of the
// benchmark shapes is on this machine; this one echoes text, so
// speculative decoding's verification cost can be measured at a high
// accept rate on the real shapes. Only benchmarks and tests use it.
//
// The residual stream holds, from the embedding, a constant dimension d0
// and the current token's code (random ±1 per token id); layer 0's
// attention adds the codes of the tokens one and two positions back (heads
// whose RoPE scores peak at i-1 and i-2); layer 1's attention matches the
// current and previous codes against those at every earlier position and
// writes the matched position's own code into an output subspace, which
// is the only part the lm_head reads (a token's logit is its code's
// agreement with the heads' votes). Every other layer, and every FFN,
// adds zero.
package copymodel

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/batonlm/baton/internal/kernels"
)

// Shape is a Llama model's shape; the weights are written in DType (F32,
// F16 or BF16).
type Shape struct {
	Vocab, Dim, Layers, Heads, KVHeads, FF int
	DType                                  string
}

// Shapes of the benchmarks: the 134M llama (768x12) and TinyLlama 1.1B.
var (
	Shape134M = Shape{Vocab: 32000, Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, FF: 2048, DType: "F32"}
	Shape1B   = Shape{Vocab: 32000, Dim: 2048, Layers: 22, Heads: 32, KVHeads: 4, FF: 5632, DType: "F16"}
)

const (
	headDim = 64
	half    = headDim / 2
	// ropeTheta spreads the RoPE frequencies so that pairs 0..7 turn fast
	// (1 down to 3e-4 rad per position: together their score peaks at one
	// offset with no alias within 8192 positions) and pairs 8..31 turn
	// less than 1e-4 rad per position (near constant over a few hundred,
	// so a score there depends on content, not distance).
	ropeTheta = 1e16
	posPairs  = 8
	codeDims  = 128 // per subspace
	// posWeight is A² for each of the position pairs: the score of the
	// offset a head looks for beats every other by at least 0.515·8·A²/8
	// (the sum of 1-cos over the pairs, times 1/sqrt(head_dim)), about 20.
	posWeight = 320
	// matchWeight is B² for the content pairs: a full match of both codes
	// (48 dims) scores 48·B²/8 = 72, half a match about 36.
	matchWeight = 12
)

// Subspaces of the residual stream.
const (
	d0   = 0
	cur  = 1
	prev = cur + codeDims
	pp   = prev + codeDims
	out  = pp + codeDims
	used = out + codeDims
)

// codes are every token id's ±1 code for a seed: what its embedding
// carries and its lm_head row matches.
func codes(vocab int, seed uint64) [][]float32 {
	rng := rand.New(rand.NewPCG(seed, 0xc0de))
	c := make([][]float32, vocab)
	for t := range c {
		c[t] = make([]float32, codeDims)
		for k := range c[t] {
			c[t][k] = float32(2*int(rng.IntN(2)) - 1)
		}
	}
	return c
}

type tensor struct {
	name  string
	shape []int
	vals  []float32 // nil: all zeros
}

// Write writes config.json and model.safetensors for s into dir.
func Write(dir string, s Shape, seed uint64) error {
	if s.Dim < used || s.KVHeads < 4 || s.Heads%s.KVHeads != 0 {
		return fmt.Errorf("copymodel: shape %+v too small (needs hidden ≥ %d and 4 kv heads)", s, used)
	}
	dt, ok := map[string]kernels.DType{"F32": kernels.F32, "F16": kernels.F16, "BF16": kernels.BF16}[s.DType]
	if !ok {
		return fmt.Errorf("copymodel: dtype %q", s.DType)
	}
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "vocab_size": s.Vocab, "hidden_size": s.Dim,
		"num_hidden_layers": s.Layers, "num_attention_heads": s.Heads, "num_key_value_heads": s.KVHeads, "head_dim": headDim,
		"intermediate_size": s.FF, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": ropeTheta,
		"tie_word_embeddings": false, "hidden_act": "silu", "rope_scaling": nil,
		"torch_dtype":  map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[s.DType],
		"bos_token_id": 1, "eos_token_id": 2,
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		return err
	}
	return writeSafetensors(filepath.Join(dir, "model.safetensors"), tensors(s, seed), s.DType, dt)
}

func tensors(s Shape, seed uint64) []tensor {
	code := codes(s.Vocab, seed)
	D, qd, kvd, group := s.Dim, s.Heads*headDim, s.KVHeads*headDim, s.Heads/s.KVHeads
	freq := kernels.RoPE{Dim: headDim, Theta: ropeTheta}.Frequencies()

	embed := make([]float32, s.Vocab*D)
	lm := make([]float32, s.Vocab*D)
	for t := range s.Vocab {
		embed[t*D+d0] = 1
		copy(embed[t*D+cur:], code[t])
		copy(lm[t*D+out:], code[t])
	}
	ones := func(v float32) []float32 {
		w := make([]float32, D)
		for i := range w {
			w[i] = v
		}
		return w
	}
	ts := []tensor{{"model.embed_tokens.weight", []int{s.Vocab, D}, embed}}

	// Layer 0: kv heads 0,1 look one position back, 2,3 two; each carries
	// 64 dims of the current code (V) into prev or pp (o_proj, through the
	// group's first q head).
	q0, k0, v0, o0 := make([]float32, qd*D), make([]float32, kvd*D), make([]float32, kvd*D), make([]float32, D*qd)
	for g := range 4 {
		back, r := 1+g/2, g%2
		dst := prev
		if back == 2 {
			dst = pp
		}
		h := g * group
		a := float32(math.Sqrt(posWeight))
		for f := range posPairs {
			phi := float64(back) * freq[f]
			q0[(h*headDim+f)*D+d0] = a
			k0[(g*headDim+f)*D+d0] = a * float32(math.Cos(phi))
			k0[(g*headDim+f+half)*D+d0] = a * float32(math.Sin(phi))
		}
		for d := range headDim {
			v0[(g*headDim+d)*D+cur+r*headDim+d] = 1
			o0[(dst+r*headDim+d)*qd+h*headDim+d] = 1
		}
	}
	// Layer 1: every kv head matches its own 24-dim slice of the codes in
	// the slow pairs: q (current, previous) against k (prev, pp) of each
	// earlier position; V carries 64 dims of the matched position's
	// current code into out.
	q1, k1, v1, o1 := make([]float32, qd*D), make([]float32, kvd*D), make([]float32, kvd*D), make([]float32, D*qd)
	var slow []int
	for f := posPairs; f < half; f++ {
		slow = append(slow, f, f+half)
	}
	m := len(slow) / 2
	bw := float32(math.Sqrt(matchWeight))
	for g := range s.KVHeads {
		off := g * codeDims / s.KVHeads
		h := g * group
		for u := range m {
			c := (off + u) % codeDims
			q1[(h*headDim+slow[u])*D+cur+c] = bw
			k1[(g*headDim+slow[u])*D+prev+c] = bw
			q1[(h*headDim+slow[m+u])*D+prev+c] = bw
			k1[(g*headDim+slow[m+u])*D+pp+c] = bw
		}
		for d := range headDim {
			c := (g*headDim + d) % codeDims
			v1[(g*headDim+d)*D+cur+c] = 1
			o1[(out+c)*qd+h*headDim+d] = 1
		}
	}
	// The norms before attention bring the codes back to ±1: RMSNorm
	// divides by the rms over all of the hidden size, of which layer 0
	// sees d0 and cur, layer 1 also prev and pp.
	n0 := float32(math.Sqrt(float64(1+codeDims) / float64(D)))
	n1 := float32(math.Sqrt(float64(1+3*codeDims) / float64(D)))
	for l := range s.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		norm := ones(1)
		var q, k, v, o []float32
		switch l {
		case 0:
			norm, q, k, v, o = ones(n0), q0, k0, v0, o0
		case 1:
			norm, q, k, v, o = ones(n1), q1, k1, v1, o1
		}
		ts = append(ts,
			tensor{p + "input_layernorm.weight", []int{D}, norm},
			tensor{p + "self_attn.q_proj.weight", []int{qd, D}, q},
			tensor{p + "self_attn.k_proj.weight", []int{kvd, D}, k},
			tensor{p + "self_attn.v_proj.weight", []int{kvd, D}, v},
			tensor{p + "self_attn.o_proj.weight", []int{D, qd}, o},
			tensor{p + "post_attention_layernorm.weight", []int{D}, ones(1)},
			tensor{p + "mlp.gate_proj.weight", []int{s.FF, D}, nil},
			tensor{p + "mlp.up_proj.weight", []int{s.FF, D}, nil},
			tensor{p + "mlp.down_proj.weight", []int{D, s.FF}, nil})
	}
	return append(ts, tensor{"model.norm.weight", []int{D}, ones(1)}, tensor{"lm_head.weight", []int{s.Vocab, D}, lm})
}

// writeSafetensors streams the tensors to path, so a 1.1B model is never
// whole in memory.
func writeSafetensors(path string, ts []tensor, dtName string, dt kernels.DType) error {
	hdr := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	off := 0
	for _, t := range ts {
		n := 1
		for _, d := range t.shape {
			n *= d
		}
		size := dt.RowBytes(n)
		hdr[t.name] = map[string]any{"dtype": dtName, "shape": t.shape, "data_offsets": []int{off, off + size}}
		off += size
	}
	hb, err := json.Marshal(hdr)
	if err != nil {
		return err
	}
	for len(hb)%8 != 0 {
		hb = append(hb, ' ')
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	_ = binary.Write(w, binary.LittleEndian, uint64(len(hb)))
	_, _ = w.Write(hb)
	zero := make([]byte, 1<<20)
	for _, t := range ts {
		n := 1
		for _, d := range t.shape {
			n *= d
		}
		if t.vals == nil {
			for left := dt.RowBytes(n); left > 0; left -= len(zero) {
				_, _ = w.Write(zero[:min(left, len(zero))])
			}
			continue
		}
		raw := make([]byte, dt.RowBytes(n))
		kernels.EncodeRow(raw, t.vals, dt)
		_, _ = w.Write(raw)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
