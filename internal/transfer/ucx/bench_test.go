//go:build ucx

package ucx

import (
	"context"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
)

// nopSink admits every key (all pages) and ignores Closed: the benchmark
// measures the transport.
type nopSink struct {
	mu    sync.Mutex
	pages []int32
}

func (s *nopSink) Write(transfer.Key, transfer.PageWrite) error { return nil }
func (s *nopSink) Closed(transfer.Key, string)                  {}
func (s *nopSink) Admit(transfer.Key) ([]int32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pages, nil
}

// unpackSink lands tcp frames the way decode does.
type unpackSink struct {
	mu sync.Mutex
	kv kernels.PagedKV
}

func (s *unpackSink) Write(_ transfer.Key, w transfer.PageWrite) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return transfer.Unpack(s.kv, w.Page, w.Tokens, w.Data)
}
func (s *unpackSink) Closed(transfer.Key, string) {}

// BenchmarkHandoff moves one 512-token prompt of a 12-layer model with 12
// KV heads of 64 (pages of 16: 32 pages, 37.7 MB) per iteration: Open, 32
// Writes, Flush, Close, into a decode pool of the same 32 pages. It runs
// ucx over shared memory (posix,cma,self) with the pool in Go memory and
// in memory UCX allocated, ucx over tcp, and the tcp transport (landing
// with Unpack, as decode does), in one run. The MB/s is payload.
func BenchmarkHandoff(b *testing.B) {
	const tokens = 512
	layout := kernels.PagedKV{PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}
	pages := tokens / layout.PageSize
	src := layout
	src.Data = make([]float32, pages*layout.PageFloats())
	for i := range src.Data {
		src.Data[i] = float32(i%1000) * 0.001
	}
	packed := make([][]byte, pages)
	ids := make([]int32, pages)
	for i := range packed {
		packed[i] = transfer.Pack(src, int32(i), layout.PageSize, nil)
		ids[i] = int32(i)
	}
	run := func(b *testing.B, recv transfer.Receiver, snd transfer.Sender) {
		ctx := context.Background()
		b.SetBytes(int64(pages * len(packed[0])))
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			s, err := snd.Open(ctx, recv.Addr(), transfer.Key{Room: uint64(i)})
			if err != nil {
				b.Fatal(err)
			}
			for p := range pages {
				if err := s.Write(transfer.PageWrite{Index: p, Page: int32(p), Tokens: layout.PageSize, Data: packed[p]}); err != nil {
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
	}
	for _, c := range []struct{ name, tls, mem string }{
		{"ucx/tls=posix,cma,self/mem=go", "posix,cma,self", "go"},
		{"ucx/tls=posix,cma,self/mem=allockv", "posix,cma,self", "allockv"},
		{"ucx/tls=tcp/mem=go", "tcp", "go"},
	} {
		b.Run(c.name, func(b *testing.B) {
			kv := layout
			opts := []Option{WithTLS(c.tls)}
			if c.mem == "allockv" {
				reg, err := AllocKV(pages*layout.PageFloats(), WithTLS(c.tls))
				if err != nil {
					b.Fatal(err)
				}
				defer reg.Free()
				kv.Data = reg.Floats()
				opts = append(opts, WithMemory(reg))
			} else {
				kv.Data = make([]float32, pages*layout.PageFloats())
			}
			r, err := Listen("127.0.0.1:0", &nopSink{pages: ids}, kv, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			s, err := NewSender(WithTLS(c.tls))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			run(b, r, s)
		})
	}
	b.Run("tcp/sink=unpack", func(b *testing.B) {
		kv := layout
		kv.Data = make([]float32, pages*layout.PageFloats())
		r, err := tcp.Listen("127.0.0.1:0", &unpackSink{kv: kv})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		run(b, r, tcp.NewSender())
	})
}
