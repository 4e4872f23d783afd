package model

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// quantConfig is the small llama the quantised-model tests run.
var quantConfig = Config{Arch: "llama", Vocab: 512, Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 64, FF: 512,
	ContextLength: 64, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 10000}}

// quantWeights is quantConfig's dummy weights in the formats pick gives.
func quantWeights(t *testing.T, pick func(kind string) kernels.DType) *Weights {
	t.Helper()
	c := quantConfig
	w, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	w.Requantize(pick)
	return w
}

// prefillBatch is plen prompt tokens from position 0 for each of nseq
// sequences, over tables of 4-token pages.
func prefillBatch(c *Config, tables [][]int32, nseq, plen int) *Batch {
	b := &Batch{}
	for s := 0; s < nseq; s++ {
		q0 := len(b.Tokens)
		for p := 0; p < plen; p++ {
			b.Tokens = append(b.Tokens, int32((p*37+s*11+5)%c.Vocab))
			b.Positions = append(b.Positions, int32(p))
			b.Slots = append(b.Slots, tables[s][p/4]*4+int32(p%4))
		}
		b.Seqs = append(b.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: q0, QLen: plen, KVLen: plen})
	}
	return b
}

// TestQuantizedModel runs a small llama whose weights mix the ggml block
// formats the way quantised GGUF files do (Q4_K with attn_v, ffn_down and
// the output in Q6_K, as in a Q4_K_M file; Q5_K_M, Q3_K_M and Q2_K-style mixes;
// and one with the 32-element formats) on the cpu backend and on the reference, which dequantises
// every row and multiplies in float64. A prefill of 32 sequences on the
// float gemm (dequantised tiles) agrees closely; a decode step of one
// (activations quantised to 8 bits for integer dot products), and the
// prefill where the backend has the int8 gemm for the K formats, within
// what that quantisation costs.
func TestQuantizedModel(t *testing.T) {
	t.Setenv("BATON_CPU_VNNI", "0")
	float := cpu.New(2)
	os.Unsetenv("BATON_CPU_VNNI")
	dflt := cpu.New(2)
	intPrefill := strings.Contains(dflt.Features(), "int8 gemm")
	if !intPrefill {
		t.Log("no int8 gemm on this CPU: the prefill is on the float gemm for both cpu backends")
	}
	c := quantConfig
	mixes := map[string]func(string) kernels.DType{
		"q4_k_m": Q4KM,
		"q5_k_m": func(kind string) kernels.DType {
			if kind == "ffn_down" || kind == "output" {
				return kernels.Q6_K
			}
			return kernels.Q5_K
		},
		"q3_k_m": func(kind string) kernels.DType {
			switch kind {
			case "attn_v", "attn_output":
				return kernels.Q5_K
			case "ffn_down":
				return kernels.Q4_K
			case "output":
				return kernels.Q6_K
			}
			return kernels.Q3_K
		},
		"q2_k": func(kind string) kernels.DType {
			switch kind {
			case "attn_v", "ffn_down":
				return kernels.Q3_K
			case "output":
				return kernels.Q6_K
			}
			return kernels.Q2_K
		},
		"legacy": func(kind string) kernels.DType {
			return map[string]kernels.DType{"attn_q": kernels.Q4_0, "attn_k": kernels.Q4_1, "attn_v": kernels.Q5_0,
				"attn_output": kernels.Q5_1, "ffn_gate": kernels.Q4_0, "ffn_up": kernels.Q5_1, "ffn_down": kernels.Q4_1,
				"token_embd": kernels.Q5_0, "output": kernels.Q8_0}[kind]
		},
	}
	for name, pick := range mixes {
		w := quantWeights(t, pick)
		models := []*Model{New(c, w, ref.New()), New(c, w, float), New(c, w, dflt)}
		const plen = 7
		var logits [3][2][]float32 // [backend][prefill, decode]
		for bi, m := range models {
			// 32 sequences, so that even the output projection of the
			// prefill (one row per sequence) takes the float path (the K
			// formats use integer dot products below 32 rows).
			const nseq = 32
			kv, tables := benchKV(&c, nseq, plen+1, 4)
			pre := prefillBatch(&c, tables, nseq, plen)
			out, err := m.Forward(pre, kv)
			if err != nil {
				t.Fatal(err)
			}
			logits[bi][0] = append([]float32(nil), out...)
			dec := &Batch{Tokens: []int32{11}, Positions: []int32{plen}, Slots: []int32{tables[0][plen/4]*4 + plen%4},
				Seqs: []kernels.AttnSeq{{Pages: tables[0], QLen: 1, KVLen: plen + 1}}}
			out, err = m.Forward(dec, kv)
			if err != nil {
				t.Fatal(err)
			}
			logits[bi][1] = append([]float32(nil), out...)
		}
		for bi, bname := range []string{"", "float gemm", "default"} {
			if bi == 0 {
				continue
			}
			for step, tol := range []float64{2e-5, 3e-2} {
				if bi == 2 && intPrefill && step == 0 {
					tol = 3e-2
				}
				want, got := logits[0][step], logits[bi][step]
				var scale, worst float64
				for _, v := range want {
					scale = max(scale, math.Abs(float64(v)))
				}
				for i := range want {
					worst = max(worst, math.Abs(float64(got[i]-want[i])))
				}
				what := fmt.Sprintf("%s %s [%s]", name, []string{"prefill", "decode"}[step], bname)
				if !(worst <= tol*scale) || scale == 0 {
					t.Errorf("%s: logits differ from the reference by up to %g (largest logit %g, tolerance %g)",
						what, worst, scale, tol*scale)
				}
				t.Logf("%s: worst |diff| %.3g of largest logit %.3g", what, worst, scale)
			}
		}
	}
}

// ggmlType is the GGUF type id of a kernels dtype.
var ggmlType = map[kernels.DType]uint32{kernels.F32: 0, kernels.F16: 1, kernels.Q4_0: 2, kernels.Q4_1: 3, kernels.Q5_0: 6,
	kernels.Q5_1: 7, kernels.Q8_0: 8, kernels.Q2_K: 10, kernels.Q3_K: 11, kernels.Q4_K: 12, kernels.Q5_K: 13, kernels.Q6_K: 14, kernels.BF16: 30}

// writeGGUF writes a GGUF of c.Arch (version 3, no tokenizer) holding w,
// with the Q/K/V biases (qwen2) and the per-head Q/K norms (qwen3) where w
// has them.
func writeGGUF(t *testing.T, path string, c Config, w *Weights) {
	t.Helper()
	arch := c.Arch
	var hdr, data bytes.Buffer
	le := binary.LittleEndian
	str := func(b *bytes.Buffer, s string) {
		_ = binary.Write(b, le, uint64(len(s)))
		b.WriteString(s)
	}
	type kv struct {
		key string
		typ uint32 // 4 u32, 6 f32, 8 string
		val any
	}
	kvs := []kv{{"general.architecture", 8, arch}, {"general.name", 8, "quant-test"},
		{arch + ".embedding_length", 4, uint32(c.Dim)}, {arch + ".block_count", 4, uint32(c.Layers)},
		{arch + ".attention.head_count", 4, uint32(c.Heads)}, {arch + ".attention.head_count_kv", 4, uint32(c.KVHeads)},
		{arch + ".feed_forward_length", 4, uint32(c.FF)}, {arch + ".context_length", 4, uint32(c.ContextLength)},
		{arch + ".vocab_size", 4, uint32(c.Vocab)}, {arch + ".rope.freq_base", 6, c.RoPE.Theta},
		{arch + ".attention.layer_norm_rms_epsilon", 6, c.NormEps}}
	type tensor struct {
		name string
		dims []uint64
		typ  uint32
		raw  []byte
	}
	var ts []tensor
	mat := func(name string, m *kernels.Matrix) {
		ts = append(ts, tensor{name, []uint64{uint64(m.Cols), uint64(m.Rows)}, ggmlType[m.DType], m.Data})
	}
	vec := func(name string, v []float32) {
		raw := make([]byte, 4*len(v))
		for i, f := range v {
			le.PutUint32(raw[4*i:], math.Float32bits(f))
		}
		ts = append(ts, tensor{name, []uint64{uint64(len(v))}, 0, raw})
	}
	mat("token_embd.weight", w.Embed)
	vec("output_norm.weight", w.OutNorm)
	mat("output.weight", w.Output)
	for i, ly := range w.Layers {
		p := fmt.Sprintf("blk.%d.", i)
		vec(p+"attn_norm.weight", ly.AttnNorm)
		vec(p+"ffn_norm.weight", ly.FFNNorm)
		mat(p+"attn_q.weight", ly.Q)
		mat(p+"attn_k.weight", ly.K)
		mat(p+"attn_v.weight", ly.V)
		mat(p+"attn_output.weight", ly.O)
		mat(p+"ffn_gate.weight", ly.Gate)
		mat(p+"ffn_up.weight", ly.Up)
		mat(p+"ffn_down.weight", ly.Down)
		for _, b := range []struct {
			name string
			v    []float32
		}{{"attn_q.bias", ly.QBias}, {"attn_k.bias", ly.KBias}, {"attn_v.bias", ly.VBias},
			{"attn_q_norm.weight", ly.QNorm}, {"attn_k_norm.weight", ly.KNorm}} {
			if b.v != nil {
				vec(p+b.name, b.v)
			}
		}
	}
	hdr.WriteString("GGUF")
	_ = binary.Write(&hdr, le, uint32(3))
	_ = binary.Write(&hdr, le, uint64(len(ts)))
	_ = binary.Write(&hdr, le, uint64(len(kvs)))
	for _, k := range kvs {
		str(&hdr, k.key)
		_ = binary.Write(&hdr, le, k.typ)
		switch v := k.val.(type) {
		case string:
			str(&hdr, v)
		default:
			_ = binary.Write(&hdr, le, v)
		}
	}
	for _, tn := range ts {
		for data.Len()%32 != 0 {
			data.WriteByte(0)
		}
		str(&hdr, tn.name)
		_ = binary.Write(&hdr, le, uint32(len(tn.dims)))
		for _, d := range tn.dims {
			_ = binary.Write(&hdr, le, d)
		}
		_ = binary.Write(&hdr, le, tn.typ)
		_ = binary.Write(&hdr, le, uint64(data.Len()))
		data.Write(tn.raw)
	}
	for hdr.Len()%32 != 0 {
		hdr.WriteByte(0)
	}
	if err := os.WriteFile(path, append(hdr.Bytes(), data.Bytes()...), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestQuantizedGGUF: a GGUF file mixing Q4_K and Q6_K (a Q4_K_M-style
// mix) of each supported architecture is described with its mix of tensor
// types, loads, and computes what the same weights compute in memory:
// llama, qwen2 (Q/K/V biases, NeoX RoPE) and qwen3 (per-head Q/K norms).
func TestQuantizedGGUF(t *testing.T) {
	for _, arch := range []string{"llama", "qwen2", "qwen3"} {
		t.Run(arch, func(t *testing.T) { testQuantizedGGUF(t, arch) })
	}
}

func testQuantizedGGUF(t *testing.T, arch string) {
	c := quantConfig
	c.Arch = arch
	c.RoPE.NeoX = arch != "llama"
	c.QKVBias = arch == "qwen2"
	c.QKNorm = arch == "qwen3"
	w, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	w.Requantize(Q4KM)
	// Biases and norms of distinct values, so that one read from the
	// wrong tensor, or not at all, changes the logits.
	for i := range w.Layers {
		for j, v := range [][]float32{w.Layers[i].QBias, w.Layers[i].KBias, w.Layers[i].VBias, w.Layers[i].QNorm, w.Layers[i].KNorm} {
			for k := range v {
				v[k] += 0.01 * float32((i*5+j*3+k)%11-5)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "mix.gguf")
	writeGGUF(t, path, c, w)
	d, err := Describe(path)
	if err != nil {
		t.Fatal(err)
	}
	s := d.String()
	t.Logf("%s", s)
	for _, want := range []string{"loads:           yes", "Q4_K ", "Q6_K ", "F32 ", "attn_v.weight Q6_K x2", "attn_q.weight Q4_K x2",
		"output.weight Q6_K x1", "token_embd.weight Q4_K x1"} {
		if !strings.Contains(s, want) {
			t.Errorf("no %q in\n%s", want, s)
		}
	}
	l, err := Load(LoadOptions{Path: path}, cpu.New(2))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	mem := New(c, w, cpu.New(2))
	for _, n := range []int{1, 6} { // the integer and the float path
		var got [2][]float32
		for i, m := range []*Model{l.Model, mem} {
			kv, tables := benchKV(&c, 1, n, 4)
			b := &Batch{Seqs: []kernels.AttnSeq{{Pages: tables[0], QLen: n, KVLen: n}}}
			for p := 0; p < n; p++ {
				b.Tokens = append(b.Tokens, int32(p*3+1))
				b.Positions = append(b.Positions, int32(p))
				b.Slots = append(b.Slots, tables[0][p/4]*4+int32(p%4))
			}
			out, err := m.Forward(b, kv)
			if err != nil {
				t.Fatal(err)
			}
			got[i] = append([]float32(nil), out...)
		}
		for i := range got[0] {
			if got[0][i] != got[1][i] {
				t.Fatalf("n=%d: logit %d from the file %g, in memory %g", n, i, got[0][i], got[1][i])
			}
		}
	}
}

// dtypeLimited is a backend that multiplies only f32 weights.
type dtypeLimited struct{ kernels.Backend }

func (dtypeLimited) SupportsDType(dt kernels.DType) bool { return dt == kernels.F32 }

// TestLoadRefusesUnsupportedDTypes: a backend that cannot run a file's
// weight dtypes (here Q4_K on an f32-only backend) refuses the model at
// load time.
func TestLoadRefusesUnsupportedDTypes(t *testing.T) {
	c := Config{Arch: "llama", Vocab: 256, Dim: 256, Layers: 1, Heads: 4, KVHeads: 4, HeadDim: 64, FF: 256, ContextLength: 32,
		NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 10000}}
	w, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	w.Requantize(func(string) kernels.DType { return kernels.Q4_K })
	path := filepath.Join(t.TempDir(), "q4k.gguf")
	writeGGUF(t, path, c, w)
	_, err = Load(LoadOptions{Path: path}, dtypeLimited{ref.New()})
	if err == nil || !strings.Contains(err.Error(), "q4_k") || !strings.Contains(err.Error(), "--device cpu") {
		t.Fatalf("load of q4_k weights on an f32-only backend: %v", err)
	}
	l, err := Load(LoadOptions{Path: path}, ref.New())
	if err != nil {
		t.Fatal(err)
	}
	l.Model.Close()
}

// TestQuantizedModelPoisonedKVIsNaN: with block-format weights, whose
// products quantise x to 8 bits, a read of a poisoned (NaN) KV page still
// makes that sequence's logits NaN, in a decode step of two
// sequences and in a prefill chunk of 20 tokens, and leaves the other
// sequence's finite: the NaN-logits gate sees the read.
func TestQuantizedModelPoisonedKVIsNaN(t *testing.T) {
	c := quantConfig
	w := quantWeights(t, Q4KM)
	m := New(c, w, cpu.New(2))
	const plen = 24
	nonFinite := func(v []float32) (bad, good int) {
		for _, f := range v {
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				bad++
			} else {
				good++
			}
		}
		return bad, good
	}
	for _, chunk := range []int{1, 20} {
		kv, tables := benchKV(&c, 2, plen+chunk, 4)
		pre := prefillBatch(&c, tables, 2, plen)
		if _, err := m.Forward(pre, kv); err != nil {
			t.Fatal(err)
		}
		// Sequence 0's second page as --kv-poison leaves a page nobody
		// wrote: NaN in every K and V element.
		page := int(tables[0][1])
		for i := page * kv.PageElems(); i < (page+1)*kv.PageElems(); i++ {
			kv.Data[i] = float32(math.NaN())
		}
		next := &Batch{}
		for s := 0; s < 2; s++ {
			q0 := len(next.Tokens)
			for p := plen; p < plen+chunk; p++ {
				next.Tokens = append(next.Tokens, int32((p*13+s)%c.Vocab))
				next.Positions = append(next.Positions, int32(p))
				next.Slots = append(next.Slots, tables[s][p/4]*4+int32(p%4))
			}
			next.Seqs = append(next.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: q0, QLen: chunk, KVLen: plen + chunk})
		}
		out, err := m.Forward(next, kv)
		if err != nil {
			t.Fatal(err)
		}
		if bad, _ := nonFinite(out[:c.Vocab]); bad != c.Vocab {
			t.Errorf("chunk %d: sequence 0 read NaN KV, but %d of its %d logits are finite", chunk, c.Vocab-bad, c.Vocab)
		}
		if bad, _ := nonFinite(out[c.Vocab : 2*c.Vocab]); bad != 0 {
			t.Errorf("chunk %d: sequence 1 read no NaN, but %d of its logits are not finite", chunk, bad)
		}
	}
}
