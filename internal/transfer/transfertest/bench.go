package transfertest

import (
	"context"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// BenchPrompt is what the transport benchmarks move per iteration: one
// 512-token prompt of a 12-layer model with 12 KV heads of 64, in pages of
// 16 (32 pages, 37.7 MB), packed, with the pool it came from.
type BenchPrompt struct {
	Layout kernels.PagedKV // sizes only
	Src    kernels.PagedKV // the prefill pool holding it
	Packed [][]byte        // page i packed, full
}

// NewBenchPrompt makes the prompt.
func NewBenchPrompt() BenchPrompt {
	const tokens = 512
	p := BenchPrompt{Layout: kernels.PagedKV{PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}}
	pages := tokens / p.Layout.PageSize
	p.Src = p.Layout
	p.Src.Data = make([]float32, pages*p.Layout.PageFloats())
	for i := range p.Src.Data {
		p.Src.Data[i] = float32(i%1000) * 0.001
	}
	p.Packed = make([][]byte, pages)
	for i := range p.Packed {
		p.Packed[i] = kernels.PackPage(p.Src, int32(i), p.Layout.PageSize, nil)
	}
	return p
}

// Pages is the number of pages of the prompt.
func (p BenchPrompt) Pages() int { return len(p.Packed) }

// Bytes is the payload of one iteration.
func (p BenchPrompt) Bytes() int64 { return int64(len(p.Packed) * len(p.Packed[0])) }

// Pool is a fresh pool of the prompt's pages in Go memory.
func (p BenchPrompt) Pool() kernels.PagedKV {
	kv := p.Layout
	kv.Data = make([]float32, p.Pages()*p.Layout.PageFloats())
	return kv
}

// Send moves the prompt once through a new session of snd to addr: Open,
// a Write per page (data(i) gives page i's payload), Flush, Close.
func (p BenchPrompt) Send(b *testing.B, snd transfer.Sender, addr string, key transfer.Key, data func(i int) []byte) {
	ctx := context.Background()
	s, err := snd.Open(ctx, addr, key)
	if err != nil {
		b.Fatal(err)
	}
	for i := range p.Pages() {
		if err := s.Write(transfer.PageWrite{Index: i, Page: int32(i), Tokens: p.Layout.PageSize, Data: data(i)}); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
}

// UnpackSink lands pages the way decode does (Unpack into KV), or with
// Discard only takes them, to see the transport alone.
type UnpackSink struct {
	mu      sync.Mutex
	KV      kernels.PagedKV
	Discard bool
}

// Write implements transfer.Sink.
func (s *UnpackSink) Write(_ transfer.Key, w transfer.PageWrite) error {
	if s.Discard {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return transfer.Unpack(s.KV, w.Page, w.Tokens, w.Data)
}

// Closed implements transfer.Sink.
func (s *UnpackSink) Closed(transfer.Key, string) {}

// Admit implements transfer.Sink: every session is admitted (the
// benchmark's senders write only pages of their own).
func (s *UnpackSink) Admit(transfer.Key) ([]int32, error) { return nil, nil }
