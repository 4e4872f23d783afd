package openai

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"
)

// Error types as OpenAI spells them; clients switch on the HTTP status, but
// some log or branch on these.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
)

// Error is an API error: an HTTP status plus the body OpenAI sends,
// {"error":{"message":...,"type":...,"param":...,"code":...}}.
type Error struct {
	Status  int
	Message string
	Type    string
	// Param names the request field at fault (e.g. "max_tokens" or
	// "messages[2].role"); nil when no single field is.
	Param *string
	// Code is a machine-readable reason such as "model_not_found"; nil when
	// there is none.
	Code *string
	// RetryAfter, when positive, is sent as the Retry-After header so that
	// clients with backoff (the official SDKs honour it) wait that long.
	RetryAfter time.Duration
}

// errorBody is the wire form. Param and Code have no omitempty because
// OpenAI always sends both keys, null when unset.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// Error implements the error interface, so an *Error can travel through code
// that returns plain errors and be recovered with errors.As.
func (e *Error) Error() string {
	s := e.Message
	if e.Param != nil {
		s += " (param " + *e.Param + ")"
	}
	return s
}

// MarshalJSON writes the OpenAI error body; Status and RetryAfter belong to
// the HTTP response, not the body.
func (e *Error) MarshalJSON() ([]byte, error) {
	var b errorBody
	b.Error.Message = e.Message
	b.Error.Type = e.Type
	b.Error.Param = e.Param
	b.Error.Code = e.Code
	return json.Marshal(b)
}

// UnmarshalJSON reads an error body, so that a router can relay a worker's
// error (or a client can read ours). Status is left unchanged: it is not in
// the body. A numeric code, as vLLM sends, is kept as its decimal text.
func (e *Error) UnmarshalJSON(data []byte) error {
	var b struct {
		Error struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Param   *string         `json:"param"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &b); err != nil {
		return err
	}
	e.Message, e.Type, e.Param, e.Code = b.Error.Message, b.Error.Type, b.Error.Param, nil
	if c := b.Error.Code; len(c) > 0 && string(c) != "null" {
		var s string
		if json.Unmarshal(c, &s) != nil {
			s = string(c)
		}
		e.Code = &s
	}
	return nil
}

func strPtr(s string) *string { return &s }

// maxEcho is how much of a name from a request an error repeats.
const maxEcho = 64

// Cut shortens a name from a request to echo it in an error: its first
// 64 bytes (whole characters) and "…". A whole 100 kB model name sent
// back in a 404 is bandwidth for the sender and noise in logs.
func Cut(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	n := maxEcho
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// BadRequest is a 400 invalid_request_error; param names the offending field,
// or is "" when no single field is at fault.
func BadRequest(msg, param string) *Error {
	e := &Error{Status: http.StatusBadRequest, Message: msg, Type: TypeInvalidRequest}
	if param != "" {
		e.Param = strPtr(param)
	}
	return e
}

// NotFound is a 404 invalid_request_error, as OpenAI answers for an unknown
// model; code is e.g. "model_not_found", or "" for none.
func NotFound(msg, code string) *Error {
	e := &Error{Status: http.StatusNotFound, Message: msg, Type: TypeInvalidRequest}
	if code != "" {
		e.Code = strPtr(code)
	}
	return e
}

// Unauthorized is OpenAI's answer to a missing or wrong API key.
func Unauthorized(msg string) *Error {
	return &Error{Status: http.StatusUnauthorized, Message: msg, Type: TypeInvalidRequest, Code: strPtr("invalid_api_key")}
}

// PayloadTooLarge is a 413: the request body is over the server's limit.
func PayloadTooLarge(msg string) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Message: msg, Type: TypeInvalidRequest, Code: strPtr("request_too_large")}
}

// RequestTimeout is a 408: the client took too long to send its request.
func RequestTimeout(msg string) *Error {
	return &Error{Status: http.StatusRequestTimeout, Message: msg, Type: TypeInvalidRequest, Code: strPtr("request_timeout")}
}

// TooManyRequests is a 429; retryAfter (if positive) becomes Retry-After.
func TooManyRequests(msg string, retryAfter time.Duration) *Error {
	return &Error{Status: http.StatusTooManyRequests, Message: msg, Type: TypeRateLimit, Code: strPtr("rate_limit_exceeded"), RetryAfter: retryAfter}
}

// ServiceUnavailable is a 503 (overloaded, draining or not ready);
// retryAfter (if positive) becomes Retry-After.
func ServiceUnavailable(msg string, retryAfter time.Duration) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Message: msg, Type: TypeServer, RetryAfter: retryAfter}
}

// Internal is a 500 server_error.
func Internal(msg string) *Error {
	return &Error{Status: http.StatusInternalServerError, Message: msg, Type: TypeServer}
}

// retryAfterSeconds rounds up, because Retry-After carries whole seconds and
// rounding down could tell a client to retry before it is worth it.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(s, 10)
}

// WriteError sends e as a complete JSON response. A zero Status is sent as
// 500 so that a half-built Error never goes out as 200.
func WriteError(w http.ResponseWriter, e *Error) {
	status := e.Status
	if status == 0 {
		status = http.StatusInternalServerError
	}
	body, err := e.MarshalJSON()
	if err != nil {
		// Unreachable for string fields; keep the response well-formed anyway.
		body = []byte(`{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(e.RetryAfter))
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}
