package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/server"
	"github.com/batonlm/baton/internal/tokenizer/chat"
)

// countGen counts the generations it is asked for and refuses them all,
// so that a request it was handed is told apart from one the server
// turned away while draining.
type countGen struct{ calls atomic.Int32 }

func (g *countGen) Generate(string, []int32, scheduler.Params) (server.Stream, error) {
	g.calls.Add(1)
	return nil, errors.New("not served in this test")
}

// On SIGTERM, /health turns 503 only once new work is refused: a load
// balancer that still sees 200 may send, and what it sends after the 503
// must be refused. The hook runs each time serveHTTP reports readiness;
// at the 503 it sends a request, which the server must refuse without
// reaching the generator. Before, serveHTTP reported not ready and only
// then drained, so that request was taken.
func TestShutdownRefusesBeforeHealthTurns(t *testing.T) {
	tok := bundledTokenizer(t)
	gen := &countGen{}
	srv := server.New(server.Options{ModelName: "m", Tokenizer: tok, Template: chat.Plain(), Generator: gen, Metrics: metrics.New("standalone")})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var atUnready []int // status of a request sent as /health turned 503
	setReady := func(ok bool) {
		srv.SetReady(ok)
		if ok {
			return
		}
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(`{"model":"m","prompt":"Once","max_tokens":2}`)))
		atUnready = append(atUnready, rec.Code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	fl := &serveFlags{readTimeout: time.Minute, shutdownTimeout: 5 * time.Second}
	go func() {
		done <- serveHTTP(ctx, fl, io.Discard, slog.New(slog.DiscardHandler), ln, srv, setReady, func(context.Context) { srv.Drain() })
	}()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if resp, err := http.Get("http://" + ln.Addr().String() + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("/health never said 200")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(atUnready) == 0 {
		t.Fatal("serveHTTP never reported not ready")
	}
	for _, code := range atUnready {
		if code != http.StatusServiceUnavailable {
			t.Errorf("a request sent as /health turned 503 got %d, not the draining 503", code)
		}
	}
	if n := gen.calls.Load(); n != 0 {
		t.Errorf("%d requests reached the generator after /health turned 503", n)
	}
}
