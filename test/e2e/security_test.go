package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// leaky matches what a client must never read: loopback addresses, ports,
// and the handoff's internals.
var leaky = regexp.MustCompile(`(?i)127\.0\.0\.1|:\d{2,5}\b|\broom|\bepoch|\bwriter|\bpages?\b`)

func getWith(t *testing.T, u, auth string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func requireOpenAIError(t *testing.T, what string, body []byte) apiError {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("%s: %q is not JSON", what, body)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("%s: %q lacks error.%s", what, body, k)
		}
	}
	var e apiError
	_ = json.Unmarshal(body, &e)
	return e
}

// With --api-key on every role the router still finds its workers (it
// sends the key to /server_info), and a worker shows nothing but /health
// and /metrics without it.
func TestPDAPIKeyOnEveryRole(t *testing.T) {
	const key = "cluster-secret"
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1,
		WorkerArgs: []string{"--api-key", key}, RouterArgs: []string{"--api-key", key}})
	body := `{"model":"stories260K","prompt":"Once upon a time","max_tokens":4}`
	if code, _, b := post(t, c.Router.URL+"/v1/completions", body, "Authorization", "bearer "+key); code != 200 {
		t.Fatalf("through the router: %d %s", code, b)
	}
	for _, w := range c.Workers() {
		for _, path := range []string{"/server_info", "/v1/completions"} {
			code, b := getWith(t, w.URL+path, "Bearer nope")
			if code != 401 {
				t.Fatalf("%s%s with a wrong key: %d %s", w.URL, path, code, b)
			}
			if requireOpenAIError(t, path, b); leaky.Match(b) {
				t.Fatalf("%s: the 401 leaks: %s", path, b)
			}
		}
		if code, b := getWith(t, w.URL+"/server_info", "BEARER "+key); code != 200 || !strings.Contains(string(b), "grpc_addr") {
			t.Fatalf("%s/server_info with the key: %d %s", w.URL, code, b)
		}
		for _, path := range []string{"/health", "/metrics"} {
			if code, _ := getWith(t, w.URL+path, ""); code != 200 {
				t.Fatalf("%s%s without a key: %d", w.URL, path, code)
			}
		}
	}
}

func TestMetricsRequireKey(t *testing.T) {
	s := startServer(t, "--api-key", "k", "--metrics-require-key")
	if code, b := getWith(t, s.URL+"/metrics", ""); code != 401 {
		t.Fatalf("/metrics without the key: %d %s", code, b)
	}
	if code, _ := getWith(t, s.URL+"/metrics", "Bearer k"); code != 200 {
		t.Fatalf("/metrics with the key: %d", code)
	}
	if code, _ := getWith(t, s.URL+"/health", ""); code != 200 {
		t.Fatalf("/health: %d", code)
	}
}

// A decode worker that died is a 503 to retry, in words that name no
// worker, while the router's view of it catches up.
func TestPDDeadDecodeLeaksNothing(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1})
	victim := c.Decode[0]
	_ = victim.Signal(syscall.SIGKILL)
	<-victim.Exited()
	body := `{"model":"stories260K","prompt":"Once upon a time","max_tokens":4,"stream":%v}`
	for i := range 6 {
		stream := i%2 == 1
		code, hdr, b := post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(body, stream))
		if code == 200 {
			t.Fatalf("request %d: 200 with the only decode worker dead: %s", i, b)
		}
		e := requireOpenAIError(t, "dead decode", b)
		t.Logf("request %d: %d %s", i, code, b)
		if leaky.Match(b) {
			t.Fatalf("request %d: the client reads %q in %s", i, leaky.Find(b), b)
		}
		if code == 503 && hdr.Get("Retry-After") == "" {
			t.Fatalf("request %d: 503 without Retry-After (%s)", i, e.Error.Message)
		}
		time.Sleep(300 * time.Millisecond) // before and after the router's probe noticed
	}
	waitPagesFree(t, c.Prefill[0])
}

// rawPost sends head, then feeds the connection with more until the server
// answers, and returns the answer's status and body.
func rawPost(t *testing.T, base, head string, more func(net.Conn)) (int, []byte) {
	t.Helper()
	u, _ := url.Parse(base)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	go more(conn)
	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second)) // hang guard
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func trickle(conn net.Conn) {
	for range 2000 {
		if _, err := io.WriteString(conn, "1\r\n \r\n"); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRequestBodyLimits(t *testing.T) {
	s := startServer(t, "--api-key", "k", "--request-read-timeout", "1s")
	head := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
	// No key: 401 though the body never ends.
	code, b := rawPost(t, s.URL, head+"Authorization: Bearer wrong\r\n\r\n", trickle)
	if code != 401 {
		t.Fatalf("wrong key, endless body: %d %s", code, b)
	}
	requireOpenAIError(t, "401", b)
	// The key, and a body slower than --request-read-timeout: 408.
	code, b = rawPost(t, s.URL, head+"Authorization: Bearer k\r\n\r\n", trickle)
	if code != 408 {
		t.Fatalf("slow body: %d %s", code, b)
	}
	requireOpenAIError(t, "408", b)
	// A route that never reads its body still answers: the body's deadline
	// ends the upload net/http would otherwise wait out.
	code, b = rawPost(t, s.URL, "POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", trickle)
	if code != 404 {
		t.Fatalf("unknown route, endless body: %d %s", code, b)
	}
	requireOpenAIError(t, "404", b)
	// Declared over the limit: 413 before a byte of it is read.
	code, b = rawPost(t, s.URL, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: 40000000\r\n\r\n", trickle)
	if code != 413 {
		t.Fatalf("oversize body: %d %s", code, b)
	}
	requireOpenAIError(t, "413", b)
	// A 20 MB prompt is refused for its length, before it is tokenized.
	huge := strings.Repeat("Once upon a time there was a dog. ", 20<<20/34)
	for _, req := range []struct{ path, body string }{
		{"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q}`, huge)},
		{"/v1/chat/completions", fmt.Sprintf(`{"model":"stories260K","messages":[{"role":"user","content":%q}]}`, huge)},
	} {
		code, _, b := post(t, s.URL+req.path, req.body, "Authorization", "Bearer k")
		if e := requireOpenAIError(t, req.path, b); code != 400 || !strings.Contains(e.Error.Message, "bytes long") {
			t.Fatalf("%s: %d %s", req.path, code, b)
		}
	}
	// The server is still serving.
	if code, _, b := post(t, s.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once","max_tokens":2}`, "Authorization", "Bearer k"); code != 200 {
		t.Fatalf("afterwards: %d %s", code, b)
	}
	waitPagesFree(t, s)
}
