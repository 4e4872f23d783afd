package auth

import (
	"bytes"
	"crypto/ecdh"
	"crypto/ed25519"
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
	// keyed by the X25519 secret of the two ends' ephemeral keys; mtls:
	// exported from the TLS session), so it can key per-session state an
	// eavesdropper must not predict.
	ID   [32]byte
	Peer Peer
}

// The handshake, after the TLS handshake in mtls mode. Every message is one
// frame:
//
//	"BTNS" | version 1 | type | payload length uint16 BE (<= maxPayload) | payload
//
//	acceptor -> opener  challenge: mode | A[32]
//	opener -> acceptor  open:      role | name | B[32] | proof [| eph]   (role, name, proof, eph: uint8 length + bytes)
//	acceptor -> opener  accept:    role | name | proof [| eph]
//	acceptor -> opener  refuse:    reason
//
// In secret mode proof is an Ed25519 signature by the sender's role key and
// eph the sender's ephemeral X25519 public key; both signatures cover A, B,
// the opener's role, name and eph, and the acceptor's also its own. In the
// other modes proof and eph are empty and eph is left out.
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

// modeByte tells the opener how the acceptor authenticates. 2 was secret
// mode with one key shared by every role; a member of that kind and one of
// this are told apart by it instead of refusing each other's proofs.
var modeByte = map[Mode]byte{ModeNone: 0, ModeMTLS: 1, ModeSecret: 3}

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
	var theirEph []byte
	if p.mode == ModeSecret {
		theirEph = r.field()
	}
	if r.bad || len(r.b) != 0 || !role.valid() || !validName(name) {
		return nil, s, p.refuse(conn, "malformed open")
	}
	peer := Peer{Role: role, Name: name, Addr: c.RemoteAddr().String()}
	var openerPub *ecdh.PublicKey
	switch p.mode {
	case ModeSecret:
		if !ed25519.Verify(p.keys.public[role], openerMessage(a[:], b, role, name, theirEph), proof) {
			return nil, s, p.refuse(conn, "bad proof")
		}
		if openerPub, err = ecdh.X25519().NewPublicKey(theirEph); err != nil {
			return nil, s, p.refuse(conn, "bad key exchange")
		}
		peer.Authenticated, peer.Key = true, p.keys.ids[role]
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
	accept := fields([]byte(p.role), []byte(p.name))
	var x *exchange
	if p.mode == ModeSecret {
		eph, err := ecdh.X25519().GenerateKey(p.rand)
		if err != nil {
			return nil, s, &sessionError{"randomness", err}
		}
		shared, err := eph.ECDH(openerPub)
		if err != nil { // a low-order point: only a key holder gets this far
			return nil, s, p.refuse(conn, "bad key exchange")
		}
		mine := eph.PublicKey().Bytes()
		x = &exchange{shared: shared, openerEph: theirEph, acceptorEph: mine}
		sig := ed25519.Sign(p.keys.sign, acceptorMessage(a[:], b, role, name, theirEph, p.role, p.name, mine))
		accept = append(accept, fields(sig, mine)...)
	} else {
		accept = append(accept, fields(nil)...)
	}
	if err := writeFrame(conn, typeAccept, accept); err != nil {
		return nil, s, &sessionError{"write", err}
	}
	if s.ID, err = p.sessionID(tc, a[:], b, x); err != nil {
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
	open := fields([]byte(p.role), []byte(p.name))
	open = append(open, b[:]...)
	var eph *ecdh.PrivateKey
	var mine []byte
	if p.mode == ModeSecret {
		if eph, err = ecdh.X25519().GenerateKey(p.rand); err != nil {
			return nil, s, &sessionError{"randomness", err}
		}
		mine = eph.PublicKey().Bytes()
		open = append(open, fields(ed25519.Sign(p.keys.sign, openerMessage(a, b[:], p.role, p.name, mine)), mine)...)
	} else {
		open = append(open, fields(nil)...)
	}
	if err := writeFrame(conn, typeOpen, open); err != nil {
		return nil, s, &sessionError{"write", err}
	}
	if payload, err = readFrame(conn, typeAccept); err != nil {
		return nil, s, err
	}
	r := reader{b: payload}
	role, name, theirs := Role(r.field()), string(r.field()), r.field()
	var theirEph []byte
	if p.mode == ModeSecret {
		theirEph = r.field()
	}
	if r.bad || len(r.b) != 0 || !role.valid() || !validName(name) {
		return nil, s, &sessionError{reason: "malformed accept"}
	}
	peer := Peer{Role: role, Name: name, Addr: c.RemoteAddr().String()}
	var x *exchange
	switch p.mode {
	case ModeSecret:
		if !ed25519.Verify(p.keys.public[role], acceptorMessage(a, b[:], p.role, p.name, mine, role, name, theirEph), theirs) {
			return nil, s, &sessionError{reason: "bad acceptor proof"}
		}
		pub, err := ecdh.X25519().NewPublicKey(theirEph)
		if err != nil {
			return nil, s, &sessionError{reason: "bad key exchange"}
		}
		shared, err := eph.ECDH(pub)
		if err != nil {
			return nil, s, &sessionError{reason: "bad key exchange"}
		}
		x = &exchange{shared: shared, openerEph: mine, acceptorEph: theirEph}
		peer.Authenticated, peer.Key = true, p.keys.ids[role]
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
	if s.ID, err = p.sessionID(tc, a, b[:], x); err != nil {
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

// exchange is a secret-mode session's X25519 agreement.
type exchange struct {
	shared                 []byte
	openerEph, acceptorEph []byte
}

// The two signed messages carry different labels so that neither end's
// proof can be reflected back as the other's.
func openerMessage(a, b []byte, role Role, name string, eph []byte) []byte {
	var m bytes.Buffer
	m.WriteString("baton transfer opener v2\x00")
	for _, f := range [][]byte{a, b, []byte(role), []byte(name), eph} {
		writeLP(&m, f)
	}
	return m.Bytes()
}

func acceptorMessage(a, b []byte, openerRole Role, openerName string, openerEph []byte, role Role, name string, eph []byte) []byte {
	var m bytes.Buffer
	m.WriteString("baton transfer acceptor v2\x00")
	for _, f := range [][]byte{a, b, []byte(openerRole), []byte(openerName), openerEph, []byte(role), []byte(name), eph} {
		writeLP(&m, f)
	}
	return m.Bytes()
}

func (p *Plane) sessionID(tc *tls.Conn, a, b []byte, x *exchange) ([32]byte, error) {
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
		m := hmac.New(sha256.New, x.shared)
		m.Write([]byte("baton transfer session v2\x00"))
		for _, f := range [][]byte{a, b, x.openerEph, x.acceptorEph} {
			writeLP(m, f)
		}
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
