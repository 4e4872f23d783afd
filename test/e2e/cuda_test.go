package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// The real binary with --device cuda. Here it runs on the emulated CUDA
// driver and cuBLAS (internal/kernels/cuda/fakecuda, found through
// LD_LIBRARY_PATH as a real installation would be): the whole CUDA backend
// above the driver runs, KV pools in "GPU" memory included. With
// BATON_REQUIRE_GPU=1 (test/gpu/run.sh) the same tests run on the real
// driver and GPU.

// cudaEnv is the environment that makes a worker load the fake driver
// (built once per test binary), or nothing on a GPU machine.
func cudaEnv(t *testing.T) []string { t.Helper(); return harness.FakeCUDAEnv(t) }

// checkOnCUDA fails unless the worker runs the cuda backend with its KV
// pool in device memory (what its start-up log says).
func checkOnCUDA(t *testing.T, s *server, memory string) {
	t.Helper()
	log := s.Stderr()
	if !strings.Contains(log, "device=\"device cuda:0:") || !strings.Contains(log, memory) {
		t.Fatalf("%s does not run on cuda with %s:\n%s", s.URL, memory, log)
	}
}

// checkKVDType fails unless the worker reports storing KV as dt.
func checkKVDType(t *testing.T, w *server, dt string) {
	t.Helper()
	var info struct {
		DType string `json:"kv_cache_dtype"`
	}
	if code, b := harness.Get(t, w.URL+"/server_info"); code != 200 || json.Unmarshal(b, &info) != nil || info.DType != dt {
		t.Fatalf("%s /server_info: %d %s; want kv_cache_dtype %s", w.URL, code, b, dt)
	}
}

// greedyText fails unless the greedy completion of the reference's prompt
// is the reference's text, token for token (its logprobs are not
// compared: narrow KV moves them).
func greedyText(t *testing.T, url string, ref reference, what string) {
	t.Helper()
	code, _, b := post(t, url+"/v1/completions", greedyBody(ref))
	var got completion
	if code != 200 || json.Unmarshal(b, &got) != nil || len(got.Choices) != 1 || got.Choices[0].Text != ref.GeneratedText {
		t.Fatalf("%s: %d %s\nwant text %q", what, code, b, ref.GeneratedText)
	}
}

// Prefill and decode on the cuda backend over tcp: the prompt's pages go
// from one GPU pool through pinned staging and the network into the
// other, and the greedy output equals the public reference.
func TestPDOnCUDA(t *testing.T) {
	ref := loadReference(t)
	env := cudaEnv(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, PrefillEnv: env, DecodeEnv: env,
		WorkerArgs: []string{"--device", "cuda", "--max-total-tokens", "1024", "--page-size", "4", "--chunked-prefill-size", "8"}})
	for _, w := range c.Workers() {
		checkOnCUDA(t, w, "memory=cuda")
	}
	greedyConcurrently(t, c.Router.URL, ref, 2)
	c.WaitClean(t)
	if m := metricsOf(t, c.Decode[0]); m["baton_handoff_failures_total"] != 0 || m["baton_nan_logits_total"] != 0 {
		t.Fatalf("decode: %v handoff failures, %v NaN logits", m["baton_handoff_failures_total"], m["baton_nan_logits_total"])
	}
}

// Prefill and decode on cuda over cuda-ipc: prefill stages each prompt
// page in its arena (GPU memory the decode process maps by handle, here
// shared memory under the emulated driver) and decode copies it into the
// page it reserved itself, GPU to GPU, through the same gate as a tcp
// frame. Two real processes; the greedy output equals the public
// reference, every page went the device way, and nothing is left held.
func TestPDOverCUDAIPC(t *testing.T) {
	ref := loadReference(t)
	env := cudaEnv(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, PrefillEnv: env, DecodeEnv: env,
		WorkerArgs: []string{"--device", "cuda", "--transport", "cuda-ipc", "--max-total-tokens", "1024", "--page-size", "4", "--chunked-prefill-size", "8"}})
	for _, w := range c.Workers() {
		checkOnCUDA(t, w, "memory=cuda")
	}
	greedyConcurrently(t, c.Router.URL, ref, 2)
	c.WaitClean(t)
	pm, dm := metricsOf(t, c.Prefill[0]), metricsOf(t, c.Decode[0])
	if dev, host := pm[`baton_kv_pages_shipped_total{from="device",role="prefill"}`], pm[`baton_kv_pages_shipped_total{from="host",role="prefill"}`]; dev == 0 || host != 0 {
		t.Fatalf("prefill shipped %v pages from the device and %v from the host; want all from the device", dev, host)
	}
	if dm["baton_handoff_failures_total"] != 0 || dm["baton_kv_transfer_bytes_total"] == 0 {
		t.Fatalf("decode: %v handoff failures, %v bytes landed", dm["baton_handoff_failures_total"], dm["baton_kv_transfer_bytes_total"])
	}
}

// Prefill and decode on cuda over cuda-ipc with fp8 KV: the pages are a
// quarter of f32's bytes, packed, summed and copied through the arena in
// the page kernels' 2-byte units, and attention reads the e4m3 values.
// Both workers report the dtype, the greedy output still equals the
// public reference (fp8 keeps the bundled model's greedy tokens), every
// page went the device way, and no NaN was read.
func TestPDOverCUDAIPCFP8(t *testing.T) {
	ref := loadReference(t)
	env := cudaEnv(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, PrefillEnv: env, DecodeEnv: env,
		WorkerArgs: []string{"--device", "cuda", "--transport", "cuda-ipc", "--kv-cache-dtype", "fp8_e4m3",
			"--max-total-tokens", "1024", "--page-size", "4", "--chunked-prefill-size", "8"}})
	for _, w := range c.Workers() {
		checkOnCUDA(t, w, "memory=cuda")
		checkKVDType(t, w, "fp8_e4m3")
	}
	greedyText(t, c.Router.URL, ref, "fp8 KV over cuda-ipc")
	c.WaitClean(t)
	pm, dm := metricsOf(t, c.Prefill[0]), metricsOf(t, c.Decode[0])
	if dev, host := pm[`baton_kv_pages_shipped_total{from="device",role="prefill"}`], pm[`baton_kv_pages_shipped_total{from="host",role="prefill"}`]; dev == 0 || host != 0 {
		t.Fatalf("prefill shipped %v pages from the device and %v from the host; want all from the device", dev, host)
	}
	if dm["baton_handoff_failures_total"] != 0 || dm["baton_nan_logits_total"] != 0 {
		t.Fatalf("decode: %v handoff failures, %v NaN logits", dm["baton_handoff_failures_total"], dm["baton_nan_logits_total"])
	}
}

// A prefill worker on cuda leaves the KV dtype to auto (bf16 there) and a
// decode worker on the cpu backend stores bf16 too: they pair (the
// dtypes match), the prompt's bf16 pages cross from the GPU pool to host
// memory, and the greedy output still continues the public reference
// token for token (bf16 KV keeps the bundled model's greedy tokens).
func TestPDCUDAPrefillHalfKV(t *testing.T) {
	ref := loadReference(t)
	env := cudaEnv(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, PrefillEnv: env, AutoKV: true,
		WorkerArgs:  []string{"--max-total-tokens", "1024", "--page-size", "4", "--chunked-prefill-size", "8"},
		PrefillArgs: []string{"--device", "cuda"}, DecodeArgs: []string{"--kv-cache-dtype", "bf16"}})
	checkOnCUDA(t, c.Prefill[0], "memory=cuda")
	for _, w := range c.Workers() {
		checkKVDType(t, w, "bf16")
	}
	greedyText(t, c.Router.URL, ref, "bf16 KV from cuda")
	c.WaitClean(t)
	if m := metricsOf(t, c.Decode[0]); m["baton_handoff_failures_total"] != 0 || m["baton_nan_logits_total"] != 0 {
		t.Fatalf("decode: %v handoff failures, %v NaN logits", m["baton_handoff_failures_total"], m["baton_nan_logits_total"])
	}
}

// Sampling on the device (--device cuda samples where the logits are):
// the greedy reference with its top-5 logprobs, a seeded draw that comes
// out the same alone and in a batch of other requests (each row draws
// with its own request's numbers), and a completion with prompt logprobs
// (those rows go to the host) next to them. No NaN flag may fire.
func TestSamplingOnCUDA(t *testing.T) {
	ref := loadReference(t)
	s := harness.StartWith(t, harness.Options{Env: cudaEnv(t)}, "--device", "cuda", "--max-total-tokens", "2048", "--kv-poison")
	checkOnCUDA(t, s, "memory=cuda")
	var c completion
	code, _, b := post(t, s.URL+"/v1/completions", greedyBody(ref))
	if code != 200 || json.Unmarshal(b, &c) != nil {
		t.Fatalf("greedy: %d %s", code, b)
	}
	checkGreedy(t, ref, c)

	seeded := func(seed int) string {
		return fmt.Sprintf(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":32,"temperature":0.9,"top_p":0.9,"top_k":40,"min_p":0.02,"presence_penalty":0.3,"seed":%d}`, seed)
	}
	text := func(body []byte) string {
		var c completion
		if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 {
			t.Fatalf("completion: %s", body)
		}
		return c.Choices[0].Text
	}
	_, _, b = post(t, s.URL+"/v1/completions", seeded(7))
	alone := text(b)
	var wg sync.WaitGroup
	texts := make([]string, 6)
	for i := range texts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := seeded(7)
			switch i % 3 {
			case 1:
				body = seeded(100 + i)
			case 2:
				body = `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"echo":true,"logprobs":2,"temperature":1,"seed":3}`
			}
			_, _, b := post(t, s.URL+"/v1/completions", body)
			texts[i] = text(b)
		}()
	}
	wg.Wait()
	for i := 0; i < len(texts); i += 3 {
		if texts[i] != alone {
			t.Fatalf("seed 7 in a batch gave %q, alone %q", texts[i], alone)
		}
	}
	if m := metricsOf(t, s); m["baton_nan_logits_total"] != 0 {
		t.Fatalf("%v NaN logits", m["baton_nan_logits_total"])
	}
}
