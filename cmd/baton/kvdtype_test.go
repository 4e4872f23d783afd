package main

import (
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
)

// --kv-cache-dtype takes auto, f32, f16, bf16 and fp8_e4m3 (not on the
// router, on either transport), and anything else is refused by name.
func TestKVCacheDTypeFlag(t *testing.T) {
	router := []string{"--role", "router", "--prefill", "http://a:1", "--decode", "http://b:2"}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--kv-cache-dtype", "auto"}, ""},
		{[]string{"--kv-cache-dtype", "f16"}, ""},
		{[]string{"--role", "decode", "--kv-cache-dtype", "bf16"}, ""},
		{[]string{"--role", "decode", "--kv-cache-dtype", "fp8_e4m3"}, ""},
		{[]string{"--kv-cache-dtype", "q8_0"}, `unknown --kv-cache-dtype "q8_0"`},
		{append(router, "--kv-cache-dtype", "f16"), "--kv-cache-dtype (standalone, prefill, decode only)"},
	} {
		dryRun(t, c.args, c.err, "")
	}
}

// A --kv-cache-memory budget holds twice the pages of f16 or bf16 KV and
// four times those of fp8, and auto is f16 on a backend that names no
// dtype of its own (the cpu and reference backends), that backend's on
// one that does (an f32 one here).
func TestPlanPoolCountsKVDType(t *testing.T) {
	c := &model.Config{Layers: 4, KVHeads: 2, HeadDim: 16, ContextLength: 1 << 20}
	pages := map[string]int{}
	for _, dt := range []string{"auto", "f32", "f16", "bf16", "fp8"} {
		f := &serveFlags{pageSize: 16, kvCacheMemory: "1MiB", maxRunning: 64, kvCacheDType: dt}
		kvdt, err := parseKVDType(dt, ref.New())
		if err != nil {
			t.Fatal(err)
		}
		p, err := planPool(f, c, kvdt)
		if err != nil {
			t.Fatal(err)
		}
		pages[dt] = p.pages
	}
	// f32: 4 layers x 2 x 32 floats x 4 bytes = 1 KiB a token, 64 pages.
	if pages["auto"] != 128 || pages["f32"] != 64 || pages["f16"] != 128 || pages["bf16"] != 128 || pages["fp8"] != 256 {
		t.Fatalf("pages from a 1MiB budget: %v", pages)
	}
	if dt, err := parseKVDType("auto", f32KVBackend{}); err != nil || dt != kernels.F32 {
		t.Fatalf("auto on a backend whose KV dtype is f32: %v %v", dt, err)
	}
}

// fp8 KV is refused on the cpu backend, whose attention does not read it,
// when the worker starts (not when a request reaches attention), naming
// the backend and the way out; the cuda backend's name for it, fp8, is
// the same dtype, and a backend that stores it takes it.
func TestKVCacheDTypeFP8(t *testing.T) {
	for _, name := range []string{"fp8", "FP8_E4M3"} {
		_, err := parseKVDType(name, cpu.New(1))
		if err == nil || !strings.Contains(err.Error(), "not served by the cpu backend") || !strings.Contains(err.Error(), "--device cuda") {
			t.Fatalf("--kv-cache-dtype %s on the cpu backend: %v", name, err)
		}
		if dt, err := parseKVDType(name, ref.New()); err != nil || dt != kernels.F8E4M3 {
			t.Fatalf("--kv-cache-dtype %s on a backend that stores fp8: %v %v", name, dt, err)
		}
	}
	if dt, err := parseKVDType("bf16", cpu.New(1)); err != nil || dt != kernels.BF16 {
		t.Fatalf("bf16 on the cpu backend: %v %v", dt, err)
	}
}

// f32KVBackend names f32 as its KV dtype, as the cuda backend does.
type f32KVBackend struct{ kernels.Backend }

func (f32KVBackend) AutoKVDType() kernels.DType { return kernels.F32 }
