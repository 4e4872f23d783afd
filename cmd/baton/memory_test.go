package main

import (
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/model"
)

// --mem-fraction-static sizes weights and KV together: the pool gets the
// fraction of the device's memory left after the weights, or the server
// refuses to start when nothing is left.
func TestMemFractionStatic(t *testing.T) {
	old := deviceMemory
	defer func() { deviceMemory = old }()
	deviceMemory = func(kernels.Backend) (int64, error) { return 1 << 30, nil }
	budget, err := staticKVBudget(0.5, nil, 256<<20)
	if err != nil || budget != 256<<20 {
		t.Fatalf("budget %d, %v; want 256 MiB", budget, err)
	}
	if _, err := staticKVBudget(0.2, nil, 256<<20); err == nil || !strings.Contains(err.Error(), "leaves nothing") {
		t.Fatalf("weights larger than the fraction: %v", err)
	}
	// The budget, not --kv-cache-memory, sizes the pool.
	c := &model.Config{Layers: 2, KVHeads: 2, HeadDim: 32, ContextLength: 1 << 20}
	f := &serveFlags{pageSize: 16, kvCacheMemory: "1GiB", maxRunning: 1 << 20, kvCacheDType: "f32", memFractionStatic: 0.5, kvBudget: 1 << 20}
	p, err := planPool(f, c, kernels.F32)
	if err != nil {
		t.Fatal(err)
	}
	if want := int(1<<20) / c.KVBytesPerToken() / 16; p.pages != want {
		t.Fatalf("%d pages, want %d (1 MiB of KV)", p.pages, want)
	}
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"--mem-fraction-static", "0.8"}, ""},
		{[]string{"--mem-fraction-static", "1.5"}, "between 0 and 1"},
		{[]string{"--mem-fraction-static", "0.8", "--kv-cache-memory", "2GiB"}, "give one of them"},
	} {
		dryRun(t, tc.args, tc.err, "")
	}
}
