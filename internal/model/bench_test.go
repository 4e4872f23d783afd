package model

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
)

// dummy110M is the llama shape of the benchmark figures in the README:
// n_embd 768, 12 layers, 12 heads, n_ff 2048, vocab 32000.
func dummy110M() Config {
	return Config{Arch: "llama", Name: "dummy", Vocab: 32000, Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, HeadDim: 64, FF: 2048,
		ContextLength: 2048, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 10000}}
}

// benchModels: the bundled model, the dummy 110M and BATON_BENCH_MODEL,
// on a CPU backend with BATON_BENCH_THREADS threads (default: all), to
// set one thread's figures next to two's.
func benchModels(b *testing.B) []*Model {
	th, _ := strconv.Atoi(os.Getenv("BATON_BENCH_THREADS"))
	be := cpu.New(th)
	l, err := Load(LoadOptions{}, be)
	if err != nil {
		b.Fatal(err)
	}
	l.Model.Config.Name = l.Name
	c := dummy110M()
	w, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		b.Fatal(err)
	}
	ms := []*Model{l.Model, New(c, w, be)}
	// BATON_BENCH_MODEL adds a model file (e.g. a 1.1B GGUF) to the
	// prefill and decode benchmarks, to set them next to llama-bench's
	// pp and tg figures on the same file.
	if path := os.Getenv("BATON_BENCH_MODEL"); path != "" {
		x, err := Load(LoadOptions{Path: path, HostCopy: true}, be) // as baton serve on the CPU
		if err != nil {
			b.Fatal(err)
		}
		x.Model.Config.Name = filepath.Base(path)
		ms = append(ms, x.Model)
	}
	return ms
}

func benchKV(c *Config, seqs, tokens, pageSize int) (kernels.PagedKV, [][]int32) {
	kv := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	per := (tokens + pageSize - 1) / pageSize
	kv.Data = make([]float32, seqs*per*kv.PageFloats())
	tables := make([][]int32, seqs)
	for s := range tables {
		for p := 0; p < per; p++ {
			tables[s] = append(tables[s], int32(s*per+p))
		}
	}
	return kv, tables
}

// BenchmarkPrefill measures prompt tokens per second: batch sequences of
// plen prompt tokens each, in one forward pass.
func BenchmarkPrefill(b *testing.B) {
	// BATON_BENCH_PROMPT sets the prompt length (default 128), e.g. 512
	// to set a model file's prefill next to llama-bench's pp512.
	plen := 128
	if n, err := strconv.Atoi(os.Getenv("BATON_BENCH_PROMPT")); err == nil && n > 0 {
		plen = n
	}
	for _, m := range benchModels(b) {
		for _, batch := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/batch%d", m.Config.Name, batch), func(b *testing.B) {
				kv, tables := benchKV(&m.Config, batch, plen, 16)
				bt := &Batch{}
				for s := 0; s < batch; s++ {
					q0 := len(bt.Tokens)
					for p := 0; p < plen; p++ {
						bt.Tokens = append(bt.Tokens, int32((s*7+p)%m.Config.Vocab))
						bt.Positions = append(bt.Positions, int32(p))
						bt.Slots = append(bt.Slots, tables[s][p/16]*16+int32(p%16))
					}
					bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: q0, QLen: plen, KVLen: plen})
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := m.Forward(bt, kv); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(batch*plen*b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// decodeBatch is one decode row for each of batch sequences at position
// ctx, over the page tables benchKV made (16-token pages).
func decodeBatch(tables [][]int32, batch, ctx, vocab int) *Batch {
	bt := &Batch{}
	for s := 0; s < batch; s++ {
		bt.Tokens = append(bt.Tokens, int32(s%vocab))
		bt.Positions = append(bt.Positions, int32(ctx))
		bt.Slots = append(bt.Slots, tables[s][ctx/16]*16+int32(ctx%16))
		bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: s, QLen: 1, KVLen: ctx + 1})
	}
	return bt
}

// BenchmarkDecode measures generated tokens per second: batch sequences each
// at position 256, one new token each per forward pass.
func BenchmarkDecode(b *testing.B) {
	for _, m := range benchModels(b) {
		for _, batch := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/batch%d", m.Config.Name, batch), func(b *testing.B) {
				const ctx = 256
				kv, tables := benchKV(&m.Config, batch, ctx+1, 16)
				bt := decodeBatch(tables, batch, ctx, m.Config.Vocab)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := m.Forward(bt, kv); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// dtypeModels is the dummy 134M llama in each weight dtype the CPU serves
// (K formats as a Q4_K_M-style mix: attn_v, ffn_down and output in Q6_K).
func dtypeModels(b *testing.B) []*Model {
	be := cpu.New(0)
	c := dummy110M()
	var ms []*Model
	for _, name := range []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k_m"} {
		dt := map[string]kernels.DType{"f32": kernels.F32, "f16": kernels.F16, "bf16": kernels.BF16, "q8_0": kernels.Q8_0,
			"q4_0": kernels.Q4_0, "q4_k_m": kernels.Q4_K}[name]
		w, err := DummyWeights(&c, dt)
		if err != nil {
			b.Fatal(err)
		}
		if name == "q4_k_m" {
			w.Requantize(func(kind string) kernels.DType {
				switch kind {
				case "attn_v", "ffn_down", "output":
					return kernels.Q6_K
				}
				return kernels.Q4_K
			})
		}
		m := New(c, w, be)
		m.Config.Name = "dummy-" + name
		ms = append(ms, m)
	}
	return ms
}

// BenchmarkDTypes: one 512-token prefill chunk and decode steps of 1 and
// 32 sequences (at position 256) of the dummy 134M llama per weight dtype.
// Prefill reports tok/s and GFLOP/s of its matrix products (2·params per
// token, attention left out) next to the machine's sgemm (sgemm-GFLOP/s,
// measured in the same run), so "GEMM-bound" reads as a ratio.
func BenchmarkDTypes(b *testing.B) {
	pk := sgemmPeak()
	for _, m := range dtypeModels(b) {
		c := &m.Config
		params := 0
		for _, ly := range m.Weights.Layers {
			for _, w := range []*kernels.Matrix{ly.Q, ly.K, ly.V, ly.O, ly.Gate, ly.Up, ly.Down} {
				params += w.Rows * w.Cols
			}
		}
		b.Run(c.Name+"/prefill512", func(b *testing.B) {
			const plen = 512
			kv, tables := benchKV(c, 1, plen, 16)
			bt := &Batch{Seqs: []kernels.AttnSeq{{Pages: tables[0], QLen: plen, KVLen: plen}}}
			for p := 0; p < plen; p++ {
				bt.Tokens = append(bt.Tokens, int32((p*7)%c.Vocab))
				bt.Positions = append(bt.Positions, int32(p))
				bt.Slots = append(bt.Slots, tables[0][p/16]*16+int32(p%16))
			}
			for b.Loop() {
				if _, err := m.Forward(bt, kv); err != nil {
					b.Fatal(err)
				}
			}
			sec := b.Elapsed().Seconds()
			gf := float64(b.N) * plen * 2 * float64(params) / sec / 1e9
			b.ReportMetric(float64(b.N*plen)/sec, "tok/s")
			b.ReportMetric(gf, "GFLOP/s")
			b.ReportMetric(pk, "sgemm-GFLOP/s")
			b.ReportMetric(gf/pk, "of-sgemm")
		})
		for _, batch := range []int{1, 32} {
			b.Run(fmt.Sprintf("%s/decode%d", c.Name, batch), func(b *testing.B) {
				const ctx = 256
				kv, tables := benchKV(c, batch, ctx+1, 16)
				bt := &Batch{}
				for s := 0; s < batch; s++ {
					bt.Tokens = append(bt.Tokens, int32(s%c.Vocab))
					bt.Positions = append(bt.Positions, int32(ctx))
					bt.Slots = append(bt.Slots, tables[s][ctx/16]*16+int32(ctx%16))
					bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: s, QLen: 1, KVLen: ctx + 1})
				}
				for b.Loop() {
					if _, err := m.Forward(bt, kv); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

var (
	peakOnce sync.Once
	peak     float64
)

// sgemmPeak: OpenBLAS sgemm GFLOP/s on this machine now (best of five
// 512x2048x2048 products through the cpu backend, all threads).
func sgemmPeak() float64 {
	peakOnce.Do(func() {
		be := cpu.New(0)
		w, _ := DummyWeights(&Config{Arch: "llama", Vocab: 2048, Dim: 2048, Heads: 1, KVHeads: 1, HeadDim: 2048, FF: 2048}, kernels.F32)
		x := make([]float32, 512*2048)
		for i := range x {
			x[i] = float32(i%17) / 17
		}
		out := make([]float32, 512*2048)
		be.MatMul(out, x, 512, w.Embed)
		best := math.Inf(1)
		for range 5 {
			t0 := time.Now()
			be.MatMul(out, x, 512, w.Embed)
			best = min(best, time.Since(t0).Seconds())
		}
		peak = 2 * 512 * 2048 * 2048 / best / 1e9
	})
	return peak
}

// BenchmarkDecodeKVDType: a decode step of 32 sequences at position 512
// of the dummy 134M llama, with KV stored in f32, f16 and bf16; the
// narrower KV halves attention's memory reads (KV-MiB is what one step's
// attention reads).
func BenchmarkDecodeKVDType(b *testing.B) {
	c := dummy110M()
	w, err := DummyWeights(&c, kernels.F32)
	if err != nil {
		b.Fatal(err)
	}
	m := New(c, w, cpu.New(0))
	const batch, ctx = 32, 512
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16} {
		b.Run(fmt.Sprintf("kv-%s/batch%d/ctx%d", dt, batch, ctx), func(b *testing.B) {
			kv, tables := benchKV(&c, batch, ctx+1, 16)
			kv.DType = dt
			kv.Data = kv.Data[:len(kv.Data)/kv.PageFloats()*kv.PageFloats()]
			bt := decodeBatch(tables, batch, ctx, c.Vocab)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := m.Forward(bt, kv); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(batch*(ctx+1)*c.Layers*2*c.KVHeads*c.HeadDim*kv.ElemBytes())/(1<<20), "KV-MiB")
		})
	}
}
