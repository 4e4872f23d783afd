package roles

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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
	var ready Readiness
	ready.SetReady(true)
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
	var ready Readiness
	ready.SetReady(true)
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

// POST /drain stops a worker's service, so a stranger gets nothing of it:
// with a key, the 401 of every keyed route; without one, callers off this
// host and web pages (an Origin header) get the 404 of an unknown route.
// Only an allowed POST starts the drain.
func TestWorkerDrainEndpoint(t *testing.T) {
	const key = "cluster-key"
	var ready Readiness
	ready.SetReady(true)
	for _, c := range []struct {
		name            string
		key             string
		method          string
		auth            []string
		remote, origin  string
		status, drained int
	}{
		{"keyed, no key", key, "POST", nil, "", "", 401, 0},
		{"keyed, wrong key", key, "POST", []string{"Bearer wrong"}, "", "", 401, 0},
		{"keyed, wrong key off host", key, "POST", []string{"Bearer wrong"}, "10.0.0.5:4000", "", 401, 0},
		{"keyed, GET", key, "GET", []string{"Bearer " + key}, "", "", 405, 0},
		{"keyed", key, "POST", []string{"Bearer " + key}, "10.0.0.5:4000", "", 202, 1},
		{"keyed, two keys", key, "POST", []string{"Bearer " + key, "Bearer wrong"}, "", "", 401, 0},
		{"no key, loopback", "", "POST", nil, "", "", 202, 1},
		{"no key, loopback v6", "", "POST", nil, "[::1]:4000", "", 202, 1},
		{"no key, off host", "", "POST", nil, "10.0.0.5:4000", "", 404, 0},
		{"no key, mapped off host", "", "POST", nil, "[::ffff:10.0.0.5]:4000", "", 404, 0},
		{"no key, web page", "", "POST", nil, "", "http://evil.example", 404, 0},
		{"no key, GET off host", "", "GET", nil, "10.0.0.5:4000", "", 404, 0},
		{"no key, GET", "", "GET", nil, "", "", 405, 0},
	} {
		drained := 0
		h := HTTPHandler(infoWorker{}, &ready, metrics.New("decode"), HTTPOptions{APIKey: c.key, Drain: func() { drained++ }})
		req := httptest.NewRequest(c.method, "/drain", strings.NewReader(`{}`))
		req.RemoteAddr = "127.0.0.1:4000"
		if c.remote != "" {
			req.RemoteAddr = c.remote
		}
		for _, a := range c.auth {
			req.Header.Add("Authorization", a)
		}
		if c.origin != "" {
			req.Header.Set("Origin", c.origin)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.status || drained != c.drained {
			t.Errorf("%s: status %d, drained %d times; want %d, %d (%s)", c.name, rec.Code, drained, c.status, c.drained, rec.Body)
		}
		if rec.Code != 202 {
			requireWorkerOpenAIError(t, c.name, rec.Body.Bytes())
		}
		if rec.Code == 404 && !strings.Contains(rec.Body.String(), "unknown route") {
			t.Errorf("%s: a 404 unlike an unknown route's: %s", c.name, rec.Body)
		}
	}
	// A worker given no drain serves no such route.
	rec := httptest.NewRecorder()
	HTTPHandler(infoWorker{}, &ready, metrics.New("decode"), HTTPOptions{}).ServeHTTP(rec, httptest.NewRequest("POST", "/drain", nil))
	if rec.Code != 404 {
		t.Errorf("no drain: POST /drain got %d", rec.Code)
	}
}

// /health says starting, ok, then draining once a drain began; a late
// "ready" (the server finishing its start after a drain began) leaves it
// draining, so a drained worker never takes work again.
func TestHealthReadiness(t *testing.T) {
	var ready Readiness
	h := HTTPHandler(infoWorker{}, &ready, metrics.New("decode"), HTTPOptions{Drain: ready.Drain})
	health := func() (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/health", nil))
		return rec.Code, rec.Body.String()
	}
	for _, step := range []struct {
		do   func()
		code int
		body string
	}{
		{func() {}, 503, `{"status":"starting"}`},
		{func() { ready.SetReady(true) }, 200, `{"status":"ok"}`},
		{ready.Drain, 503, `{"status":"draining"}`},
		{func() { ready.SetReady(true) }, 503, `{"status":"draining"}`},
	} {
		step.do()
		if code, body := health(); code != step.code || body != step.body {
			t.Fatalf("/health %d %s, want %d %s", code, body, step.code, step.body)
		}
	}
}
