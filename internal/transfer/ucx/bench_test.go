//go:build ucx

package ucx

import (
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
	"github.com/batonlm/baton/internal/transfer/transfertest"
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

// BenchmarkHandoff moves one 512-token prompt of a 12-layer model with 12
// KV heads of 64 (pages of 16: 32 pages, 37.7 MB) per iteration: Open, 32
// Writes, Flush, Close, into a decode pool of the same 32 pages. It runs
// ucx over shared memory (posix,cma,self) with the pool in Go memory and
// in memory UCX allocated, ucx over tcp, and the tcp transport (landing
// with Unpack, as decode does), in one run. The MB/s is payload.
func BenchmarkHandoff(b *testing.B) {
	p := transfertest.NewBenchPrompt()
	ids := make([]int32, p.Pages())
	for i := range ids {
		ids[i] = int32(i)
	}
	run := func(b *testing.B, recv transfer.Receiver, snd transfer.Sender) {
		b.SetBytes(p.Bytes())
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			p.Send(b, snd, recv.Addr(), transfer.Key{Room: uint64(i)}, func(i int) []byte { return p.Packed[i] })
		}
	}
	for _, c := range []struct{ name, tls, mem string }{
		{"ucx/tls=posix,cma,self/mem=go", "posix,cma,self", "go"},
		{"ucx/tls=posix,cma,self/mem=allockv", "posix,cma,self", "allockv"},
		{"ucx/tls=tcp/mem=go", "tcp", "go"},
	} {
		b.Run(c.name, func(b *testing.B) {
			kv := p.Pool()
			opts := inUCXMemory(b, &kv, c.mem, WithTLS(c.tls))
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
		r, err := tcp.Listen("127.0.0.1:0", &transfertest.UnpackSink{KV: p.Pool()})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		run(b, r, tcp.NewSender())
	})
}
