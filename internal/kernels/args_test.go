package kernels

import (
	"strings"
	"testing"
)

func mustPanic(t *testing.T, want string, f func()) {
	t.Helper()
	defer func() {
		if r, _ := recover().(string); !strings.Contains(r, want) {
			t.Errorf("panic %q, want one naming %q", r, want)
		}
	}()
	f()
}

// The argument checks every backend shares refuse what would read or write
// outside a slice, and accept what fits.
func TestArgumentChecks(t *testing.T) {
	kv := PagedKV{PageSize: 4, Layers: 2, KVHeads: 1, HeadDim: 8}
	kv.Data = make([]float32, 3*kv.PageFloats())
	row := make([]float32, 8)
	mustPanic(t, "slot 12 outside the pool", func() { CheckStoreKV(kv, 0, []int32{12}, row, row) })
	mustPanic(t, "StoreKV layer 2", func() { CheckStoreKV(kv, 2, []int32{0}, row, row) })
	mustPanic(t, "page 3 out of range", func() {
		CheckAttention(8, 8, kv, 0, []AttnSeq{{Pages: []int32{3}, QLen: 1, KVLen: 1}}, 1)
	})
	mustPanic(t, "Attention Pages", func() {
		CheckAttention(8, 8, kv, 0, []AttnSeq{{Pages: []int32{0}, QLen: 1, KVLen: 5}}, 1)
	})
	mustPanic(t, "Attention q", func() { CheckAttention(8, 7, kv, 0, []AttnSeq{{Pages: []int32{0}, QLen: 1, KVLen: 1}}, 1) })
	mustPanic(t, "Add operand 1", func() { CheckElementwise("Add", 8, row, row[:7]) })
	w := &Matrix{DType: F32, Rows: 2, Cols: 8, Data: make([]byte, 64)}
	mustPanic(t, "Embed id 2 out of range", func() { CheckEmbed(make([]float32, 8), w, []int32{2}) })
	mustPanic(t, "MatMul x", func() { CheckMatMul(make([]float32, 2), row[:7], 1, w) })
	mustPanic(t, "RoPE dim 10 > head dim 8", func() { CheckRoPE(row, 1, 1, 8, RoPE{Dim: 10}) })

	// What fits passes.
	CheckStoreKV(kv, 1, []int32{11}, row, row)
	CheckAttention(8, 8, kv, 1, []AttnSeq{{Pages: []int32{2, 0}, QLen: 1, KVLen: 5}}, 1)
	CheckEmbed(make([]float32, 16), w, []int32{1, 0})
	CheckMatMul(make([]float32, 2), row, 1, w)
}

// Experts calls are checked the same way: one shape for every expert,
// every pick one of them, slices long enough for n rows.
func TestCheckExperts(t *testing.T) {
	m := func(rows, cols int) *Matrix {
		return &Matrix{DType: F32, Rows: rows, Cols: cols, Data: make([]byte, 4*rows*cols)}
	}
	ex := []Expert{{m(4, 8), m(4, 8), m(8, 4)}, {m(4, 8), m(4, 8), m(8, 4)}}
	row, pick, weight := make([]float32, 16), []int32{1, 0, 0, 1}, make([]float32, 4)
	CheckExperts(row, row, 2, ex, pick, weight, 2)
	mustPanic(t, "pick[3] = 2 of 2 experts", func() { CheckExperts(row, row, 2, ex, []int32{1, 0, 0, 2}, weight, 2) })
	mustPanic(t, "Experts with 2 experts, 3 a row", func() { CheckExperts(row, row, 1, ex, pick, weight, 3) })
	mustPanic(t, "Experts x", func() { CheckExperts(row, row[:15], 2, ex, pick, weight, 2) })
	mustPanic(t, "Experts weight", func() { CheckExperts(row, row, 2, ex, pick, weight[:3], 2) })
	odd := []Expert{ex[0], {m(4, 8), m(4, 8), m(8, 8)}}
	mustPanic(t, "expert 1 is not 4x8", func() { CheckExperts(row, row, 2, odd, pick, weight, 2) })
}

// A pool in a backend's own memory is refused by code that reads Data.
func TestCheckHostKV(t *testing.T) {
	kv := PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8}
	mustPanic(t, "the cpu backend needs the KV pool in host memory", func() { CheckHostKV("the cpu backend", kv) })
	kv.Device = fakeDeviceKV{}
	mustPanic(t, "needs the KV pool in host memory", func() { CheckHostKV("x", kv) })
	kv.Device, kv.Data = nil, make([]float32, kv.PageFloats())
	CheckHostKV("x", kv)
	if kv.Pages() != 1 || (PagedKV{Device: fakeDeviceKV{}}).Pages() != 7 {
		t.Fatal("Pages does not count the memory that holds the pool")
	}
}

type fakeDeviceKV struct{}

func (fakeDeviceKV) Pages() int                                  { return 7 }
func (fakeDeviceKV) ReadPage(int32, int, []byte) ([]byte, error) { return nil, nil }
func (fakeDeviceKV) WritePage(int32, int, []byte) error          { return nil }
func (fakeDeviceKV) Fill([]int32, float32) error                 { return nil }
func (fakeDeviceKV) Close() error                                { return nil }
