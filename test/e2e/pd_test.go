package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

func startCluster(t *testing.T, nPrefill, nDecode int, workerArgs, decodeArgs []string) *harness.Cluster {
	t.Helper()
	return harness.StartCluster(t, harness.ClusterOptions{Prefill: nPrefill, Decode: nDecode, WorkerArgs: workerArgs, DecodeArgs: decodeArgs})
}

// greedyConcurrently sends n greedy reference requests at once and checks
// that each gets the reference text.
func greedyConcurrently(t *testing.T, url string, ref reference, n int) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, _, body := post(t, url+"/v1/completions", greedyBody(ref))
			var got completion
			if err := json.Unmarshal(body, &got); err != nil || code != 200 {
				t.Errorf("concurrency %d request %d: status %d: %s", n, i, code, body)
				return
			}
			checkGreedy(t, ref, got)
		}()
	}
	wg.Wait()
}

func TestPDGreedyReference(t *testing.T) {
	ref := loadReference(t)
	c := startCluster(t, 1, 1, nil, nil)
	for _, n := range []int{1, 16} {
		greedyConcurrently(t, c.Router.URL, ref, n)
	}
	c.WaitClean(t)
	m := metricsOf(t, c.Decode[0])
	if m["baton_kv_reservations_total"] != 17 || m["baton_handoff_failures_total"] != 0 || m["baton_kv_transfer_bytes_total"] <= 0 {
		t.Fatalf("decode handoff metrics: reservations %v failures %v bytes %v", m["baton_kv_reservations_total"],
			m["baton_handoff_failures_total"], m["baton_kv_transfer_bytes_total"])
	}
}

func TestPDTwoByTwoMatchesStandalone(t *testing.T) {
	c := startCluster(t, 2, 2, []string{"--page-size", "4", "--chunked-prefill-size", "8"}, nil)
	sa := startServer(t, "--kv-poison")
	prompts := []string{"Once upon a time", "The cat sat on the", "Lily and Ben went to the park. They", "One day, a little bird"}
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		for _, p := range prompts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":40,"temperature":0}`, p)
				var got, want completion
				code1, _, b1 := post(t, c.Router.URL+"/v1/completions", body)
				code2, _, b2 := post(t, sa.URL+"/v1/completions", body)
				_ = json.Unmarshal(b1, &got)
				_ = json.Unmarshal(b2, &want)
				if code1 != 200 || code2 != 200 || len(got.Choices) != 1 || len(want.Choices) != 1 || got.Choices[0].Text != want.Choices[0].Text {
					t.Errorf("prompt %q: PD %d %s\nstandalone %d %s", p, code1, b1, code2, b2)
				}
			}()
		}
		wg.Wait()
	}
	// Both decode workers took part.
	for _, d := range c.Decode {
		if metricsOf(t, d)["baton_kv_reservations_total"] == 0 {
			t.Fatalf("decode %s got no reservations", d.URL)
		}
	}
	c.WaitClean(t)
}

// A prompt under the model's context but over the decode pool is refused at
// the router with 400, and no reservation is made anywhere.
func TestPDPromptOverDecodePool(t *testing.T) {
	c := startCluster(t, 1, 1, nil, []string{"--max-total-tokens", "64", "--page-size", "16"})
	long := strings.Repeat("Once upon a time there was a cat. ", 12) // ~100 tokens: < 512, > 64
	code, _, body := post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":4}`, long))
	var e apiError
	if err := json.Unmarshal(body, &e); err != nil || code != 400 || e.Error.Type != "invalid_request_error" {
		t.Fatalf("over-pool prompt: %d %s", code, body)
	}
	if m := metricsOf(t, c.Decode[0]); m["baton_kv_reservations_total"] != 0 {
		t.Fatalf("a reservation was made: %v", m["baton_kv_reservations_total"])
	}
	if code, _, body := post(t, c.Router.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8}`); code != 200 {
		t.Fatalf("a prompt that fits: %d %s", code, body)
	}
	c.WaitClean(t)
}

// 200 mixed requests, some streamed, some cut off by their client at a random
// moment; afterwards every worker has all its pages back and none quarantined.
func TestPDMixedLoadWithDisconnects(t *testing.T) {
	c := startCluster(t, 2, 2, []string{"--page-size", "8", "--chunked-prefill-size", "16"}, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	prompts := []string{"Once upon a time", "The dog", "Tom had a red ball. He", "Mom said"}
	type job struct {
		prompt string
		stream bool
		cutMs  int // 0: read to the end
		max    int
	}
	jobs := make([]job, 200)
	for i := range jobs {
		jobs[i] = job{prompts[rng.IntN(len(prompts))], rng.IntN(2) == 0, 0, 8 + rng.IntN(56)}
		if rng.IntN(3) == 0 {
			jobs[i].cutMs = 1 + rng.IntN(40)
		}
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok200 := 0
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if j.cutMs > 0 {
				time.AfterFunc(time.Duration(j.cutMs)*time.Millisecond, cancel)
			}
			body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"stream":%v,"ignore_eos":true}`, j.prompt, j.max, j.stream)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.Router.URL+"/v1/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				if j.cutMs == 0 {
					t.Errorf("request failed: %v", err)
				}
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
			}
			if resp.StatusCode == 200 && sc.Err() == nil {
				mu.Lock()
				ok200++
				mu.Unlock()
			} else if j.cutMs == 0 {
				t.Errorf("uncut request: status %d, read error %v", resp.StatusCode, sc.Err())
			}
		}()
	}
	wg.Wait()
	if ok200 < 100 {
		t.Fatalf("only %d of 200 requests completed", ok200)
	}
	c.WaitClean(t)
	for _, w := range c.Workers() {
		if m := metricsOf(t, w); m["baton_kv_read_gate_failures_total"] != 0 {
			t.Fatalf("%s: read gate failures %v", w.URL, m["baton_kv_read_gate_failures_total"])
		}
	}
}

// Killing a worker: the router routes around it, and takes it back once it is
// restarted on the same URL.
func TestPDKillAndRestartWorker(t *testing.T) {
	c := startCluster(t, 2, 2, nil, nil)
	body := `{"model":"stories260K","prompt":"Once upon a time","max_tokens":16,"temperature":0}`
	victim := c.Decode[1]
	u, _ := url.Parse(victim.URL)
	_ = victim.Signal(syscall.SIGKILL)
	<-victim.Exited()
	// Requests keep succeeding: before the router's health check notices, a
	// failed reservation is retried on the other pair.
	for i := 0; i < 10; i++ {
		if code, _, b := post(t, c.Router.URL+"/v1/completions", body); code != 200 {
			t.Fatalf("request %d with a dead decode worker: %d %s", i, code, b)
		}
	}
	restarted := startServer(t, "--role", "decode", "--kv-poison", "--port", u.Port())
	deadline := time.Now().Add(15 * time.Second)
	for metricsOf(t, restarted)["baton_kv_reservations_total"] == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the router never sent work to the restarted decode worker")
		}
		if code, _, b := post(t, c.Router.URL+"/v1/completions", body); code != 200 {
			t.Fatalf("after restart: %d %s", code, b)
		}
	}
	c.Decode[1] = restarted
	c.WaitClean(t)
}

func TestPDOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found in PATH; install Node.js and npm (.ci/run does)")
	}
	root := repoRoot(t)
	dir := filepath.Join(root, "test", "openai")
	if stale, why := nodeModulesStale(dir); stale {
		t.Logf("npm ci in test/openai: %s", why)
		if _, err := runCommand(t.Context(), 5*time.Minute, dir, cleanEnv(), "npm", "ci", "--no-audit", "--no-fund"); err != nil {
			t.Fatal(err)
		}
	}
	// Decode speculates: the checks hold as they do without it, and usage
	// carries the speculation figures through the SDK.
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, RouterArgs: []string{"--tool-call-parser", "hermes"},
		DecodeArgs: []string{"--speculative-algorithm", "ngram"}})
	out, err := runCommand(t.Context(), 2*time.Minute, root, append(cleanEnv(), "EXPECT_SPEC_USAGE=1"), node, filepath.Join("test", "openai", "client.mjs"), c.Router.URL, bundledModel)
	if err != nil {
		t.Fatalf("OpenAI client through the router: %v\n%s", err, out)
	}
	c.WaitClean(t)
}

// A list of prompts through router, prefill and decode is one request with
// a choice per prompt, in prompt order: the reference prompt's choice is
// the reference text and the other's is what that prompt gets alone, and
// every page comes back.
func TestPDPromptBatch(t *testing.T) {
	ref := loadReference(t)
	c := startCluster(t, 1, 1, nil, nil)
	n := len(ref.GeneratedIDs)
	alone := ask(t, c.Router.URL, "/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":"Lily was","max_tokens":%d,"temperature":0}`, n)).texts()
	got := ask(t, c.Router.URL, "/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":[%q,"Lily was"],"max_tokens":%d,"temperature":0}`, ref.Prompt, n)).texts()
	if len(got) != 2 || got[0] != ref.GeneratedText || got[1] != alone[0] {
		t.Fatalf("choices %q, want [%q %q]", got, ref.GeneratedText, alone[0])
	}
	c.WaitClean(t)
}
