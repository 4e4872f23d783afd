package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
)

// Narrow KV pools (f16, bf16, fp8 e4m3) on the GPU: the attention kernels
// read the stored elements, StoreKV rounds as the host does, page copies
// move the packed bytes of transfer.Pack, and poisoning makes every
// element a NaN.

var narrowKV = []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3}

// oddRowHD is a head dim whose rows (of 3 KV heads) are an odd number of
// elements, for the dtypes whose pools allow one: an fp8 row must be a
// whole number of the page kernels' 2-byte units, so it gets 6 (rows of
// 18).
func oddRowHD(dt kernels.DType) int {
	if dt == kernels.F8E4M3 {
		return 6
	}
	return 5
}

// testAttentionKVDType: over an f16, bf16 or fp8 pool the kernels match the
// reference reading the same stored values, as tight as over f32: head
// dims on the 16-byte path (64, 128, 256) and off it (8, 12), GQA groups
// of 1, 4 and 8 (the kernels of 4 and 8 members), page size 16 (and 1 at
// head dim 64),
// unsplit and cut into 3 parts. Prompt chunks run on attention.cuh here
// too (noAttnMMA); attn_mma_test.go covers the tensor-core kernel.
func testAttentionKVDType(t *testing.T, b *Backend) {
	b.noAttnMMA = true
	defer func() { b.noAttnMMA = false }()
	rng := rand.New(rand.NewPCG(43, 44))
	shapes := [][2]int{{1, 1}, {1, 17}, {1, 150}, {23, 23}, {5, 70}, {0, 5}, {2, 3}}
	type geo struct{ heads, kvh int }
	geos := []geo{{8, 2}, {4, 4}, {16, 2}}
	var worst float64
	for _, dt := range narrowKV {
		for _, hd := range []int{8, 12, 64, 128, 256} {
			for _, g := range geos {
				for _, ps := range []int{1, 16} {
					if ps == 1 && hd != 64 { // one position a page: the page walk, not the row reads
						continue
					}
					c := kernelstest.NewAttnCase(rng, g.heads, g.kvh, hd, ps, shapes)
					c.KV = kernelstest.NarrowKV(c.KV, dt)
					scale := float32(1 / math.Sqrt(float64(hd)))
					name := fmt.Sprintf("Attention %s KV hd=%d heads=%d/%d ps=%d", dt, hd, g.heads, g.kvh, ps)
					checkAttention(t, b, name, c, scale, &worst)
					b.forceSplits = 3
					checkAttention(t, b, name+" splits=3", c.InOrder(), scale, &worst)
					b.forceSplits = 0
				}
			}
		}
	}
	t.Logf("worst |err|/5 %.2g", worst)
}

// testAttentionLongKVDType: long decodes over a narrow pool, split by the
// backend itself, and one sequence of 1 position per page.
func testAttentionLongKVDType(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(45, 46))
	for _, dt := range narrowKV {
		c := kernelstest.NewAttnCase(rng, 8, 2, 128, 16, [][2]int{{1, 2500}, {1, 700}})
		c.KV = kernelstest.NarrowKV(c.KV, dt)
		checkAttention(t, b, fmt.Sprintf("long decode %s", dt), c.InOrder(), 0.09, nil)
	}
}

// testStoreKVDType: StoreKV into a narrow pool writes each element rounded
// as kernels.PagedKV.StoreRow does (bit for bit) and touches nothing else.
func testStoreKVDType(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(47, 48))
	for _, dt := range narrowKV {
		for _, hd := range []int{8, 3} { // rows of an odd number of halves too
			want := kernels.PagedKV{PageSize: 16, Layers: 3, KVHeads: 2, HeadDim: hd, DType: dt}
			want.Data = randVec(rng, 5*want.PageFloats(), 1)
			kv := toDevice(t, b, want)
			slots := []int32{0, 17, 79, 40, 41}
			k := randVec(rng, len(slots)*kv.RowFloats(), 1)
			v := randVec(rng, len(slots)*kv.RowFloats(), 1)
			k[3] = float32(math.Inf(1))
			k[4] = 1000    // past fp8's 448: saturates
			v[5] = 1e-7    // a subnormal half, or a bf16 of f32's range
			v[6] = 0x3p-10 // an fp8 subnormal's tie: to even
			ref.New().StoreKV(want, 2, slots, k, v)
			b.StoreKV(kv, 2, slots, k, v)
			got := fromDevice(t, kv)
			for i := range want.Data {
				if math.Float32bits(got[i]) != math.Float32bits(want.Data[i]) {
					t.Fatalf("%s hd %d: StoreKV word %d is %#x, want %#x", dt, hd, i,
						math.Float32bits(got[i]), math.Float32bits(want.Data[i]))
				}
			}
		}
	}
}

// testKVPoolDType: page copies of a narrow pool are transfer.Pack's bytes
// (odd token counts and rows of an odd number of halves included), and a
// fill with kernels.KVNaN makes every element of the pages named a NaN
// that attention then returns.
func testKVPoolDType(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(49, 50))
	for _, dt := range narrowKV {
		host := kernels.PagedKV{PageSize: 8, Layers: 2, KVHeads: 3, HeadDim: oddRowHD(dt), DType: dt}
		host.Data = randVec(rng, 4*host.PageFloats(), 1)
		kv := toDevice(t, b, host)
		for _, tokens := range []int{1, 5, 8} {
			got, err := kv.Device.ReadPage(2, tokens, nil)
			if err != nil {
				t.Fatal(err)
			}
			if want := kernels.PackPage(host, 2, tokens, nil); string(got) != string(want) {
				t.Fatalf("%s: ReadPage of %d tokens differs from transfer.Pack", dt, tokens)
			}
		}
		src := host
		src.Data = randVec(rng, 4*host.PageFloats(), 1)
		if err := kv.Device.WritePage(1, 3, kernels.PackPage(src, 0, 3, nil)); err != nil {
			t.Fatal(err)
		}
		if err := kernels.UnpackPage(host, 1, 3, kernels.PackPage(src, 0, 3, nil)); err != nil {
			t.Fatal(err)
		}
		got := fromDevice(t, kv)
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(host.Data[i]) {
				t.Fatalf("%s: after WritePage of 3 tokens word %d differs", dt, i)
			}
		}

		// An odd row of fp8 is not a whole number of the page kernels'
		// 2-byte units.
		odd, err := b.AllocKV(kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 3, DType: dt}, 2)
		if (err == nil) != (dt != kernels.F8E4M3) {
			t.Fatalf("%s: a pool of rows of 3 elements: %v", dt, err)
		}
		if err == nil {
			if err := odd.Close(); err != nil {
				t.Fatal(err)
			}
		}

		c := kernelstest.NewAttnCase(rng, 4, 2, 64, 4, [][2]int{{1, 10}})
		c.KV = kernelstest.NarrowKV(c.KV, dt)
		dev := toDevice(t, b, c.KV)
		poisoned := c.Seqs[0].Pages[1]
		if err := dev.Device.Fill([]int32{poisoned}, kernels.KVNaN); err != nil {
			t.Fatal(err)
		}
		back := c.KV
		back.Data = fromDevice(t, dev)
		row := make([]float32, back.RowFloats())
		for l := range back.Layers {
			for s := range back.PageSize {
				for _, off := range []int{back.KOffset(int(poisoned), l, s), back.VOffset(int(poisoned), l, s)} {
					back.LoadRow(off, row)
					for j, f := range row {
						if !math.IsNaN(float64(f)) {
							t.Fatalf("%s: poisoned page %d layer %d slot %d element %d is %g", dt, poisoned, l, s, j, f)
						}
					}
				}
			}
		}
		out := make([]float32, len(c.Q))
		b.Attention(out, c.Q, dev, 1, c.InOrder().Seqs, 4, 0.125)
		for i, f := range out {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("%s: attention over a poisoned page gave %g at %d, want NaN", dt, f, i)
			}
		}
	}
}

// testReadPages: several pages read in one pass are, page for page, what
// ReadPage and transfer.Pack give (every dtype, partial and empty pages,
// a page twice), including rows a StoreKV queued just before; a page
// outside the pool is refused.
func testReadPages(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(59, 60))
	for _, dt := range []kernels.DType{kernels.F32, kernels.F16, kernels.BF16, kernels.F8E4M3} {
		host := kernels.PagedKV{PageSize: 8, Layers: 2, KVHeads: 3, HeadDim: oddRowHD(dt), DType: dt}
		host.Data = randVec(rng, 5*host.PageFloats(), 1)
		kv := toDevice(t, b, host)
		slots := []int32{17, 18}
		k, v := randVec(rng, 2*kv.RowFloats(), 1), randVec(rng, 2*kv.RowFloats(), 1)
		b.StoreKV(kv, 1, slots, k, v)
		ref.New().StoreKV(host, 1, slots, k, v)
		pages, tokens := []int32{2, 0, 4, 2, 1}, []int{3, 8, 0, 8, 1}
		got, err := kv.Device.(kernels.PagesReader).ReadPages(pages, tokens)
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range pages {
			if want := kernels.PackPage(host, p, tokens[i], nil); string(got[i]) != string(want) {
				t.Fatalf("%s: ReadPages entry %d (page %d, %d tokens) differs from transfer.Pack", dt, i, p, tokens[i])
			}
		}
		if _, err := kv.Device.(kernels.PagesReader).ReadPages([]int32{1, 5}, []int{1, 1}); err == nil {
			t.Errorf("%s: ReadPages of page 5 of 5", dt)
		}
	}
}
