package server

import (
	"net/http"
	"slices"
	"strings"
	"testing"
)

func preflight(t *testing.T, url, origin, method, headers string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodOptions, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", method)
	if headers != "" {
		req.Header.Set("Access-Control-Request-Headers", headers)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

func withOrigin(t *testing.T, method, url, origin, body string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req, _ = http.NewRequest(method, url, strings.NewReader(body))
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// A browser app on another origin can call the API: its preflight (sent
// without the API key) is answered before authentication, and every
// answer names the origin as allowed. Before, a preflight got 405 and
// no answer carried Access-Control-Allow-Origin, so browsers refused
// every call. The default allows any origin, as vLLM and SGLang do.
func TestCORSDefault(t *testing.T) {
	ts, _ := newTestServer(t, Options{APIKey: testKey, CORS: DefaultCORS()})
	st, h := preflight(t, ts.URL+"/v1/chat/completions", "https://app.example", "POST", "authorization, content-type")
	if st != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "*" ||
		h.Get("Access-Control-Allow-Headers") != "authorization, content-type" || h.Get("Access-Control-Allow-Methods") == "" {
		t.Fatalf("preflight: %d %v", st, h)
	}
	for _, c := range []struct{ method, path, origin, body string }{
		{"POST", "/v1/chat/completions", "https://app.example", chatBody},
		{"GET", "/v1/models", "https://app.example", ""},
		{"GET", "/health", "", ""},
		{"GET", "/nope", "https://app.example", ""},
	} {
		st, h := withOrigin(t, c.method, ts.URL+c.path, c.origin, c.body)
		if h.Get("Access-Control-Allow-Origin") != "*" {
			t.Errorf("%s %s: %d without Access-Control-Allow-Origin: %v", c.method, c.path, st, h)
		}
	}
	// An OPTIONS that is no preflight still finds no route.
	if st, _, _ := do(t, http.MethodOptions, ts.URL+"/v1/completions", "", ""); st != http.StatusMethodNotAllowed {
		t.Errorf("plain OPTIONS: %d", st)
	}
}

// Restricted to a list, only its origins, methods and headers pass; an
// allowed origin is named (never *) when credentials are allowed.
func TestCORSRestricted(t *testing.T) {
	ts, _ := newTestServer(t, Options{APIKey: testKey, CORS: &CORS{Origins: []string{"https://a.example"}, Methods: []string{"GET", "POST"},
		Headers: []string{"Authorization", "Content-Type"}, Credentials: true}})
	url := ts.URL + "/v1/completions"
	st, h := preflight(t, url, "https://a.example", "POST", "authorization")
	if st != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://a.example" || h.Get("Access-Control-Allow-Credentials") != "true" ||
		h.Get("Access-Control-Allow-Methods") != "GET, POST" || !slices.Contains(h.Values("Vary"), "Origin") {
		t.Fatalf("allowed preflight: %d %v", st, h)
	}
	for _, c := range []struct{ origin, method, headers string }{
		{"https://b.example", "POST", ""},
		{"https://a.example", "DELETE", ""},
		{"https://a.example", "POST", "x-secret"},
	} {
		if st, h := preflight(t, url, c.origin, c.method, c.headers); st != http.StatusBadRequest || h.Get("Access-Control-Allow-Methods") != "" {
			t.Errorf("%+v: %d %v, want 400", c, st, h)
		}
	}
	if _, h := withOrigin(t, "GET", ts.URL+"/v1/models", "https://b.example", ""); h.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("a disallowed origin was allowed: %v", h)
	}
	if _, h := withOrigin(t, "GET", ts.URL+"/v1/models", "https://a.example", ""); h.Get("Access-Control-Allow-Origin") != "https://a.example" {
		t.Errorf("an allowed origin was not named: %v", h)
	}
}

func TestParseCORSList(t *testing.T) {
	for in, want := range map[string][]string{
		`["*"]`: {"*"}, `["https://a.example", "https://b.example"]`: {"https://a.example", "https://b.example"},
		"https://a.example, https://b.example": {"https://a.example", "https://b.example"}, "*": {"*"}, "": nil,
	} {
		if got, err := ParseCORSList(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	if _, err := ParseCORSList(`["a",`); err == nil {
		t.Error("a broken JSON list was taken")
	}
}
