package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
)

// TestFakeAttentionAllocs: a decode step calls Attention once a layer
// with the same sequences, and its plan (page tables, items) is built in
// slices the backend keeps: after the first call, a call allocates
// nothing on the host. Made afresh each call, the plan's slices were the
// largest host cost of a 32-stream step of a 28-layer model (a CPU
// profile on the emulated driver with its kernels made no-ops).
func TestFakeAttentionAllocs(t *testing.T) {
	b := fakeBackend(t)
	rng := rand.New(rand.NewPCG(71, 72))
	shapes := make([][2]int, 32)
	for i := range shapes {
		shapes[i] = [2]int{1, 40 + 9*i} // 32 decode rows, contexts of 40..319
	}
	c := kernelstest.NewAttnCase(rng, 16, 8, 64, 16, shapes).InOrder()
	c.KV = kernelstest.NarrowKV(c.KV, kernels.BF16)
	kv := toDevice(t, b, c.KV)
	out := make([]float32, len(c.Q))
	kernels.Keep(b, c.Q)
	kernels.Keep(b, out)
	b.Attention(out, c.Q, kv, 0, c.Seqs, 16, 0.125)
	layer := 0
	allocs := testing.AllocsPerRun(20, func() {
		layer = (layer + 1) % c.KV.Layers
		b.Attention(out, c.Q, kv, layer, c.Seqs, 16, 0.125)
	})
	if allocs > 0 {
		t.Fatalf("Attention allocates %.1f times a call after the first; want none", allocs)
	}
}
