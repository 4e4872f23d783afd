package transfer

import (
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Handshake runs on a transfer connection before any frame, on both ends:
// it authenticates the peer (or not, see Plain) and names the session. The
// connection it returns is the one to use from then on (a TLS connection,
// say). The receiver calls Accept, the sender Open.
type Handshake interface {
	Accept(c net.Conn, deadline time.Time) (net.Conn, SessionID, error)
	Open(c net.Conn, deadline time.Time) (net.Conn, SessionID, error)
}

// Plain names sessions and authenticates nobody: each end sends fresh
// random bytes and the session's ID is the hash of both. It is what a
// transport uses when it is given no Handshake (loopback, tests).
type Plain struct{}

var plainMagic = [4]byte{'B', 'T', 'S', '1'}

// Accept implements Handshake.
func (Plain) Accept(c net.Conn, deadline time.Time) (net.Conn, SessionID, error) {
	return plainExchange(c, deadline, true)
}

// Open implements Handshake.
func (Plain) Open(c net.Conn, deadline time.Time) (net.Conn, SessionID, error) {
	return plainExchange(c, deadline, false)
}

// plainExchange sends this end's nonce and reads the other's; the
// receiver's nonce goes first in the hash.
func plainExchange(c net.Conn, deadline time.Time, acceptor bool) (net.Conn, SessionID, error) {
	var mine, theirs [len(plainMagic) + 32]byte
	copy(mine[:], plainMagic[:])
	if _, err := rand.Read(mine[len(plainMagic):]); err != nil {
		return nil, SessionID{}, err
	}
	_ = c.SetDeadline(deadline)
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := c.Write(mine[:]); err != nil {
		return nil, SessionID{}, fmt.Errorf("session handshake: %w", err)
	}
	if _, err := io.ReadFull(c, theirs[:]); err != nil {
		return nil, SessionID{}, fmt.Errorf("session handshake: %w", err)
	}
	if [4]byte(theirs[:4]) != plainMagic {
		return nil, SessionID{}, errors.New("session handshake: the peer does not speak baton's transfer protocol (or wants authentication)")
	}
	first, second := mine[4:], theirs[4:]
	if !acceptor {
		first, second = second, first
	}
	h := sha256.New()
	h.Write([]byte("baton transfer session\x00"))
	h.Write(first)
	h.Write(second)
	return c, SessionID(h.Sum(nil)), nil
}
