package roles

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/metrics"
)

type infoWorker struct{}

func (infoWorker) WorkerInfo() *pdv1.WorkerInfo {
	return &pdv1.WorkerInfo{Role: "decode", GrpcAddr: "10.1.2.3:9000", TransferAddr: "10.1.2.3:9001"}
}
func (infoWorker) SetShuttingDown() {}
func (infoWorker) Busy() bool       { return false }

func workerGet(t *testing.T, url, auth string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
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

func requireWorkerOpenAIError(t *testing.T, what string, body []byte) {
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
}

func TestWorkerHTTPKey(t *testing.T) {
	const key = "cluster-key"
	var ready atomic.Bool
	ready.Store(true)
	for _, keyedMetrics := range []bool{false, true} {
		ts := httptest.NewServer(HTTPHandler(infoWorker{}, &ready, metrics.New("decode"), HTTPOptions{APIKey: key, MetricsRequireKey: keyedMetrics}))
		for _, auth := range []string{"", "Bearer wrong", "Bearer " + key + "!", key} {
			for _, path := range []string{"/server_info", "/nope"} {
				code, body := workerGet(t, ts.URL+path, auth)
				if code != http.StatusUnauthorized {
					t.Fatalf("%s with %q: status %d, want 401", path, auth, code)
				}
				requireWorkerOpenAIError(t, path, body)
				if strings.Contains(string(body), "10.1.2.3") {
					t.Fatalf("%s: the 401 names an address: %s", path, body)
				}
			}
		}
		for _, auth := range []string{"Bearer " + key, "bearer " + key, "BEARER " + key} {
			code, body := workerGet(t, ts.URL+"/server_info", auth)
			if code != http.StatusOK || !strings.Contains(string(body), "10.1.2.3:9000") {
				t.Fatalf("/server_info with %q: %d %s", auth, code, body)
			}
			code, body = workerGet(t, ts.URL+"/nope", auth)
			if code != http.StatusNotFound {
				t.Fatalf("unknown route with the key: %d", code)
			}
			requireWorkerOpenAIError(t, "404", body)
		}
		if code, _ := workerGet(t, ts.URL+"/health", ""); code != http.StatusOK {
			t.Fatalf("/health without a key: %d", code)
		}
		code, _ := workerGet(t, ts.URL+"/metrics", "")
		if want := map[bool]int{false: 200, true: 401}[keyedMetrics]; code != want {
			t.Fatalf("metrics keyed=%v: /metrics without a key got %d, want %d", keyedMetrics, code, want)
		}
		if code, _ := workerGet(t, ts.URL+"/metrics", "Bearer "+key); code != http.StatusOK {
			t.Fatalf("/metrics with the key: %d", code)
		}
		ts.Close()
	}
	// Without a key every route is open, as before.
	ts := httptest.NewServer(HTTPHandler(infoWorker{}, &ready, metrics.New("prefill"), HTTPOptions{}))
	defer ts.Close()
	if code, _ := workerGet(t, ts.URL+"/server_info", ""); code != http.StatusOK {
		t.Fatalf("/server_info with no key configured: %d", code)
	}
}

// A worker answers a known route under a wrong method with 405 and Allow,
// an unknown one with 404, both in OpenAI's shape.
func TestWorkerHTTPWrongMethod(t *testing.T) {
	var ready atomic.Bool
	ready.Store(true)
	ts := httptest.NewServer(HTTPHandler(infoWorker{}, &ready, metrics.New("prefill"), HTTPOptions{}))
	defer ts.Close()
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"POST", "/health", 405, "GET, HEAD"},
		{"DELETE", "/metrics", 405, "GET, HEAD"},
		{"GET", "/v1/completions", 404, ""},
	} {
		req, _ := http.NewRequest(c.method, ts.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow {
			t.Fatalf("%s %s: %d Allow %q %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), b)
		}
		requireWorkerOpenAIError(t, c.method+" "+c.path, b)
	}
}
