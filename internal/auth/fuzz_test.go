package auth_test

import (
	"bytes"
	"crypto/ecdh"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

// fuzzConn plays an opener that sends fixed bytes and ignores all replies;
// it ends with EOF, never blocks, and starts no goroutine.
type fuzzConn struct{ r *bytes.Reader }

func (c *fuzzConn) Read(b []byte) (int, error)       { return c.r.Read(b) }
func (c *fuzzConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *fuzzConn) Close() error                     { return nil }
func (c *fuzzConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (c *fuzzConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2} }
func (c *fuzzConn) SetDeadline(time.Time) error      { return nil }
func (c *fuzzConn) SetReadDeadline(time.Time) error  { return nil }
func (c *fuzzConn) SetWriteDeadline(time.Time) error { return nil }

// zeroReader makes every challenge zero, so seeds can carry valid proofs and
// the fuzzer can reach the code behind them.
type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// FuzzAcceptSession feeds arbitrary bytes to an acceptor; the first byte
// picks the mode. It must refuse cleanly, never panic or hang, and accept
// only a peer of an allowed role.
func FuzzAcceptSession(f *testing.F) {
	ca := authtest.NewCA(f)
	secret := authtest.SecretFile(f)
	var acceptors []*auth.Plane
	for _, o := range []auth.Options{
		{Role: auth.RoleDecode, Name: "d-0"},
		authtest.SecretOptions(secret, auth.RoleDecode),
		ca.Options(f, auth.RoleDecode),
	} {
		// f.Log may not be called from the fuzz function.
		o.Log = slog.New(slog.DiscardHandler)
		p := newPlane(f, o, nil)
		auth.SetRand(p, zeroReader{})
		acceptors = append(acceptors, p)
	}
	opener := newPlane(f, authtest.SecretOptions(secret, auth.RolePrefill), nil)

	zero := make([]byte, 32)
	b := bytes.Repeat([]byte{7}, 32)
	// eph follows the proof in secret mode only.
	openFrame := func(role, name string, proof []byte, eph ...[]byte) []byte {
		open := append(auth.Fields([]byte(role), []byte(name)), b...)
		return auth.Frame(auth.TypeOpen, append(open, auth.Fields(append([][]byte{proof}, eph...)...)...))
	}
	ephKey, err := ecdh.X25519().NewPrivateKey(bytes.Repeat([]byte{9}, 32))
	if err != nil {
		f.Fatal(err)
	}
	eph := ephKey.PublicKey().Bytes()
	good := openFrame("prefill", "prefill-test", auth.OpenerProof(opener, zero, b, auth.RolePrefill, "prefill-test", eph), eph)
	// The seeds must reach the accepting path, or the fuzzer starts blind.
	for i, in := range [][]byte{openFrame("prefill", "p-0", nil), good} {
		if _, _, err := acceptors[i].AcceptSession(&fuzzConn{bytes.NewReader(in)}, time.Now().Add(time.Second)); err != nil {
			f.Fatalf("%s acceptor refused the valid seed: %v", acceptors[i].Mode(), err)
		}
	}
	f.Add(append([]byte{0}, openFrame("prefill", "p-0", nil)...))
	f.Add(append([]byte{1}, good...))
	f.Add(append([]byte{1}, good[:len(good)-5]...))
	f.Add(append([]byte{0}, openFrame("router", "r", nil)...))
	f.Add(append([]byte{1}, openFrame("prefill", "prefill-test", zero, eph)...))
	f.Add([]byte{2, 0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5})
	f.Add([]byte{0, 'B', 'T', 'N', 'S', 1, 2, 0xff, 0xff})
	f.Add([]byte{1, 'B', 'T', 'N', 'S', 1, 4, 0, 3, 2, 'h', 'i'})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))

	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 {
			return
		}
		p := acceptors[int(in[0])%len(acceptors)]
		conn, s, err := p.AcceptSession(&fuzzConn{bytes.NewReader(in[1:])}, time.Now().Add(time.Second), auth.RolePrefill)
		if err != nil {
			if conn != nil {
				t.Fatal("a refused session returned a connection")
			}
			return
		}
		if conn == nil || s.Peer.Role != auth.RolePrefill {
			t.Fatalf("accepted %+v", s.Peer)
		}
		if p.Mode() == auth.ModeSecret && !bytes.Contains(in, good[auth.HeaderLen:]) {
			t.Fatalf("secret-mode acceptor took a session without the one valid proof: %x", in)
		}
	})
}
