package main

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"
)

// serveHTTP closes keep-alive connections idle for --http-idle-timeout
// (before, none was ever closed) and holds --max-connections.
func TestServeHTTPClosesIdleConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &serveFlags{readTimeout: time.Minute, shutdownTimeout: time.Second, idleTimeout: 300 * time.Millisecond, maxConns: 1}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	var logw bytes.Buffer
	go func() { done <- serveHTTP(ctx, f, &logw, slog.New(slog.DiscardHandler), ln, h, func(bool) {}, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	ask := func(c net.Conn, r *bufio.Reader) {
		t.Helper()
		_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	ask(c, r)
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := r.ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("an idle connection was not closed within 3 s of a 300 ms --http-idle-timeout (%v)", err)
	}
	// With --max-connections 1, a second client is served once the first
	// is gone.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	ask(c2, bufio.NewReader(c2))
	for _, args := range [][]string{{"--http-idle-timeout", "-1s"}, {"--max-connections", "-1"}} {
		dryRun(t, args, "must not be negative", "")
	}
	dryRun(t, []string{"--allow-special-tokens-in-prompt", "--role", "decode"}, "allow-special-tokens-in-prompt", "")
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
