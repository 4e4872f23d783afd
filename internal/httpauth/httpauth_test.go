package httpauth

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestBearerAdversarial(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
		ok   bool
	}{
		{"Bearer k1", "k1", true},
		{"bearer k1", "k1", true},
		{"BEARER k1", "k1", true},
		{"bEaReR k1", "k1", true},
		{"Bearer   k1", "k1", true},
		{"", "", false},
		{"Bearer", "", false},
		{"Bearer ", "", false},
		{"Bearer    ", "", false},
		{"Bearerk1", "", false},
		{"Bearer\tk1", "", false},
		{" Bearer k1", "", false},
		{"Bearer k1 k2", "", false},
		{"Bearer k1\t", "", false},
		{"Bearer k1\r\nX-Evil: 1", "", false},
		{"Basic k1", "", false},
		{"Bearers k1", "", false},
		{"Bear k1", "", false},
		{"Token k1", "", false},
		{"k1", "", false},
		{"Bearer\x00k1", "", false},
		{"Beare\u0280 k1", "", false}, // non-ASCII look-alike of the scheme
		{"\u212aey k1", "", false},    // Kelvin sign folds to k under Unicode rules
	} {
		got, ok := Bearer(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("Bearer(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestValidKey(t *testing.T) {
	const key = "s3cret"
	for _, c := range []struct {
		name    string
		headers []string
		ok      bool
	}{
		{"right key", []string{"Bearer s3cret"}, true},
		{"lower-case scheme", []string{"bearer s3cret"}, true},
		{"upper-case scheme", []string{"BEARER s3cret"}, true},
		{"no header", nil, false},
		{"wrong key", []string{"Bearer nope"}, false},
		{"key's prefix", []string{"Bearer s3cre"}, false},
		{"key with a suffix", []string{"Bearer s3cret2"}, false},
		{"key in another case", []string{"Bearer S3CRET"}, false},
		{"bare key", []string{"s3cret"}, false},
		{"two headers, right one second", []string{"Bearer nope", "Bearer s3cret"}, false},
		{"two headers, both right", []string{"Bearer s3cret", "Bearer s3cret"}, false},
		{"comma-joined", []string{"Bearer nope, Bearer s3cret"}, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		for _, h := range c.headers {
			r.Header.Add("Authorization", h)
		}
		if got := Valid(r, key); got != c.ok {
			t.Errorf("%s: Valid = %v, want %v", c.name, got, c.ok)
		}
	}
}

func TestRequire(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	if Require("", ok) == nil {
		t.Fatal("no handler")
	}
	h := Require("k", ok)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("status %d, want 401", rec.Code)
	}
	var body struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error.Type != "invalid_request_error" || body.Error.Code == nil || *body.Error.Code != "invalid_api_key" {
		t.Fatalf("body %q is not OpenAI's 401 (%v)", rec.Body, err)
	}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "bearer k")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != http.StatusTeapot {
		t.Fatalf("with the key: status %d, want the handler's", rec.Code)
	}
}
