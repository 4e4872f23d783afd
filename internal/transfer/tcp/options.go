// Package tcp is the pure-Go transport: the prefill side streams page
// frames over one TCP connection per session, and the decode side's
// receiver hands each frame to its transfer.Sink, in order, on one
// goroutine per connection.
//
// The end of a session is the proof decode needs before it reuses pages:
// the receiver calls Sink.Closed only after the connection is closed and
// the goroutine that called Sink.Write has returned. The sender's Close
// waits for the receiver to close its end (after it processed every byte
// that was sent) so that a returned Close also means nothing is in flight.
package tcp

import (
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// Defaults for the options.
const (
	DefaultMaxPayload       = 64 << 20
	DefaultQueueDepth       = 8
	DefaultSocketBuffer     = 4 << 20
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultCloseTimeout     = 10 * time.Second
	// DefaultArenaQuarantine is how long a session's staged bytes stay
	// out of use after an end the receiver did not confirm.
	DefaultArenaQuarantine = time.Minute
)

type config struct {
	maxPayload       int
	queueDepth       int
	socketBuffer     int
	handshakeTimeout time.Duration
	closeTimeout     time.Duration
	handshake        transfer.Handshake
	// arena (sender) and importer (receiver): cuda-ipc; see WithArena.
	arena      kernels.Arena
	quarantine time.Duration
	importer   kernels.PeerImporter
}

func newConfig(opts []Option) config {
	c := config{
		maxPayload:       DefaultMaxPayload,
		queueDepth:       DefaultQueueDepth,
		socketBuffer:     DefaultSocketBuffer,
		handshakeTimeout: DefaultHandshakeTimeout,
		closeTimeout:     DefaultCloseTimeout,
		handshake:        transfer.Plain{},
		quarantine:       DefaultArenaQuarantine,
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

// Option tunes a Receiver or a Sender; each applies to the side(s) named
// in its doc and is ignored by the other.
type Option func(*config)

// WithHandshake sets how each connection is authenticated and its session
// named before any frame (both sides; the default, transfer.Plain,
// authenticates nobody).
func WithHandshake(h transfer.Handshake) Option {
	return func(c *config) {
		if h != nil {
			c.handshake = h
		}
	}
}

// WithMaxPayload bounds one page frame's payload (both sides). A receiver
// drops a connection whose frame claims more, so a hostile or broken peer
// cannot make it allocate without bound; a sender refuses to send it.
// n <= 0 keeps the default.
func WithMaxPayload(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.maxPayload = min(n, 1<<31-1)
		}
	}
}

// WithQueueDepth sets how many frames a session queues for its writer
// goroutine before Write blocks (sender). This, plus the socket buffers,
// bounds what a slow receiver can make the sender hold. n <= 0 keeps the
// default.
func WithQueueDepth(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.queueDepth = n
		}
	}
}

// WithSocketBuffer sets SO_SNDBUF and SO_RCVBUF on each connection (both
// sides; the kernel caps it at net.core.[rw]mem_max). n = 0 leaves the
// kernel's autotuning alone; n < 0 keeps the default.
func WithSocketBuffer(n int) Option {
	return func(c *config) {
		if n >= 0 {
			c.socketBuffer = n
		}
	}
}

// WithHandshakeTimeout bounds how long a receiver waits for a new
// connection's HELLO, so that idle connections do not pin goroutines.
// d <= 0 keeps the default.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.handshakeTimeout = d
		}
	}
}

// WithCloseTimeout bounds how long a sender's Close waits for the receiver
// to confirm that it processed everything sent and closed its end. Past
// it, Close drops the connection and returns an error, since it cannot
// claim that nothing is in flight. d <= 0 keeps the default.
func WithCloseTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.closeTimeout = d
		}
	}
}

// WithArena makes a sender's sessions stage pages in a (device memory
// another process on the node maps: cuda-ipc) and send only where they
// are; the receiver copies them from there itself (sender). A session that
// finds no room in a sends the rows in the frame, as without it. The
// handle of a goes to a receiver only inside an admitted session's
// connection, after the handshake.
func WithArena(a kernels.Arena) Option {
	return func(c *config) { c.arena = a }
}

// WithArenaQuarantine sets how long a session's staged bytes stay unused
// after an end the receiver did not confirm (a timeout, an abort), since
// a copy out of them may still run (sender). d <= 0 keeps the default.
func WithArenaQuarantine(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.quarantine = d
		}
	}
}

// WithPeerImporter lets a receiver take staged pages: it maps a sender's
// arena through imp (the decode pool) once per arena and copies each page
// from it into the page the frame names, through the Sink's gate like any
// page (receiver). Without it a session that sends an arena is refused.
func WithPeerImporter(imp kernels.PeerImporter) Option {
	return func(c *config) { c.importer = imp }
}
