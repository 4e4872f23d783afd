package auth

import (
	"crypto/ed25519"
	"io"
)

// Hooks for the external tests, which play attackers and need the pieces an
// attacker would have to forge.

func SetRand(p *Plane, r io.Reader) { p.rand = r }

// OpenerProof signs an open message with p's own role key, whatever role
// it names.
func OpenerProof(p *Plane, a, b []byte, role Role, name string, eph []byte) []byte {
	return ed25519.Sign(p.keys.sign, openerMessage(a, b, role, name, eph))
}

func AcceptorProof(p *Plane, a, b []byte, openerRole Role, openerName string, openerEph []byte, role Role, name string, eph []byte) []byte {
	return ed25519.Sign(p.keys.sign, acceptorMessage(a, b, openerRole, openerName, openerEph, role, name, eph))
}

func Frame(typ byte, payload []byte) []byte {
	var w frameBuf
	_ = writeFrame(&w, typ, payload)
	return w
}

func Fields(vs ...[]byte) []byte { return fields(vs...) }

type frameBuf []byte

func (w *frameBuf) Write(b []byte) (int, error) { *w = append(*w, b...); return len(b), nil }

// SecretModeByte is the challenge's mode byte of a secret-mode acceptor.
var SecretModeByte = modeByte[ModeSecret]

const (
	TypeChallenge = typeChallenge
	TypeOpen      = typeOpen
	TypeAccept    = typeAccept
	HeaderLen     = headerLen
)

// ReloadNow makes the next handshake look at the TLS files.
func ReloadNow(p *Plane) { p.checked.Store(0) }
