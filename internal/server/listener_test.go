package server

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// serveLimited serves h under l on a loopback port.
func serveLimited(t *testing.T, h http.Handler, l HTTPLimits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	hs, ln := NewHTTPServer(h, ln, l)
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() { _ = hs.Close() })
	return addr
}

// keepAlive is one client connection sending HTTP/1.1 requests.
type keepAlive struct {
	c net.Conn
	r *bufio.Reader
}

func dialKeepAlive(t *testing.T, addr string) *keepAlive {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &keepAlive{c: c, r: bufio.NewReader(c)}
}

func (k *keepAlive) send(t *testing.T, path string) {
	t.Helper()
	if _, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
}

// answer reads one response within d; ok false when none came.
func (k *keepAlive) answer(t *testing.T, d time.Duration) (int, bool) {
	t.Helper()
	_ = k.c.SetReadDeadline(time.Now().Add(d))
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return 0, false
		}
		t.Fatalf("reading a response: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, true
}

// closedWithin reports whether the server closed the connection within d.
func (k *keepAlive) closedWithin(d time.Duration) bool {
	_ = k.c.SetReadDeadline(time.Now().Add(d))
	_, err := k.r.ReadByte()
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func okHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
}

// A keep-alive connection that sends nothing more is closed once it has
// been idle for the idle timeout; before, it stayed open for good.
func TestIdleKeepAliveConnectionIsClosed(t *testing.T) {
	addr := serveLimited(t, okHandler(), HTTPLimits{IdleTimeout: 200 * time.Millisecond})
	k := dialKeepAlive(t, addr)
	k.send(t, "/")
	if code, ok := k.answer(t, 2*time.Second); !ok || code != 200 {
		t.Fatalf("first request: %d %v", code, ok)
	}
	start := time.Now()
	if !k.closedWithin(3 * time.Second) {
		t.Fatal("an idle keep-alive connection was still open after 3 s with a 200 ms idle timeout")
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("closed after %v, before the idle timeout", d)
	}
	// A connection that keeps asking stays open.
	k2 := dialKeepAlive(t, addr)
	for range 4 {
		k2.send(t, "/")
		if code, ok := k2.answer(t, 2*time.Second); !ok || code != 200 {
			t.Fatalf("a busy connection: %d %v", code, ok)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// At MaxConnections a new client takes the place of the connection idle
// longest; with none idle it waits until one is.
func TestConnectionCap(t *testing.T) {
	release := map[string]chan struct{}{"/a": make(chan struct{}), "/b": make(chan struct{})}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ch, ok := release[r.URL.Path]; ok {
			<-ch
		}
		_, _ = io.WriteString(w, "ok")
	})
	addr := serveLimited(t, h, HTTPLimits{MaxConnections: 2})
	a, b := dialKeepAlive(t, addr), dialKeepAlive(t, addr)
	a.send(t, "/a")
	b.send(t, "/b")
	time.Sleep(100 * time.Millisecond)
	// Both slots are busy: a third client waits.
	c := dialKeepAlive(t, addr)
	c.send(t, "/")
	if _, ok := c.answer(t, 400*time.Millisecond); ok {
		t.Fatal("a third connection was served while two requests held both slots")
	}
	// One answer makes its connection idle: the waiting client takes its place.
	close(release["/a"])
	if code, ok := a.answer(t, 2*time.Second); !ok || code != 200 {
		t.Fatalf("a: %d %v", code, ok)
	}
	if code, ok := c.answer(t, 2*time.Second); !ok || code != 200 {
		t.Fatalf("the waiting client: %d %v", code, ok)
	}
	if !a.closedWithin(2 * time.Second) {
		t.Error("the idle connection whose place was taken is still open")
	}
	// An idle connection gives way to a new client at once.
	d := dialKeepAlive(t, addr)
	d.send(t, "/")
	if code, ok := d.answer(t, 2*time.Second); !ok || code != 200 {
		t.Fatalf("a new client with one idle connection at the cap: %d %v", code, ok)
	}
	if !c.closedWithin(2 * time.Second) {
		t.Error("the idle connection was not closed for the new client")
	}
	close(release["/b"])
	if code, ok := b.answer(t, 2*time.Second); !ok || code != 200 {
		t.Fatalf("b: %d %v", code, ok)
	}
}
