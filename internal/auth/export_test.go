package auth

import "io"

// Hooks for the external tests, which play attackers and need the pieces an
// attacker would have to forge.

func SetRand(p *Plane, r io.Reader) { p.rand = r }

func OpenerProof(p *Plane, a, b []byte, role Role, name string) []byte {
	return p.openerProof(a, b, role, name)
}

func AcceptorProof(p *Plane, a, b []byte, openerRole Role, openerName string, role Role, name string) []byte {
	return p.acceptorProof(a, b, openerRole, openerName, role, name)
}

func Frame(typ byte, payload []byte) []byte {
	var w frameBuf
	_ = writeFrame(&w, typ, payload)
	return w
}

func Fields(vs ...[]byte) []byte { return fields(vs...) }

type frameBuf []byte

func (w *frameBuf) Write(b []byte) (int, error) { *w = append(*w, b...); return len(b), nil }

const (
	TypeChallenge = typeChallenge
	TypeOpen      = typeOpen
	TypeAccept    = typeAccept
	HeaderLen     = headerLen
)

// ReloadNow makes the next handshake look at the TLS files.
func ReloadNow(p *Plane) { p.checked.Store(0) }
