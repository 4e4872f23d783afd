package cuda

import (
	"fmt"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// TestFakeAllocKVTooLarge: a pool the device cannot hold is an error that
// says what and how much, and nothing is left allocated.
func TestFakeAllocKVTooLarge(t *testing.T) {
	b := fakeBackend(t)
	_, err := b.AllocKV(kernels.PagedKV{PageSize: 16, Layers: 32, KVHeads: 8, HeadDim: 128}, 1<<26)
	if err == nil || !strings.Contains(err.Error(), "for the KV pool") {
		t.Fatalf("a 32 TiB pool: %v", err)
	}
	if len(b.pools) != 0 {
		t.Fatalf("%d pools tracked after a failed AllocKV", len(b.pools))
	}
}

// TestFakeAllocKVDTypeRefused: KV is stored as f32, f16 or bf16; a pool
// of another dtype is refused by name when it is allocated.
func TestFakeAllocKVDTypeRefused(t *testing.T) {
	b := fakeBackend(t)
	for _, dt := range []kernels.DType{kernels.Q8_0, kernels.Q4_K} {
		_, err := b.AllocKV(kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: dt}, 4)
		if err == nil || !strings.Contains(err.Error(), "KV cache dtype "+dt.String()) {
			t.Fatalf("%s pool: %v", dt, err)
		}
	}
	if len(b.pools) != 0 {
		t.Fatalf("%d pools tracked after refused AllocKVs", len(b.pools))
	}
}

// TestFakeKVLayoutMismatch: kernels refuse a pool described with another
// layout than it was allocated with (they would address past it).
func TestFakeKVLayoutMismatch(t *testing.T) {
	b := fakeBackend(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8}
	dk, err := b.AllocKV(layout, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dk.Close()
	kv := layout
	kv.Device, kv.HeadDim = dk, 16
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "used as") {
			t.Fatalf("StoreKV into a pool of another layout: recovered %v", r)
		}
	}()
	b.StoreKV(kv, 0, []int32{0}, make([]float32, 32), make([]float32, 32))
}

// TestFakeKVReadOrdering: a page read waits for the backend's stream only
// while a store into that page may still be queued there; a read of other
// pages, or after the stream was drained (as every forward pass ends), does
// not.
func TestFakeKVReadOrdering(t *testing.T) {
	b := fakeBackend(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8}
	dk, err := b.AllocKV(layout, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dk.Close()
	kp := dk.(*KVPool)
	kv := layout
	kv.Device = dk
	pending := func(page int) bool { return kp.stored[page].Load() > b.storesDone.Load() }
	b.StoreKV(kv, 0, []int32{5, 6}, make([]float32, 16), make([]float32, 16)) // page 1
	if !pending(1) || pending(0) || pending(2) {
		t.Fatalf("after a store into page 1: pending %v %v %v", pending(0), pending(1), pending(2))
	}
	out := make([]float32, 8)
	b.Add(out, make([]float32, 8), make([]float32, 8)) // reads its result back: the stream is drained
	if pending(1) {
		t.Fatal("page 1 still counts a store as queued after the stream was drained")
	}
}

// TestFakeKVReadsWaitForStores: a read of pages, one or several at once,
// is ordered after a store into any of them that may still be queued on
// the backend's stream (the pages would otherwise leave half written), and
// only then.
func TestFakeKVReadsWaitForStores(t *testing.T) {
	b := fakeBackend(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8, DType: kernels.BF16}
	dk, err := b.AllocKV(layout, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dk.Close()
	kp := dk.(*KVPool)
	kv := layout
	kv.Device = dk
	for _, c := range []struct {
		name string
		read func() error
		wait bool
	}{
		{"ReadPages of pages 0 and 2", func() error { _, err := kp.ReadPages([]int32{0, 2}, []int{4, 4}); return err }, false},
		{"ReadPages of pages 0 and 1", func() error { _, err := kp.ReadPages([]int32{0, 1}, []int{4, 4}); return err }, true},
		{"ReadPage of page 1", func() error { _, err := kp.ReadPage(1, 4, nil); return err }, true},
		{"ReadPage of page 3", func() error { _, err := kp.ReadPage(3, 4, nil); return err }, false},
	} {
		b.StoreKV(kv, 0, []int32{5}, make([]float32, 8), make([]float32, 8)) // page 1, left queued
		before := kp.waits
		if err := c.read(); err != nil {
			t.Fatal(err)
		}
		if waited := kp.waits > before; waited != c.wait {
			t.Errorf("%s after a store into page 1: waited %v, want %v", c.name, waited, c.wait)
		}
	}
}
