package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/test/harness"
)

// overload sends n requests at once and returns how many got each status,
// failing on a 429 without Retry-After or a body not in OpenAI's shape.
func overload(t *testing.T, url string, n int, body string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, hdr, b := post(t, url+"/v1/completions", body)
			if code == 429 {
				if hdr.Get("Retry-After") == "" {
					t.Errorf("429 without Retry-After: %s", b)
				}
				requireOpenAIError(t, "429", b)
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return codes
}

// A standalone server whose queue is full answers 429 with Retry-After,
// which OpenAI's SDKs retry, and serves what it admitted.
func TestQueueFull429Standalone(t *testing.T) {
	s := startServer(t, "--model", slowModel(t), "--load-format", "dummy", "--served-model-name", "dummy",
		"--max-running-requests", "1", "--max-queued-requests", "1")
	codes := overload(t, s.URL, 6, `{"model":"dummy","prompt":"Once upon a time","max_tokens":16,"ignore_eos":true}`)
	t.Logf("statuses %v", codes)
	if codes[429] == 0 || codes[200] == 0 || codes[200]+codes[429] != 6 {
		t.Fatalf("statuses %v: want 200s for the admitted and 429s for the rest", codes)
	}
}

// Through the router, a prefill worker whose queue stays full past the
// retries is a 429 with Retry-After too, not a 503.
func TestQueueFull429Router(t *testing.T) {
	cfg := slowModel(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1,
		WorkerArgs:  []string{"--model", cfg, "--load-format", "dummy", "--served-model-name", "dummy"},
		PrefillArgs: []string{"--max-running-requests", "1", "--max-queued-requests", "1"},
		RouterArgs:  []string{"--served-model-name", "dummy"}})
	prompt := strings.Repeat("Once upon a time there was a little dog. ", 20)
	codes := overload(t, c.Router.URL, 8, fmt.Sprintf(`{"model":"dummy","prompt":%q,"max_tokens":2,"ignore_eos":true}`, prompt))
	t.Logf("statuses %v", codes)
	if codes[429] == 0 || codes[200]+codes[429] != 8 {
		t.Fatalf("statuses %v: want 200s and 429s only", codes)
	}
}

// Through the router, requests that each need the whole decode pool wait
// in the router's queue for it, as standalone's queue makes them wait,
// and all get 200; the router's queue is in its metrics.
func TestRouterQueuesForTheDecodePool(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1,
		WorkerArgs: []string{"--page-size", "4"}, DecodeArgs: []string{"--max-total-tokens", "64"}})
	// A 4-token prompt and 56 tokens to generate: 15 of the pool's 16
	// pages, so one request at a time.
	codes := overload(t, c.Router.URL, 4, `{"model":"stories260K","prompt":"Once upon a","max_tokens":56,"ignore_eos":true}`)
	if codes[200] != 4 {
		t.Fatalf("statuses %v: want four 200s", codes)
	}
	_, b := get(t, c.Router.URL+"/metrics")
	if n := metrics.ParseText(string(b))["baton_requests_queued_total"]; n < 1 {
		t.Errorf("baton_requests_queued_total = %v: no request waited in the router's queue", n)
	}
}
