package model

import (
	"fmt"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
)

// dummy110M is the llama shape of the benchmark figures in the README:
// n_embd 768, 12 layers, 12 heads, n_ff 2048, vocab 32000.
func dummy110M() Config {
	return Config{Arch: "llama", Name: "dummy", Vocab: 32000, Dim: 768, Layers: 12, Heads: 12, KVHeads: 12, HeadDim: 64, FF: 2048,
		ContextLength: 2048, NormEps: 1e-5, RoPE: kernels.RoPE{Dim: 64, Theta: 10000}}
}

func benchModels(b *testing.B) []*Model {
	be := cpu.New(0)
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
	return []*Model{l.Model, New(c, w, be)}
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

// BenchmarkPrefill measures prompt tokens per second: batch sequences of 128
// prompt tokens each, in one forward pass.
func BenchmarkPrefill(b *testing.B) {
	for _, m := range benchModels(b) {
		for _, batch := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/batch%d", m.Config.Name, batch), func(b *testing.B) {
				const plen = 128
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

// BenchmarkDecode measures generated tokens per second: batch sequences each
// at position 256, one new token each per forward pass.
func BenchmarkDecode(b *testing.B) {
	for _, m := range benchModels(b) {
		for _, batch := range []int{1, 8, 32} {
			b.Run(fmt.Sprintf("%s/batch%d", m.Config.Name, batch), func(b *testing.B) {
				const ctx = 256
				kv, tables := benchKV(&m.Config, batch, ctx+1, 16)
				bt := &Batch{}
				for s := 0; s < batch; s++ {
					bt.Tokens = append(bt.Tokens, int32(s%m.Config.Vocab))
					bt.Positions = append(bt.Positions, ctx)
					bt.Slots = append(bt.Slots, tables[s][ctx/16]*16+int32(ctx%16))
					bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: tables[s], QStart: s, QLen: 1, KVLen: ctx + 1})
				}
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
