package openai

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestNoRoute(t *testing.T) {
	mux := http.NewServeMux()
	ok := func(http.ResponseWriter, *http.Request) {}
	mux.HandleFunc("POST /v1/completions", ok)
	mux.HandleFunc("GET /health", ok)
	mux.HandleFunc("/", NoRoute(mux))
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/v1/completions", 405, "POST"},
		{"DELETE", "/health", 405, "GET, HEAD"},
		{"GET", "/nope", 404, ""},
		{"POST", "/v1/completions", 200, ""},
	} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		if rec.Code != c.status || rec.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q, want %d %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"), c.status, c.allow)
		}
		if c.status == 200 {
			continue
		}
		var b errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &b); err != nil || b.Error.Message == "" || b.Error.Type != TypeInvalidRequest {
			t.Errorf("%s %s: body %q", c.method, c.path, rec.Body)
		}
	}
}
