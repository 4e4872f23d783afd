package kernels

import (
	"math/rand/v2"
	"testing"
)

// TestPackPageRoundTrip: a packed page of any KV dtype unpacks into
// another pool bit for bit, moves ElemBytes per element (half of F32 for
// F16/BF16), and leaves the slots it was not given alone.
func TestPackPageRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []DType{F32, F16, BF16} {
		kv := PagedKV{PageSize: 8, Layers: 2, KVHeads: 2, HeadDim: 4, DType: dt}
		kv.Data = make([]float32, 3*kv.PageFloats())
		row := make([]float32, kv.RowFloats())
		for off := 0; off < 3*kv.PageElems(); off += len(row) {
			for j := range row {
				row[j] = float32(rng.NormFloat64())
			}
			kv.StoreRow(off, row)
		}
		const tokens = 5
		b := PackPage(kv, 1, tokens, nil)
		want := 2 * 2 * tokens * 8 * 4
		if dt != F32 {
			want /= 2
		}
		if len(b) != want || len(b) != kv.PackedBytes(tokens) {
			t.Fatalf("%s: packed %d bytes, want %d", dt, len(b), want)
		}
		dst := kv
		dst.Data = make([]float32, len(kv.Data))
		for i := range dst.Data {
			dst.Data[i] = KVNaN
		}
		if err := UnpackPage(dst, 2, tokens, b); err != nil {
			t.Fatal(err)
		}
		if err := UnpackPage(dst, 2, tokens, b[:len(b)-1]); err == nil {
			t.Fatalf("%s: short payload accepted", dt)
		}
		got, a := make([]float32, kv.RowFloats()), make([]float32, kv.RowFloats())
		for l := 0; l < kv.Layers; l++ {
			for s := 0; s < kv.PageSize; s++ {
				for _, o := range [][2]int{{kv.KOffset(1, l, s), kv.KOffset(2, l, s)}, {kv.VOffset(1, l, s), kv.VOffset(2, l, s)}} {
					kv.LoadRow(o[0], a)
					dst.LoadRow(o[1], got)
					for j := range got {
						if s < tokens && got[j] != a[j] {
							t.Fatalf("%s layer %d slot %d: %v, want %v", dt, l, s, got[j], a[j])
						}
						if s >= tokens && got[j] == got[j] {
							t.Fatalf("%s layer %d slot %d (not packed) written: %v", dt, l, s, got[j])
						}
					}
				}
			}
		}
	}
}
