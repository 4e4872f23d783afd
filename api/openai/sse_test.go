package openai

import (
	"bufio"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestSSEWire(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSE(rec)
	if !rec.Flushed {
		t.Error("headers not flushed at start")
	}
	if err := s.Send(ChatCompletionChunk{ID: "c", Created: 1, Model: "m",
		Choices: []ChatChunkChoice{{Delta: ChatDelta{Content: new("a\nb")}}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.SendError(Internal("worker died")); err != nil {
		t.Fatal(err)
	}
	if err := s.Done(); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK {
		t.Errorf("status %d", rec.Code)
	}
	for k, v := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache"} {
		if got := rec.Header().Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	want := `data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":"a\nb"},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
		`data: {"error":{"message":"worker died","type":"server_error","param":null,"code":null}}` + "\n\n" +
		"data: [DONE]\n\n"
	if got := rec.Body.String(); got != want {
		t.Errorf("body\n%s\nwant\n%s", got, want)
	}
}

func TestSSEUnmarshalableValue(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSE(rec)
	if err := s.Send(func() {}); err == nil {
		t.Fatal("expected a marshal error")
	}
	if rec.Body.Len() != 0 || s.Err() != nil {
		t.Errorf("a marshal failure must write nothing and leave the stream usable; body %q err %v", rec.Body, s.Err())
	}
}

type brokenWriter struct {
	*httptest.ResponseRecorder
	writes int
}

var errGone = errors.New("client gone")

func (b *brokenWriter) Write(p []byte) (int, error) {
	b.writes++
	return 0, errGone
}

func TestSSEStickyError(t *testing.T) {
	w := &brokenWriter{ResponseRecorder: httptest.NewRecorder()}
	s := NewSSE(w)
	if err := s.Send(Usage{}); !errors.Is(err, errGone) {
		t.Fatalf("Send: %v", err)
	}
	if err := s.Done(); !errors.Is(err, errGone) || w.writes != 1 {
		t.Errorf("Done after failure: err %v, %d writes; want the first error and no new write", err, w.writes)
	}
	if err := s.SendError(Internal("x")); !errors.Is(err, errGone) {
		t.Errorf("SendError after failure: %v", err)
	}
}

// TestSSEStreamsBeforeHandlerReturns checks over a real connection that each
// event reaches the client when sent, not when the handler ends.
func TestSSEStreamsBeforeHandlerReturns(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := NewSSE(w)
		_ = s.Send(Usage{TotalTokens: 1})
		<-release
		_ = s.Done()
	}))
	defer srv.Close()
	defer close(release)

	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(resp.Body).ReadString('\n')
		line <- l
	}()
	select {
	case l := <-line:
		if !strings.HasPrefix(l, `data: {"prompt_tokens":0`) {
			t.Errorf("first line %q", l)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("first event not delivered while the handler was still running")
	}
}

// SendEvent names the event before its data, as the Responses API streams,
// and a tool-call delta carries what a client reassembles calls from.
func TestSSENamedEvent(t *testing.T) {
	rec := httptest.NewRecorder()
	s := NewSSE(rec)
	if err := s.SendEvent("response.output_text.delta", map[string]any{"type": "response.output_text.delta", "delta": "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(ChatCompletionChunk{ID: "c", Created: 1, Model: "m", Choices: []ChatChunkChoice{{Delta: ChatDelta{
		ToolCalls: []ToolCallDelta{{Index: 0, ID: "call_1", Type: "function", Function: ToolCallFunctionDelta{Name: "f"}}}}}}}); err != nil {
		t.Fatal(err)
	}
	want := "event: response.output_text.delta\n" + `data: {"delta":"hi","type":"response.output_text.delta"}` + "\n\n" +
		`data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","system_fingerprint":null,"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n"
	if got := rec.Body.String(); got != want {
		t.Fatalf("wire:\n%s\nwant\n%s", got, want)
	}
}
