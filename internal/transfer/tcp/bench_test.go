package tcp

import (
	"fmt"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

// BenchmarkPrompt moves one 512-token prompt (transfertest.BenchPrompt:
// 32 pages, 37.7 MB) per iteration over loopback: Open, 32 Writes, Flush,
// Close. The MB/s is payload.
func BenchmarkPrompt(b *testing.B) {
	p := transfertest.NewBenchPrompt()
	for _, sock := range []struct {
		name string
		size int
	}{{"sockbuf=4MiB", DefaultSocketBuffer}, {"sockbuf=auto", 0}} {
		for _, land := range []string{"discard", "unpack"} {
			for _, pack := range []bool{false, true} {
				name := fmt.Sprintf("%s/sink=%s/pack=%v", sock.name, land, pack)
				b.Run(name, func(b *testing.B) {
					sink := &transfertest.UnpackSink{KV: p.Pool(), Discard: land == "discard"}
					r, err := Listen("127.0.0.1:0", sink, WithSocketBuffer(sock.size))
					if err != nil {
						b.Fatal(err)
					}
					defer r.Close()
					snd := NewSender(WithSocketBuffer(sock.size))
					data := func(i int) []byte { return p.Packed[i] }
					if pack {
						// The previous session is closed, so its buffers
						// are free to reuse.
						data = func(i int) []byte {
							p.Packed[i] = kernels.PackPage(p.Src, int32(i), p.Layout.PageSize, p.Packed[i])
							return p.Packed[i]
						}
					}
					b.SetBytes(p.Bytes())
					b.ResetTimer()
					for i := 0; b.Loop(); i++ {
						p.Send(b, snd, r.Addr(), transfer.Key{Room: uint64(i)}, data)
					}
				})
			}
		}
	}
}
