package e2e

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// slowModel writes a config for a dummy model slow enough on CPU (tens of
// tokens per second) that a request is still running when a signal arrives.
// Its vocabulary matches the bundled tokenizer's.
func slowModel(t *testing.T) string {
	dir := t.TempDir()
	cfg := `{"architectures":["LlamaForCausalLM"],"vocab_size":512,"hidden_size":1024,"num_hidden_layers":8,
"num_attention_heads":8,"num_key_value_heads":8,"intermediate_size":4096,"max_position_embeddings":1024,"rms_norm_eps":1e-5}`
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// streamUntilFirstChunk starts a streaming completion and returns once the
// first data line arrived, with the rest of the stream still to read.
func streamUntilFirstChunk(t *testing.T, base string, maxTokens int) (*http.Response, *bufio.Scanner) {
	t.Helper()
	body := `{"model":"dummy","prompt":"Once upon a time","max_tokens":` + strconv.Itoa(maxTokens) + `,"ignore_eos":true,"stream":true}`
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			return resp, sc
		}
	}
	t.Fatalf("stream ended before its first chunk: %v", sc.Err())
	return nil, nil
}

// readToEnd reads the rest of a stream and returns its last finish reason
// and whether it ended with [DONE].
func readToEnd(sc *bufio.Scanner) (finish string, done bool) {
	for sc.Scan() {
		line := sc.Text()
		if line == "data: [DONE]" {
			done = true
		}
		if i := strings.Index(line, `"finish_reason":"`); i >= 0 {
			finish = strings.SplitN(line[i+len(`"finish_reason":"`):], `"`, 2)[0]
		}
	}
	return finish, done
}

// On SIGTERM a standalone server stops taking requests, lets the running one
// finish, and exits 0. While it drains its port stays open, as a worker's
// does: /health answers 503 so that a load balancer stops sending, and a
// new request is refused with 503 and Retry-After.
func TestGracefulShutdownStandalone(t *testing.T) {
	drainsWhileStreaming(t, startServer(t, "--model", slowModel(t), "--load-format", "dummy", "--served-model-name", "dummy"))
}

// SIGTERM to the router in the middle of a stream: the same, for the
// stream it relays.
func TestGracefulShutdownRouter(t *testing.T) {
	args := []string{"--model", slowModel(t), "--load-format", "dummy", "--served-model-name", "dummy"}
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: args, RouterArgs: []string{"--served-model-name", "dummy"}})
	drainsWhileStreaming(t, c.Router)
}

// drainsWhileStreaming sends s SIGTERM in the middle of a stream: its port
// stays open, /health says 503, a new request gets an OpenAI-shaped 503
// with Retry-After, the stream finishes, and s exits 0. The check holds
// with no window: every role refuses new work before /health turns 503
// (server.Drain does both as one step), so a request sent after the first
// 503 is refused however loaded the machine is.
func drainsWhileStreaming(t *testing.T, s *server) {
	t.Helper()
	resp, sc := streamUntilFirstChunk(t, s.URL, 40)
	defer resp.Body.Close()
	if err := s.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		hresp, err := http.Get(s.URL + "/health")
		if err != nil {
			t.Fatalf("/health while draining: %v (the port closed before the running request finished)", err)
		}
		hb, _ := io.ReadAll(hresp.Body)
		hresp.Body.Close()
		if hresp.StatusCode == http.StatusServiceUnavailable {
			if !strings.Contains(string(hb), "draining") {
				t.Fatalf("/health after SIGTERM: 503 %s, not draining", hb)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health still %d after SIGTERM", hresp.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
	code, hdr, b := post(t, s.URL+"/v1/completions", `{"model":"dummy","prompt":"Once","max_tokens":2}`)
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("a new request while draining: %d %s", code, b)
	}
	requireOpenAIError(t, "draining", b)
	finish, done := readToEnd(sc)
	if finish != "length" || !done {
		t.Fatalf("the running request did not finish: finish %q, [DONE] %v", finish, done)
	}
	select {
	case <-s.Exited():
	case <-time.After(15 * time.Second):
		t.Fatal("server did not exit after SIGTERM")
	}
	if err := s.ExitErr(); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
}

// SIGTERM to a decode worker in the middle of a stream: the stream still
// completes, the worker exits 0, and it refused nothing it had accepted.
func TestGracefulShutdownDecodeWorker(t *testing.T) {
	cfg := slowModel(t)
	args := []string{"--model", cfg, "--load-format", "dummy", "--served-model-name", "dummy"}
	// The router serves the workers' model name, or it would not pair with them.
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: args, RouterArgs: []string{"--served-model-name", "dummy"}})
	resp, sc := streamUntilFirstChunk(t, c.Router.URL, 30)
	defer resp.Body.Close()
	d := c.Decode[0]
	if err := d.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	finish, done := readToEnd(sc)
	if finish != "length" || !done {
		t.Fatalf("the running request did not finish through a draining decode worker: finish %q, [DONE] %v", finish, done)
	}
	select {
	case <-d.Exited():
	case <-time.After(15 * time.Second):
		t.Fatal("decode worker did not exit after SIGTERM")
	}
	if err := d.ExitErr(); err != nil {
		t.Fatalf("decode exit after SIGTERM: %v", err)
	}
}

// POST /drain on a running decode worker, as its owner would send it from
// the same host: it answers 202, its /health turns 503 draining, the
// router stops sending it work (the next request goes to the other decode
// worker and gets the reference), and it stays up. The same call carrying
// an Origin (a web page) gets the unknown route's 404 and drains nothing.
func TestWorkerDrainEndpoint(t *testing.T) {
	ref := loadReference(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 2})
	d := c.Decode[0]
	if code, _, body := post(t, d.URL+"/drain", "", "Origin", "https://evil.example"); code != 404 {
		t.Fatalf("POST /drain from a web page: %d %s, want 404", code, body)
	}
	if code, _ := get(t, d.URL+"/health"); code != 200 {
		t.Fatalf("a refused drain drained the worker: /health %d", code)
	}
	if code, _, body := post(t, d.URL+"/drain", ""); code != 202 {
		t.Fatalf("POST /drain from the worker's host: %d %s, want 202", code, body)
	}
	if code, body := get(t, d.URL+"/health"); code != 503 || !strings.Contains(string(body), "draining") {
		t.Fatalf("/health after /drain: %d %s", code, body)
	}
	// It takes no more work: requests go to the other decode worker (the
	// router's probe sees the 503; until then the drained one refuses
	// Reserve and the router retries).
	d0, d1 := metricsOf(t, d)["baton_kv_reservations_total"], metricsOf(t, c.Decode[1])["baton_kv_reservations_total"]
	for range 4 {
		if code, _, body := post(t, c.Router.URL+"/v1/completions", greedyBody(ref)); code != 200 {
			t.Fatalf("a request while one decode worker drains: %d %s", code, body)
		}
	}
	if n0, n1 := metricsOf(t, d)["baton_kv_reservations_total"], metricsOf(t, c.Decode[1])["baton_kv_reservations_total"]; n0 != d0 || n1 != d1+4 {
		t.Fatalf("reservations after the drain: drained worker %v → %v, the other %v → %v; want all 4 on the other", d0, n0, d1, n1)
	}
	select {
	case <-d.Exited():
		t.Fatal("POST /drain stopped the worker; it should stay up, drained")
	default:
	}
}
