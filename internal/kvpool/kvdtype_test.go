package kvpool

import (
	"errors"
	"math"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// TestKVDTypePool: an F16/BF16 pool's pages take half the bytes of an F32
// one (an F8E4M3 pool's a quarter), its KV view says the dtype, a write
// through it survives a pack/unpack round trip into a second pool, and
// every element of a fresh or freed page reads as NaN in that dtype when
// poisoned.
func TestKVDTypePool(t *testing.T) {
	base := Config{NumPages: 3, PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, Poison: true}
	f32, err := New(base)
	if err != nil {
		t.Fatal(err)
	}
	for _, dt := range []kernels.DType{kernels.F16, kernels.BF16, kernels.F8E4M3} {
		cfg := base
		cfg.KVDType = dt
		p, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		eb := kernels.PagedKV{DType: dt}.ElemBytes()
		if p.PageBytes()*4/eb != f32.PageBytes() || len(p.KV().Data)*4/eb != len(f32.KV().Data) {
			t.Fatalf("%s page is %d bytes, f32 %d", dt, p.PageBytes(), f32.PageBytes())
		}
		kv := p.KV()
		if kv.DType != dt {
			t.Fatalf("KV() says %s, pool holds %s", kv.DType, dt)
		}
		row := make([]float32, kv.RowFloats())
		all := make([]float32, cfg.NumPages*kv.PageElems())
		kv.LoadRow(0, all)
		for i, v := range all {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("%s fresh poisoned pool: element %d is %v", dt, i, v)
			}
		}
		a := mustAlloc(t, p, 1, 1)
		pg := a.Pages[0]
		for l := 0; l < kv.Layers; l++ {
			for s := 0; s < kv.PageSize; s++ {
				for j := range row {
					row[j] = float32(l*4+s) + float32(j)/4 // exact in bf16
				}
				kv.StoreRow(kv.KOffset(int(pg), l, s), row)
				kv.StoreRow(kv.VOffset(int(pg), l, s), row)
			}
		}
		packed := kernels.PackPage(kv, pg, kv.PageSize, nil)
		if len(packed) != p.PageBytes() {
			t.Fatalf("%s: a full page packs into %d bytes, the page is %d", dt, len(packed), p.PageBytes())
		}
		q, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := kernels.UnpackPage(q.KV(), 2, kv.PageSize, packed); err != nil {
			t.Fatal(err)
		}
		if got, want := kernels.PackPage(q.KV(), 2, kv.PageSize, nil), packed; string(got) != string(want) {
			t.Fatalf("%s: page differs after the round trip", dt)
		}
		q.KV().LoadRow(q.KV().VOffset(2, 1, 3), row)
		stored := make([]float32, len(row))
		kv.LoadRow(kv.VOffset(int(pg), 1, 3), stored)
		if row[5] != stored[5] || math.Abs(float64(row[5])-(7+5.0/4)) > 0.25 {
			t.Fatalf("%s: V layer 1 slot 3 [5] = %v after the round trip, stored %v", dt, row[5], stored[5])
		}
		if err := p.Release(a.Owner, a.Pages); err != nil {
			t.Fatal(err)
		}
		kv.LoadRow(kv.KOffset(int(pg), 1, 2), row)
		for j, v := range row {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("%s freed page: K[%d] = %v, want NaN", dt, j, v)
			}
		}
	}
	if _, err := New(Config{NumPages: 1, PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8, KVDType: kernels.Q8_0}); !errors.Is(err, ErrBadArg) {
		t.Fatalf("a q8_0 KV pool: %v", err)
	}
	// An fp8 page of 6 elements is not a whole number of Data's words.
	if _, err := New(Config{NumPages: 2, PageSize: 1, Layers: 1, KVHeads: 1, HeadDim: 3, KVDType: kernels.F8E4M3}); !errors.Is(err, ErrBadArg) {
		t.Fatalf("an fp8 pool of 6-byte pages: %v", err)
	}
}
