package tcp

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// unpackSink lands pages the way decode does (Unpack into a paged KV)
// or, with discard, only counts them, to see the transport alone.
type unpackSink struct {
	mu      sync.Mutex
	kv      kernels.PagedKV
	discard bool
}

func (s *unpackSink) Write(_ transfer.Key, w transfer.PageWrite) error {
	if s.discard {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return transfer.Unpack(s.kv, w.Page, w.Tokens, w.Data)
}

func (s *unpackSink) Closed(transfer.Key, string) {}

// BenchmarkPrompt moves one 512-token prompt of a 110M-class model (12
// layers, 12 KV heads of 64, pages of 16: 32 pages, 36 MiB) per iteration
// over loopback: Open, 32 Writes, Flush, Close. The MB/s is payload.
func BenchmarkPrompt(b *testing.B) {
	const tokens = 512
	layout := kernels.PagedKV{PageSize: 16, Layers: 12, KVHeads: 12, HeadDim: 64}
	pages := tokens / layout.PageSize
	src := layout
	src.Data = make([]float32, pages*layout.PageFloats())
	for i := range src.Data {
		src.Data[i] = float32(i%1000) * 0.001
	}
	packed := make([][]byte, pages)
	for i := range packed {
		packed[i] = transfer.Pack(src, int32(i), layout.PageSize, nil)
	}
	for _, sock := range []struct {
		name string
		size int
	}{{"sockbuf=4MiB", DefaultSocketBuffer}, {"sockbuf=auto", 0}} {
		for _, land := range []string{"discard", "unpack"} {
			for _, pack := range []bool{false, true} {
				name := fmt.Sprintf("%s/sink=%s/pack=%v", sock.name, land, pack)
				b.Run(name, func(b *testing.B) {
					dst := layout
					dst.Data = make([]float32, pages*layout.PageFloats())
					sink := &unpackSink{kv: dst, discard: land == "discard"}
					r, err := Listen("127.0.0.1:0", sink, WithSocketBuffer(sock.size))
					if err != nil {
						b.Fatal(err)
					}
					defer r.Close()
					snd := NewSender(WithSocketBuffer(sock.size))
					ctx := context.Background()
					b.SetBytes(int64(pages * len(packed[0])))
					b.ResetTimer()
					for i := 0; b.Loop(); i++ {
						s, err := snd.Open(ctx, r.Addr(), transfer.Key{Room: uint64(i)})
						if err != nil {
							b.Fatal(err)
						}
						for p := range pages {
							data := packed[p]
							if pack {
								// The previous session is closed, so its
								// buffers are free to reuse.
								data = transfer.Pack(src, int32(p), layout.PageSize, data)
							}
							if err := s.Write(transfer.PageWrite{Index: p, Page: int32(p), Tokens: layout.PageSize, Data: data}); err != nil {
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
				})
			}
		}
	}
}
