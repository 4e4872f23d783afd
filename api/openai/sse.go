package openai

import (
	"encoding/json"
	"errors"
	"net/http"
)

// SSE writes a server-sent-events stream in the form OpenAI's clients parse:
// one "data: <json>" event per chunk and a final "data: [DONE]".
//
// Once NewSSE has run the 200 status is on the wire, so validate the request
// (and report its errors with WriteError) before creating one; afterwards a
// failure can only be reported in-band with SendError.
//
// An SSE is not safe for concurrent use. After a write fails (typically the
// client went away) every later call returns that same error, so a generation
// loop can check the error of Send alone and stop.
type SSE struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
	buf []byte
}

// NewSSE sends the event-stream headers and status 200, and flushes them so
// that the client sees the response start before the first token, which can
// take a while behind a long prefill.
func NewSSE(w http.ResponseWriter) *SSE {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	// nginx and similar proxies buffer responses by default, which would hold
	// tokens back until the buffer fills.
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	s := &SSE{w: w, rc: http.NewResponseController(w)}
	s.flush()
	return s
}

// Send writes v, marshalled as JSON, as one event and flushes it. A value
// that cannot be marshalled is reported without writing anything, so the
// stream stays well-formed.
func (s *SSE) Send(v any) error {
	if s.err != nil {
		return s.err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.event(data)
}

// SendError reports a failure after the stream has started, as
// data: {"error":{...}}; the OpenAI SDKs raise it as an API error. Whether to
// follow it with Done is the caller's choice: clients stop at the error.
func (s *SSE) SendError(e *Error) error {
	if s.err != nil {
		return s.err
	}
	data, err := e.MarshalJSON()
	if err != nil {
		return err
	}
	return s.event(data)
}

// Done writes the "data: [DONE]" terminator that OpenAI clients wait for.
func (s *SSE) Done() error {
	if s.err != nil {
		return s.err
	}
	return s.event([]byte("[DONE]"))
}

// Err returns the first write error, if any.
func (s *SSE) Err() error { return s.err }

// SendEvent writes v as an event named name ("event: name" before its
// data), as the Responses API streams.
func (s *SSE) SendEvent(name string, v any) error {
	if s.err != nil {
		return s.err
	}
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.named(name, data)
}

func (s *SSE) event(data []byte) error { return s.named("", data) }

func (s *SSE) named(name string, data []byte) error {
	// data is compact JSON, which escapes newlines inside strings, so it can
	// never end the event early. One Write per event puts each event in one
	// chunk of the chunked encoding.
	s.buf = s.buf[:0]
	if name != "" {
		s.buf = append(s.buf, "event: "...)
		s.buf = append(s.buf, name...)
		s.buf = append(s.buf, '\n')
	}
	s.buf = append(s.buf, "data: "...)
	s.buf = append(s.buf, data...)
	s.buf = append(s.buf, "\n\n"...)
	if _, err := s.w.Write(s.buf); err != nil {
		s.err = err
		return err
	}
	return s.flush()
}

func (s *SSE) flush() error {
	// A writer that cannot flush (e.g. some test recorders) still gets the
	// data, only later; that is not worth failing the stream over.
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.err = err
		return err
	}
	return nil
}
