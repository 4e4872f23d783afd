package kvpool

import (
	"errors"
	"math"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kernels/ref"
)

func devicePool(t *testing.T, pages int, poison bool) (*Pool, *kernelstest.Memory) {
	t.Helper()
	cfg := Config{NumPages: pages, PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, Poison: poison}
	dev, err := kernelstest.Device{Backend: ref.New()}.AllocKV(kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8}, pages)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Device = dev
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p, dev.(*kernelstest.Memory)
}

// A pool in a backend's memory hands that memory out through KV and
// poisons it through the backend: all of it at start, then each page as it
// is freed (and not before, while a writer may still write it).
func TestDevicePoolPoison(t *testing.T) {
	p, m := devicePool(t, 3, true)
	kv := p.KV()
	if kv.Data != nil || kv.Device != m || kv.Pages() != 3 || p.PageData(0) != nil {
		t.Fatalf("KV of a device pool: data %d floats, device %T, %d pages", len(kv.Data), kv.Device, kv.Pages())
	}
	pf := kv.PageFloats()
	nan := func(page int) bool {
		s := m.Snapshot()[page*pf : (page+1)*pf]
		for _, f := range s {
			if !math.IsNaN(float64(f)) {
				return false
			}
		}
		return true
	}
	for pg := range 3 {
		if !nan(pg) {
			t.Fatalf("fresh poisoned device pool: page %d not NaN", pg)
		}
	}
	if err := m.Fill(nil, 1.5); err != nil {
		t.Fatal(err)
	}
	a := mustAlloc(t, p, 1, 2)
	if err := p.AttachWriter(a.Owner, a.Pages[1:]); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(a.Owner, a.Pages); err != nil {
		t.Fatal(err)
	}
	if !nan(int(a.Pages[0])) || nan(int(a.Pages[1])) || nan(2) {
		t.Fatal("release poisoned the wrong pages (want only the freed one, not the quarantined one or the free one)")
	}
	if err := p.WriterDone(a.Owner, a.Pages[1:]); err != nil {
		t.Fatal(err)
	}
	if !nan(int(a.Pages[1])) || nan(2) {
		t.Fatal("a drained page was not poisoned")
	}
}

func TestDevicePoolConfig(t *testing.T) {
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8}
	dev, _ := kernelstest.Device{Backend: ref.New()}.AllocKV(layout, 3)
	cfg := Config{NumPages: 4, PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, Device: dev}
	if _, err := New(cfg); !errors.Is(err, ErrBadArg) {
		t.Fatalf("device memory of 3 pages for a pool of 4: %v", err)
	}
	cfg.NumPages, cfg.Data = 3, make([]float32, 3*layout.PageFloats())
	if _, err := New(cfg); !errors.Is(err, ErrBadArg) {
		t.Fatalf("both Data and Device: %v", err)
	}
}
