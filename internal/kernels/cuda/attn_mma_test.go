package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
)

// The tensor-core prompt attention (kernels/attn_mma.cuh). On the fake
// driver its mma runs through the emulation of bk_emu.h, which computes
// each lane's results from the whole warp's fragments as the PTX ISA
// lays them out, so these tests check the kernel's fragment bookkeeping
// as well as its masking, softmax and page walk.

// mmaTol is the attention bound |err| <= tol*5 of the tensor-core kernel
// over a pool of dt. The kernel rounds q and the softmax weights P to the
// pool's half type before the products (K and V are stored in it
// already; an fp8 pool's tiles are f16, exactly its values): a relative error of up to 2^-11 (f16) or 2^-8 (bf16) on each
// term of q·k and of Σ P·V. Over random unit-range data the scores move
// by at most a few times that (scale 1/√hd, sums of hd terms with random
// signs), and an output, a weighted mean of V values in [-1, 1], by about
// 2^-11 resp. 2^-8 of its magnitude. Measured worst |err|/5 on the fake
// driver: f16 ~1.5e-4, bf16 ~1e-3 (see the test log); the bounds leave
// room for the tensor cores' own summation order.
func mmaTol(dt kernels.DType) float64 {
	if dt == kernels.BF16 {
		return 8e-3
	}
	return 1e-3
}

// mmaLaunches counts the tensor-core kernel's launches.
func mmaLaunches(b *Backend) int {
	n := 0
	for k := kAttnMMAF16HD64; k <= kAttnMMABF16HD256; k++ {
		n += b.launches[k]
	}
	return n + b.launches[kAttnMMAE4M3HD64] + b.launches[kAttnMMAE4M3HD128] + b.launches[kAttnMMAE4M3HD256]
}

// narrowAttnLaunches counts attention.cuh's launches over narrow pools.
func narrowAttnLaunches(b *Backend) int {
	n := 0
	for _, k := range []int{kAttnF16M4, kAttnBF16M4, kAttnF16M8, kAttnBF16M8, kAttnE4M3M4, kAttnE4M3M8} {
		n += b.launches[k]
	}
	return n
}

// testAttentionMMA: prompts from position 0, chunks whose earlier
// positions are in pages already (chunked prefill, a prefix-cache hit),
// row tiles cut short by QLen, several sequences in one call, with a
// decode row and a short chunk that go to attention.cuh in the same call;
// f16, bf16 and fp8 pools, head dims 64, 128 and 256 (whose position tiles
// are 32, not 64), GQA groups of 1, 4 and 8, page sizes 1, 16, 24 (a
// page boundary inside a position tile that moves from tile to tile) and
// 64.
func testAttentionMMA(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(61, 62))
	// (QLen, KVLen)
	shapes := [][2]int{{40, 40}, {1, 77}, {16, 100}, {150, 290}, {5, 30}, {0, 5}, {70, 70}}
	type geo struct{ heads, kvh int }
	geos := []geo{{2, 2}, {4, 1}, {8, 1}}
	worst := map[kernels.DType]float64{}
	for _, dt := range narrowKV {
		for hi, hd := range []int{64, 128, 256} {
			for gi, g := range geos {
				for _, ps := range []int{1, 16, 24, 64} {
					// Every page size at one geometry a head dim, the
					// groups at page size 16.
					if ps != 16 && gi != hi%len(geos) {
						continue
					}
					c := kernelstest.NewAttnCase(rng, g.heads, g.kvh, hd, ps, shapes)
					c.KV = kernelstest.NarrowKV(c.KV, dt)
					scale := float32(1 / math.Sqrt(float64(hd)))
					name := fmt.Sprintf("AttentionMMA %s hd=%d heads=%d/%d ps=%d", dt, hd, g.heads, g.kvh, ps)
					mma, old := mmaLaunches(b), narrowAttnLaunches(b)
					w := worst[dt]
					checkAttentionTol(t, b, name, c, scale, mmaTol(dt), &w)
					worst[dt] = w
					if mmaLaunches(b) != mma+1 {
						t.Fatalf("%s: the tensor-core kernel ran %d times, want once", name, mmaLaunches(b)-mma)
					}
					if narrowAttnLaunches(b) != old+1 {
						t.Fatalf("%s: the decode row and short chunk did not go to attention.cuh", name)
					}
					if ps == 16 && gi == 0 {
						// attention.cuh's items split: its combine step
						// writes every row, the tensor-core rows after it
						// stand; the model's row order.
						b.forceSplits = 3
						checkAttentionTol(t, b, name+" splits=3", c.InOrder(), scale, mmaTol(dt), nil)
						b.forceSplits = 0
					}
				}
			}
		}
	}
	// Only prompt chunks: attention.cuh does not run; in the model's row order.
	c := kernelstest.NewAttnCase(rng, 4, 2, 64, 16, [][2]int{{64, 64}, {17, 200}}).InOrder()
	c.KV = kernelstest.NarrowKV(c.KV, kernels.F16)
	before := b.launches
	checkAttentionTol(t, b, "AttentionMMA only chunks", c, 0.125, mmaTol(kernels.F16), nil)
	for k := range before {
		if d := b.launches[k] - before[k]; d != 0 && k != kAttnMMAF16HD64 {
			t.Fatalf("only chunks: %s ran %d times", kernelNames[k], d)
		}
	}
	t.Logf("worst |err|/5: f16 %.2g, bf16 %.2g, fp8 %.2g", worst[kernels.F16], worst[kernels.BF16], worst[kernels.F8E4M3])
}

// testAttentionMMANaN: a NaN in V reaches the rows that read its position
// and no other (its position is on the diagonal of a row tile, where
// some of a warp's rows see it and some do not), a NaN in K makes the rows
// that read it NaN; all as in ref.
func testAttentionMMANaN(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(63, 64))
	for _, dt := range narrowKV {
		c := kernelstest.NewAttnCase(rng, 4, 2, 64, 16, [][2]int{{40, 60}}).InOrder()
		c.KV = kernelstest.NarrowKV(c.KV, dt)
		s := c.Seqs[0]
		nan := float32(math.NaN())
		row := make([]float32, c.KV.RowFloats())
		poison := func(off, j int) {
			c.KV.LoadRow(off, row)
			row[j] = nan
			c.KV.StoreRow(off, row)
		}
		// V of KV head 0 at position 45: rows 25.. (base 20) of heads 0, 1, dimension 3.
		poison(c.KV.VOffset(int(s.Pages[45/16]), 1, 45%16), 3)
		// K of KV head 1 at position 58: rows 38.. of heads 2, 3.
		poison(c.KV.KOffset(int(s.Pages[58/16]), 1, 58%16), 64+7)
		mma := mmaLaunches(b)
		checkAttentionTol(t, b, fmt.Sprintf("AttentionMMA NaN %s", dt), c, 0.125, mmaTol(dt), nil)
		if mmaLaunches(b) != mma+1 {
			t.Fatalf("%s: the tensor-core kernel did not run", dt)
		}
		got := make([]float32, len(c.Q))
		b.Attention(got, c.Q, toDevice(t, b, c.KV), 1, c.Seqs, 4, 0.125)
		n := 0
		for _, v := range got {
			if math.IsNaN(float64(v)) {
				n++
			}
		}
		// 15 rows x 2 heads x 1 dimension, 2 rows x 2 heads x 64.
		if want := 15*2 + 2*2*64; n != want {
			t.Fatalf("%s: %d NaN outputs, want %d", dt, n, want)
		}
	}
}
