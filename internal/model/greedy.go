package model

import (
	"github.com/batonlm/baton/internal/kernels"
)

// GreedyDecode generates steps tokens greedily for one sequence through
// Forward on KV memory of its own, with no pool or scheduler: the prompt is
// fed in chunks of chunk tokens, pages are handed out in reverse order (so
// the page table is really followed), and the memory starts as NaN (so a
// read of any slot not written first poisons the logits). Backends and
// loaders are checked with it against the public reference; each result
// carries topLogprobs alternatives.
func (m *Model) GreedyDecode(prompt []int32, steps, pageSize, chunk, topLogprobs int) ([]Sampled, error) {
	return m.GreedyDecodeKV(prompt, steps, pageSize, chunk, topLogprobs, kernels.F32)
}

// GreedyDecodeKV is GreedyDecode with the KV memory stored in kvDType.
func (m *Model) GreedyDecodeKV(prompt []int32, steps, pageSize, chunk, topLogprobs int, kvDType kernels.DType) ([]Sampled, error) {
	c := &m.Config
	npages := (len(prompt)+steps)/pageSize + 2
	kv := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: kvDType}
	if a, ok := m.be.(kernels.KVAllocator); ok {
		dev, err := a.AllocKV(kv, npages)
		if err != nil {
			return nil, err
		}
		defer dev.Close()
		if err := dev.Fill(nil, kernels.KVNaN); err != nil {
			return nil, err
		}
		kv.Device = dev
	} else {
		kv.Data = make([]float32, npages*kv.PageFloats())
		for i := range kv.Data {
			kv.Data[i] = kernels.KVNaN
		}
	}
	pages := make([]int32, npages)
	for i := range pages {
		pages[i] = int32(npages - 1 - i)
	}
	slot := func(pos int) int32 { return pages[pos/pageSize]*int32(pageSize) + int32(pos%pageSize) }
	var s Sampler
	seq := append([]int32(nil), prompt...)
	var out []Sampled
	done := 0
	for len(out) < steps {
		end := min(len(seq), done+chunk)
		b := &Batch{}
		for p := done; p < end; p++ {
			b.Tokens = append(b.Tokens, seq[p])
			b.Positions = append(b.Positions, int32(p))
			b.Slots = append(b.Slots, slot(p))
		}
		b.Seqs = []kernels.AttnSeq{{Pages: pages, QStart: 0, QLen: end - done, KVLen: end}}
		logits, err := m.Forward(b, kv)
		if err != nil {
			return out, err
		}
		done = end
		if done < len(seq) {
			continue
		}
		r := s.Sample(logits[:c.Vocab], Sampling{TopLogprobs: topLogprobs}, nil)
		out = append(out, r)
		seq = append(seq, r.ID)
	}
	return out, nil
}
