package auth

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"time"
)

// Session is one authenticated transfer connection.
type Session struct {
	// ID is the same at both ends and new for every session. With
	// credentials it cannot be computed from what crosses the wire (secret:
	// a MAC over both challenges; mtls: exported from the TLS session), so
	// it can key per-session state an eavesdropper must not predict.
	ID   [32]byte
	Peer Peer
}

// The handshake, after the TLS handshake in mtls mode. Every message is one
// frame:
//
//	"BTNS" | version 1 | type | payload length uint16 BE (<= maxPayload) | payload
//
//	acceptor -> opener  challenge: mode | A[32]
//	opener -> acceptor  open:      role | name | B[32] | proof    (role, name, proof: uint8 length + bytes)
//	acceptor -> opener  accept:    role | name | proof
//	acceptor -> opener  refuse:    reason
//
// Frames are read with exact lengths and no buffering, so nothing past the
// handshake is consumed: the transfer protocol starts on the next byte.
const (
	frameVersion = 1
	headerLen    = 8
	maxPayload   = 512

	typeChallenge = 1
	typeOpen      = 2
	typeAccept    = 3
	typeRefuse    = 4

	challengeLen = 32
	// defaultHandshake bounds a handshake whose caller gave no deadline, so a
	// silent peer cannot hold a connection forever.
	defaultHandshake = 10 * time.Second
)

var frameMagic = [4]byte{'B', 'T', 'N', 'S'}

var modeByte = map[Mode]byte{ModeNone: 0, ModeMTLS: 1, ModeSecret: 2}

// sessionError is a refused or broken handshake. The reason is safe to show
// the other side and to count.
type sessionError struct {
	reason string
	err    error
}

func (e *sessionError) Error() string {
	if e.err != nil {
		return "transfer session: " + e.reason + ": " + e.err.Error()
	}
	return "transfer session: " + e.reason
}

func (e *sessionError) Unwrap() error { return e.err }

// AcceptSession authenticates the peer that connected on c, which must be
// one of allow (any role when allow is empty). It returns the connection to
// use from then on (a *tls.Conn in mtls mode). On error c has been closed.
// deadline bounds the whole handshake; none means ten seconds.
func (p *Plane) AcceptSession(c net.Conn, deadline time.Time, allow ...Role) (net.Conn, Session, error) {
	conn, s, err := p.accept(c, deadline, allow)
	if err != nil {
		p.refused(c, err)
		return nil, Session{}, err
	}
	return conn, s, nil
}

// OpenSession authenticates both ends of a connection this member dialled;
// the acceptor must prove role expect. On error c has been closed.
func (p *Plane) OpenSession(c net.Conn, deadline time.Time, expect Role) (net.Conn, Session, error) {
	conn, s, err := p.open(c, deadline, expect)
	if err != nil {
		p.refused(c, err)
		return nil, Session{}, err
	}
	return conn, s, nil
}

func (p *Plane) refused(c net.Conn, err error) {
	var ve *verifyError
	if !errors.As(err, &ve) { // verifyPeer counted it already
		reason := "handshake"
		var se *sessionError
		if errors.As(err, &se) {
			reason = se.reason
		}
		p.fail("transfer", reason, "addr", c.RemoteAddr().String(), "err", err)
	}
	_ = c.Close()
}

func (p *Plane) start(c net.Conn, deadline time.Time) error {
	if deadline.IsZero() {
		deadline = time.Now().Add(defaultHandshake)
	}
	return c.SetDeadline(deadline)
}

func (p *Plane) accept(c net.Conn, deadline time.Time, allow []Role) (net.Conn, Session, error) {
	var s Session
	if err := p.start(c, deadline); err != nil {
		return nil, s, &sessionError{"deadline", err}
	}
	conn := c
	var tc *tls.Conn
	if p.mode == ModeMTLS {
		tc = tls.Server(c, p.serverTLS("transfer", alpnTransfer))
		if err := tc.Handshake(); err != nil {
			return nil, s, &sessionError{"tls handshake", err}
		}
		conn = tc
	}
	var a [challengeLen]byte
	if _, err := io.ReadFull(p.rand, a[:]); err != nil {
		return nil, s, &sessionError{"randomness", err}
	}
	if err := writeFrame(conn, typeChallenge, append([]byte{modeByte[p.mode]}, a[:]...)); err != nil {
		return nil, s, &sessionError{"write", err}
	}
	payload, err := readFrame(conn, typeOpen)
	if err != nil {
		return nil, s, err
	}
	r := reader{b: payload}
	role, name, b, proof := Role(r.field()), string(r.field()), r.fixed(challengeLen), r.field()
	if r.bad || len(r.b) != 0 || !role.valid() || !validName(name) {
		return nil, s, p.refuse(conn, "malformed open")
	}
	peer := Peer{Role: role, Name: name, Addr: c.RemoteAddr().String()}
	switch p.mode {
	case ModeSecret:
		if !hmac.Equal(proof, p.openerProof(a[:], b, role, name)) {
			return nil, s, p.refuse(conn, "bad proof")
		}
		peer.Authenticated = true
	case ModeMTLS:
		proven, ok := tlsPeer(tc.ConnectionState(), peer.Addr)
		if !ok || proven.Role != role || proven.Name != name {
			return nil, s, p.refuse(conn, "identity differs from certificate")
		}
		peer = proven
	}
	if len(allow) > 0 && !slices.Contains(allow, role) {
		return nil, s, p.refuse(conn, "role")
	}
	var mine []byte
	if p.mode == ModeSecret {
		mine = p.acceptorProof(a[:], b, role, name, p.role, p.name)
	}
	if err := writeFrame(conn, typeAccept, fields([]byte(p.role), []byte(p.name), mine)); err != nil {
		return nil, s, &sessionError{"write", err}
	}
	if s.ID, err = p.sessionID(tc, a[:], b); err != nil {
		return nil, s, &sessionError{"session id", err}
	}
	s.Peer = peer
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, s, &sessionError{"deadline", err}
	}
	return conn, s, nil
}

func (p *Plane) open(c net.Conn, deadline time.Time, expect Role) (net.Conn, Session, error) {
	var s Session
	if err := p.start(c, deadline); err != nil {
		return nil, s, &sessionError{"deadline", err}
	}
	conn := c
	var tc *tls.Conn
	if p.mode == ModeMTLS {
		tc = tls.Client(c, p.clientTLS("transfer", expect, alpnTransfer))
		if err := tc.Handshake(); err != nil {
			return nil, s, &sessionError{"tls handshake", err}
		}
		conn = tc
	}
	payload, err := readFrame(conn, typeChallenge)
	if err != nil {
		return nil, s, err
	}
	if len(payload) != 1+challengeLen {
		return nil, s, &sessionError{reason: "malformed challenge"}
	}
	if payload[0] != modeByte[p.mode] {
		return nil, s, &sessionError{reason: fmt.Sprintf("acceptor uses auth mode %d, we use %s (%d)", payload[0], p.mode, modeByte[p.mode])}
	}
	a := payload[1:]
	var b [challengeLen]byte
	if _, err := io.ReadFull(p.rand, b[:]); err != nil {
		return nil, s, &sessionError{"randomness", err}
	}
	var proof []byte
	if p.mode == ModeSecret {
		proof = p.openerProof(a, b[:], p.role, p.name)
	}
	open := fields([]byte(p.role), []byte(p.name))
	open = append(open, b[:]...)
	open = append(open, fields(proof)...)
	if err := writeFrame(conn, typeOpen, open); err != nil {
		return nil, s, &sessionError{"write", err}
	}
	if payload, err = readFrame(conn, typeAccept); err != nil {
		return nil, s, err
	}
	r := reader{b: payload}
	role, name, theirs := Role(r.field()), string(r.field()), r.field()
	if r.bad || len(r.b) != 0 || !role.valid() || !validName(name) {
		return nil, s, &sessionError{reason: "malformed accept"}
	}
	peer := Peer{Role: role, Name: name, Addr: c.RemoteAddr().String()}
	switch p.mode {
	case ModeSecret:
		if !hmac.Equal(theirs, p.acceptorProof(a, b[:], p.role, p.name, role, name)) {
			return nil, s, &sessionError{reason: "bad acceptor proof"}
		}
		peer.Authenticated = true
	case ModeMTLS:
		proven, ok := tlsPeer(tc.ConnectionState(), peer.Addr)
		if !ok || proven.Role != role || proven.Name != name {
			return nil, s, &sessionError{reason: "acceptor identity differs from certificate"}
		}
		peer = proven
	}
	if role != expect {
		return nil, s, &sessionError{reason: fmt.Sprintf("acceptor is %s, want %s", role, expect)}
	}
	if s.ID, err = p.sessionID(tc, a, b[:]); err != nil {
		return nil, s, &sessionError{"session id", err}
	}
	s.Peer = peer
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, s, &sessionError{"deadline", err}
	}
	return conn, s, nil
}

// refuse tells the opener why, best effort, and returns the error to report.
func (p *Plane) refuse(conn net.Conn, reason string) error {
	_ = writeFrame(conn, typeRefuse, fields([]byte(reason)))
	return &sessionError{reason: reason}
}

// The two proofs carry different labels so that neither end's proof can be
// reflected back as the other's.
func (p *Plane) openerProof(a, b []byte, role Role, name string) []byte {
	m := hmac.New(sha256.New, p.kXfer)
	m.Write([]byte("baton transfer opener v1\x00"))
	writeLP(m, a)
	writeLP(m, b)
	writeLP(m, []byte(role))
	writeLP(m, []byte(name))
	return m.Sum(nil)
}

func (p *Plane) acceptorProof(a, b []byte, openerRole Role, openerName string, role Role, name string) []byte {
	m := hmac.New(sha256.New, p.kXfer)
	m.Write([]byte("baton transfer acceptor v1\x00"))
	writeLP(m, a)
	writeLP(m, b)
	writeLP(m, []byte(openerRole))
	writeLP(m, []byte(openerName))
	writeLP(m, []byte(role))
	writeLP(m, []byte(name))
	return m.Sum(nil)
}

func (p *Plane) sessionID(tc *tls.Conn, a, b []byte) ([32]byte, error) {
	var id [32]byte
	switch p.mode {
	case ModeMTLS:
		cs := tc.ConnectionState()
		k, err := cs.ExportKeyingMaterial("baton transfer session v1", append(slices.Clone(a), b...), len(id))
		if err != nil {
			return id, err
		}
		copy(id[:], k)
	case ModeSecret:
		m := hmac.New(sha256.New, p.kXfer)
		m.Write([]byte("baton transfer session v1\x00"))
		writeLP(m, a)
		writeLP(m, b)
		copy(id[:], m.Sum(nil))
	default:
		id = sha256.Sum256(append(slices.Clone(a), b...))
	}
	return id, nil
}

func writeFrame(w io.Writer, typ byte, payload []byte) error {
	if len(payload) > maxPayload {
		return fmt.Errorf("frame of %d bytes exceeds %d", len(payload), maxPayload)
	}
	f := make([]byte, 0, headerLen+len(payload))
	f = append(f, frameMagic[:]...)
	f = append(f, frameVersion, typ, byte(len(payload)>>8), byte(len(payload)))
	f = append(f, payload...)
	_, err := w.Write(f)
	return err
}

// readFrame reads one frame of type want. A refusal from the acceptor comes
// back as its reason.
func readFrame(r io.Reader, want byte) ([]byte, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, &sessionError{"read", err}
	}
	if !bytes.Equal(h[:4], frameMagic[:]) {
		return nil, &sessionError{reason: "not a baton transfer peer"}
	}
	if h[4] != frameVersion {
		return nil, &sessionError{reason: fmt.Sprintf("handshake version %d, want %d", h[4], frameVersion)}
	}
	n := int(h[6])<<8 | int(h[7])
	if n > maxPayload {
		return nil, &sessionError{reason: "oversized frame"}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, &sessionError{"read", err}
	}
	switch h[5] {
	case want:
		return payload, nil
	case typeRefuse:
		rr := reader{b: payload}
		reason := rr.field()
		if !printable(reason) {
			reason = nil
		}
		return nil, &sessionError{reason: "refused by peer: " + string(reason)}
	default:
		return nil, &sessionError{reason: fmt.Sprintf("unexpected message type %d", h[5])}
	}
}

func printable(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return false
		}
	}
	return true
}

// fields encodes each value as uint8 length + bytes. Values are short
// (roles, names of at most maxNameLen, 32-byte proofs, reasons); a longer one
// is cut rather than let its length wrap.
func fields(vs ...[]byte) []byte {
	var out []byte
	for _, v := range vs {
		v = v[:min(len(v), 255)]
		out = append(out, byte(len(v)))
		out = append(out, v...)
	}
	return out
}

// reader takes fields off a payload; any overrun marks it bad instead of panicking.
type reader struct {
	b   []byte
	bad bool
}

func (r *reader) field() []byte {
	if len(r.b) < 1 || len(r.b) < 1+int(r.b[0]) {
		r.bad = true
		r.b = nil
		return nil
	}
	n := int(r.b[0])
	v := r.b[1 : 1+n]
	r.b = r.b[1+n:]
	return v
}

func (r *reader) fixed(n int) []byte {
	if len(r.b) < n {
		r.bad = true
		r.b = nil
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
