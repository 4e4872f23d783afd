package server

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// HTTPLimits bound what idle or numerous clients may hold of a server.
type HTTPLimits struct {
	// IdleTimeout closes a keep-alive connection that has sent no request
	// for this long (0: never). Without it every client that ever
	// connected could keep its connection, its goroutine and its buffers.
	IdleTimeout time.Duration
	// MaxConnections bounds the open connections (0: no bound). At the
	// bound a new client takes the place of the connection idle longest;
	// when none is idle it waits, and those after it wait in the
	// listener's backlog, until one closes.
	MaxConnections int
	// BodyReadTimeout, when set, bounds how long a request's body may take
	// to arrive (see bodyDeadline).
	BodyReadTimeout time.Duration
}

// readHeaderTimeout bounds how long a client may take to send a request's
// headers: a connection that opens and trickles bytes holds a slot.
const readHeaderTimeout = 10 * time.Second

// maxHeaderBytes bounds a request's headers; net/http's 1 MiB default
// times thousands of connections is gigabytes, and a request of this API
// needs a few hundred bytes of them.
const maxHeaderBytes = 64 << 10

// NewHTTPServer returns the HTTP server for h under the limits, and the
// listener it must serve (ln, bounded when MaxConnections is set).
func NewHTTPServer(h http.Handler, ln net.Listener, l HTTPLimits) (*http.Server, net.Listener) {
	// No ReadTimeout: it stays on the connection while an answer streams,
	// and net/http cancels a request whose connection read times out.
	// Bodies get a deadline of their own instead (bodyDeadline).
	hs := &http.Server{Handler: bodyDeadline(h, l.BodyReadTimeout), ReadHeaderTimeout: readHeaderTimeout,
		IdleTimeout: l.IdleTimeout, MaxHeaderBytes: maxHeaderBytes}
	if l.MaxConnections > 0 {
		cl := newConnLimiter(ln, l.MaxConnections)
		hs.ConnState = cl.connState
		ln = cl
	}
	return hs, ln
}

// bodyDeadline bounds how long a request's body may take to arrive, so
// that a slow or endless upload ends even on a route that never reads it
// (net/http then reads what is left before answering). A handler that
// reads its body lifts the deadline once it has it (Options.BodyReadTimeout).
func bodyDeadline(h http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(d))
		}
		h.ServeHTTP(w, r)
	})
}

// connLimiter is a listener that keeps at most max connections open. It
// learns which are idle from the server's ConnState hook, so that at the
// bound a new client takes an idle connection's place rather than waiting
// behind clients that hold connections they do not use.
type connLimiter struct {
	net.Listener
	max int

	mu   sync.Mutex
	open int
	idle map[net.Conn]time.Time // since when each idle connection is idle

	wake      chan struct{} // a slot came free or a connection went idle
	done      chan struct{}
	closeOnce sync.Once
}

func newConnLimiter(ln net.Listener, max int) *connLimiter {
	return &connLimiter{Listener: ln, max: max, idle: map[net.Conn]time.Time{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// Accept takes the next client, then makes room for it: a free slot, else
// the longest idle connection's, else it waits for either. Room is made
// only for a client that came, so idle connections are closed only when
// someone needs their place.
func (l *connLimiter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	for {
		l.mu.Lock()
		if l.open < l.max {
			l.open++
			l.mu.Unlock()
			return &limitedConn{Conn: c, l: l}, nil
		}
		var victim net.Conn
		var since time.Time
		for ic, t := range l.idle {
			if victim == nil || t.Before(since) {
				victim, since = ic, t
			}
		}
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Close() // gives its slot back
			continue
		}
		select {
		case <-l.wake:
		case <-l.done:
			_ = c.Close()
			return nil, net.ErrClosed
		}
	}
}

// Close stops Accept, a waiting one included.
func (l *connLimiter) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (l *connLimiter) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// connState is the server's ConnState hook.
func (l *connLimiter) connState(c net.Conn, st http.ConnState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateIdle:
		if lc, ok := c.(*limitedConn); ok && !lc.closed {
			l.idle[c] = time.Now()
			l.signal()
		}
	default:
		delete(l.idle, c)
	}
}

func (l *connLimiter) release(c net.Conn) {
	l.mu.Lock()
	delete(l.idle, c)
	l.open--
	l.mu.Unlock()
	l.signal()
}

// limitedConn gives its slot back when it is first closed.
type limitedConn struct {
	net.Conn
	l      *connLimiter
	closed bool // under l.mu
}

func (c *limitedConn) Close() error {
	c.l.mu.Lock()
	first := !c.closed
	c.closed = true
	c.l.mu.Unlock()
	err := c.Conn.Close()
	if first {
		c.l.release(c)
	}
	return err
}
