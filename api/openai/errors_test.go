package openai

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestErrorConstructors(t *testing.T) {
	for _, c := range []struct {
		e                  *Error
		status             int
		typ                string
		param, code, retry string
		body               string
	}{
		{BadRequest("max_tokens must be at least 1", "max_tokens"), 400, TypeInvalidRequest, "max_tokens", "", "",
			`{"error":{"message":"max_tokens must be at least 1","type":"invalid_request_error","param":"max_tokens","code":null}}`},
		{BadRequest("bad", ""), 400, TypeInvalidRequest, "", "", "",
			`{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`},
		{NotFound("no such model", "model_not_found"), 404, TypeInvalidRequest, "", "model_not_found", "",
			`{"error":{"message":"no such model","type":"invalid_request_error","param":null,"code":"model_not_found"}}`},
		{Unauthorized("bad key"), 401, TypeInvalidRequest, "", "invalid_api_key", "",
			`{"error":{"message":"bad key","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}`},
		{PayloadTooLarge("too big"), 413, TypeInvalidRequest, "", "request_too_large", "",
			`{"error":{"message":"too big","type":"invalid_request_error","param":null,"code":"request_too_large"}}`},
		{RequestTimeout("too slow"), 408, TypeInvalidRequest, "", "request_timeout", "",
			`{"error":{"message":"too slow","type":"invalid_request_error","param":null,"code":"request_timeout"}}`},
		{TooManyRequests("slow down", 1500*time.Millisecond), 429, TypeRateLimit, "", "rate_limit_exceeded", "2",
			`{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":"rate_limit_exceeded"}}`},
		{ServiceUnavailable("draining", 5*time.Second), 503, TypeServer, "", "", "5",
			`{"error":{"message":"draining","type":"server_error","param":null,"code":null}}`},
		{ServiceUnavailable("busy", 0), 503, TypeServer, "", "", "",
			`{"error":{"message":"busy","type":"server_error","param":null,"code":null}}`},
		{Internal("boom"), 500, TypeServer, "", "", "",
			`{"error":{"message":"boom","type":"server_error","param":null,"code":null}}`},
		{&Error{Message: "unset status"}, 500, "", "", "", "",
			`{"error":{"message":"unset status","type":"","param":null,"code":null}}`},
	} {
		t.Run(c.e.Message, func(t *testing.T) {
			if c.e.Status != 0 && (c.e.Status != c.status || c.e.Type != c.typ) {
				t.Errorf("status %d type %q, want %d %q", c.e.Status, c.e.Type, c.status, c.typ)
			}
			if got := deref(c.e.Param); got != c.param {
				t.Errorf("param %q, want %q", got, c.param)
			}
			if got := deref(c.e.Code); got != c.code {
				t.Errorf("code %q, want %q", got, c.code)
			}
			rec := httptest.NewRecorder()
			WriteError(rec, c.e)
			if rec.Code != c.status {
				t.Errorf("wrote status %d, want %d", rec.Code, c.status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			if got := rec.Header().Get("Retry-After"); got != c.retry {
				t.Errorf("Retry-After %q, want %q", got, c.retry)
			}
			if got := rec.Body.String(); got != c.body+"\n" {
				t.Errorf("body %s, want %s", got, c.body)
			}
			// Every body must read back to the same error, so that a router can
			// relay a worker's error unchanged.
			var back Error
			if err := json.Unmarshal(rec.Body.Bytes(), &back); err != nil {
				t.Fatal(err)
			}
			if back.Message != c.e.Message || back.Type != c.e.Type || deref(back.Param) != c.param || deref(back.Code) != c.code {
				t.Errorf("read back %+v", back)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func TestErrorUnmarshalNumericCode(t *testing.T) {
	// vLLM sends the HTTP status as a numeric code.
	var e Error
	if err := json.Unmarshal([]byte(`{"error":{"message":"m","type":"BadRequestError","param":null,"code":400}}`), &e); err != nil {
		t.Fatal(err)
	}
	if deref(e.Code) != "400" || e.Message != "m" {
		t.Errorf("got %+v", e)
	}
}

func TestErrorIsAnError(t *testing.T) {
	var err error = fmt.Errorf("parse: %w", BadRequest("n other than 1 is not supported", "n"))
	var e *Error
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Fatalf("errors.As failed on %v", err)
	}
	if got, want := e.Error(), "n other than 1 is not supported (param n)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
