package auth_test

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

// noLeaks fails the test if it leaves goroutines behind.
func noLeaks(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		for end := time.Now().Add(3 * time.Second); runtime.NumGoroutine() > before; {
			if time.Now().After(end) {
				buf := make([]byte, 1<<16)
				t.Fatalf("%d goroutines left behind:\n%s", runtime.NumGoroutine()-before, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// tcpPair is a connected loopback pair; unlike net.Pipe its writes do not
// wait for the reader, as a real attacker's would not.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err = net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = lis.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

type result struct {
	conn net.Conn
	s    auth.Session
	err  error
}

// handshake runs an acceptor and an opener against each other on c/s.
func handshake(opener, acceptor *auth.Plane, c, s net.Conn, expect auth.Role, allow ...auth.Role) (o, a result) {
	return handshakeBy(time.Now().Add(time.Second), opener, acceptor, c, s, expect, allow...)
}

func handshakeBy(deadline time.Time, opener, acceptor *auth.Plane, c, s net.Conn, expect auth.Role, allow ...auth.Role) (o, a result) {
	done := make(chan result)
	go func() {
		conn, sess, err := acceptor.AcceptSession(s, deadline, allow...)
		done <- result{conn, sess, err}
	}()
	conn, sess, err := opener.OpenSession(c, deadline, expect)
	o = result{conn, sess, err}
	if err != nil {
		c.Close() // already closed by OpenSession; again so a pipe acceptor never waits
	}
	a = <-done
	return o, a
}

type pairFunc func(t *testing.T) (net.Conn, net.Conn)

func pipePair(t *testing.T) (net.Conn, net.Conn) {
	c, s := net.Pipe()
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

// planes returns an opener (prefill) and acceptor (decode) in each mode.
func planes(t *testing.T) map[auth.Mode][2]*auth.Plane {
	ca := authtest.NewCA(t)
	secret := authtest.SecretFile(t)
	return map[auth.Mode][2]*auth.Plane{
		auth.ModeNone: {newPlane(t, auth.Options{Role: auth.RolePrefill, Name: "p-0"}, nil),
			newPlane(t, auth.Options{Role: auth.RoleDecode, Name: "d-0"}, nil)},
		auth.ModeSecret: {newPlane(t, authtest.SecretOptions(secret, auth.RolePrefill), nil),
			newPlane(t, authtest.SecretOptions(secret, auth.RoleDecode), nil)},
		auth.ModeMTLS: {newPlane(t, ca.Options(t, auth.RolePrefill), nil),
			newPlane(t, ca.Options(t, auth.RoleDecode), nil)},
	}
}

func TestSessionGood(t *testing.T) {
	for mode, pl := range planes(t) {
		for name, pair := range map[string]pairFunc{"pipe": pipePair, "tcp": tcpPair} {
			t.Run(string(mode)+"/"+name, func(t *testing.T) {
				noLeaks(t)
				c, s := pair(t)
				o, a := handshake(pl[0], pl[1], c, s, auth.RoleDecode, auth.RolePrefill)
				if o.err != nil || a.err != nil {
					t.Fatalf("opener: %v; acceptor: %v", o.err, a.err)
				}
				if o.s.ID != a.s.ID || o.s.ID == ([32]byte{}) {
					t.Fatalf("session IDs differ or are empty: %x / %x", o.s.ID, a.s.ID)
				}
				authd := mode != auth.ModeNone
				if p := a.s.Peer; p.Role != auth.RolePrefill || p.Name != pl[0].Name() || p.Authenticated != authd || p.Addr == "" {
					t.Errorf("acceptor sees %+v", p)
				}
				if p := o.s.Peer; p.Role != auth.RoleDecode || p.Name != pl[1].Name() || p.Authenticated != authd {
					t.Errorf("opener sees %+v", p)
				}
				// The handshake must not eat the transfer stream's first bytes.
				go func() { _, _ = o.conn.Write([]byte("kv pages")) }()
				got := make([]byte, 8)
				if _, err := io.ReadFull(a.conn, got); err != nil || string(got) != "kv pages" {
					t.Fatalf("after the handshake read %q, %v", got, err)
				}
				// Closing the raw ends: a TLS close_notify would wait on a pipe nobody reads.
				c.Close()
				s.Close()

				// A second session between the same two has another ID.
				c, s = pair(t)
				o2, a2 := handshake(pl[0], pl[1], c, s, auth.RoleDecode)
				if o2.err != nil || a2.err != nil || o2.s.ID == o.s.ID {
					t.Fatalf("second session: %v %v, same ID %v", o2.err, a2.err, o2.s.ID == o.s.ID)
				}
				c.Close()
				s.Close()
			})
		}
	}
}

// TestSessionDeadlineCleared: the deadline bounds the handshake, not the
// transfer that follows it.
func TestSessionDeadlineCleared(t *testing.T) {
	for mode, pl := range planes(t) {
		t.Run(string(mode), func(t *testing.T) {
			noLeaks(t)
			c, s := tcpPair(t)
			o, a := handshakeBy(time.Now().Add(300*time.Millisecond), pl[0], pl[1], c, s, auth.RoleDecode)
			if o.err != nil || a.err != nil {
				t.Fatal(o.err, a.err)
			}
			time.Sleep(400 * time.Millisecond)
			if _, err := o.conn.Write([]byte("late")); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 4)
			if _, err := io.ReadFull(a.conn, got); err != nil {
				t.Fatalf("read after the handshake deadline: %v", err)
			}
		})
	}
}

// refusedBoth checks both ends fail, within the deadline, the acceptor
// counting it as reason.
func refusedBoth(t *testing.T, opener, acceptor *auth.Plane, f *failures, reason string, expect auth.Role, allow ...auth.Role) (o, a result) {
	t.Helper()
	start := time.Now()
	c, s := pipePair(t)
	o, a = handshake(opener, acceptor, c, s, expect, allow...)
	if o.err == nil || a.err == nil {
		t.Fatalf("handshake succeeded: opener %v, acceptor %v", o.err, a.err)
	}
	if time.Since(start) > 1500*time.Millisecond {
		t.Fatalf("refusal took %v", time.Since(start))
	}
	if f != nil {
		f.want(t, "transfer", reason)
	}
	return o, a
}

func TestSessionRefused(t *testing.T) {
	ca := authtest.NewCA(t)
	secret := authtest.SecretFile(t)
	var f failures
	secretDecode := newPlane(t, authtest.SecretOptions(secret, auth.RoleDecode), &f)
	secretPrefill := newPlane(t, authtest.SecretOptions(secret, auth.RolePrefill), nil)
	mtlsDecode := newPlane(t, ca.Options(t, auth.RoleDecode), &f)

	t.Run("wrong secret", func(t *testing.T) {
		noLeaks(t)
		other := newPlane(t, authtest.SecretOptions(authtest.SecretFile(t), auth.RolePrefill), nil)
		o, _ := refusedBoth(t, other, secretDecode, &f, "bad proof", auth.RoleDecode)
		if !strings.Contains(o.err.Error(), "refused by peer: bad proof") {
			t.Errorf("opener error: %v", o.err)
		}
	})
	t.Run("role not allowed", func(t *testing.T) {
		noLeaks(t)
		router := newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil)
		refusedBoth(t, router, secretDecode, &f, "role", auth.RoleDecode, auth.RolePrefill)
	})
	t.Run("acceptor of the wrong role", func(t *testing.T) {
		noLeaks(t)
		// The acceptor speaks last and may think all went well; the opener
		// hangs up, so the acceptor's first read ends the session.
		c, s := pipePair(t)
		o, _ := handshake(secretPrefill, secretDecode, c, s, auth.RolePrefill)
		if o.err == nil || !strings.Contains(o.err.Error(), "acceptor is decode, want prefill") {
			t.Errorf("opener error: %v", o.err)
		}
	})
	t.Run("mode mismatch", func(t *testing.T) {
		noLeaks(t)
		none := newPlane(t, auth.Options{Role: auth.RolePrefill}, nil)
		refusedBoth(t, none, secretDecode, &f, "read", auth.RoleDecode)
		refusedBoth(t, secretPrefill, newPlane(t, auth.Options{Role: auth.RoleDecode}, nil), nil, "", auth.RoleDecode)
	})
	t.Run("stranger certificate", func(t *testing.T) {
		noLeaks(t)
		// A stranger's plane refuses our acceptor's certificate first...
		var sf failures
		stranger := newPlane(t, authtest.NewCA(t).Options(t, auth.RolePrefill), &sf)
		refusedBoth(t, stranger, mtlsDecode, &f, "tls handshake", auth.RoleDecode)
		sf.want(t, "transfer", "untrusted certificate")
	})
	// ...so certificates our acceptor must refuse come from a bare TLS client.
	for name, c := range map[string]struct {
		issue  func() (string, string)
		reason string
	}{
		"stranger CA": {func() (string, string) { return authtest.NewCA(t).Issue(t, auth.RolePrefill) }, "untrusted certificate"},
		"expired":     {func() (string, string) { return ca.IssueExpired(t, auth.RolePrefill) }, "certificate expired"},
		"no role SAN": {func() (string, string) { return ca.IssueWithoutRole(t) }, "no role"},
	} {
		t.Run("bare TLS/"+name, func(t *testing.T) {
			cert, key := c.issue()
			cfg := authtest.RawTLS(t, cert, key)
			cfg.NextProtos = []string{"baton-transfer/1"}
			err := attack(t, mtlsDecode, 2*time.Second, func(c net.Conn) {
				tc := tls.Client(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
				if err := tc.Handshake(); err != nil {
					return
				}
				buf := make([]byte, 64)
				_, _ = tc.Read(buf)
			})
			if err == nil {
				t.Fatal("accepted")
			}
			f.want(t, "transfer", c.reason)
		})
	}
	t.Run("mtls wrong roles", func(t *testing.T) {
		noLeaks(t)
		var of failures
		prefill := newPlane(t, ca.Options(t, auth.RolePrefill), &of)
		refusedBoth(t, prefill, mtlsDecode, nil, "", auth.RolePrefill)
		of.want(t, "transfer", "role")
		refusedBoth(t, prefill, mtlsDecode, &f, "role", auth.RoleDecode, auth.RoleRouter)
	})
	t.Run("claims another identity than its certificate", func(t *testing.T) {
		cert, key := ca.Issue(t, auth.RolePrefill)
		for _, claim := range [][2]string{{"prefill", "someone-else"}, {"decode", "prefill-test"}} {
			err := attack(t, mtlsDecode, 2*time.Second, func(c net.Conn) {
				cfg := authtest.RawTLS(t, cert, key)
				cfg.NextProtos = []string{"baton-transfer/1"}
				tc := tls.Client(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(2 * time.Second))
				readChallenge(t, tc)
				open := append(auth.Fields([]byte(claim[0]), []byte(claim[1])), make([]byte, 32)...)
				_, _ = tc.Write(auth.Frame(auth.TypeOpen, append(open, 0)))
				_, _ = tc.Read(make([]byte, 64))
			})
			if !strings.Contains(err.Error(), "identity differs from certificate") {
				t.Fatalf("claim %q: got %v", claim, err)
			}
		}
	})
	t.Run("plaintext opener to mtls", func(t *testing.T) {
		noLeaks(t)
		refusedBoth(t, newPlane(t, auth.Options{Role: auth.RolePrefill}, nil), mtlsDecode, &f, "tls handshake", auth.RoleDecode)
	})
}

// attack runs an acceptor on a loopback pair and hands the attacker's end to
// play, which may write anything; the acceptor must refuse within its deadline.
func attack(t *testing.T, acceptor *auth.Plane, deadline time.Duration, play func(c net.Conn)) error {
	t.Helper()
	noLeaks(t)
	c, s := tcpPair(t)
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		conn, _, err := acceptor.AcceptSession(s, time.Now().Add(deadline), auth.RolePrefill)
		if conn != nil {
			conn.Close()
		}
		done <- err
	}()
	play(c)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("acceptor accepted")
		}
		if el := time.Since(start); el > deadline+time.Second {
			t.Fatalf("acceptor took %v with a %v deadline", el, deadline)
		}
		return err
	case <-time.After(deadline + 2*time.Second):
		t.Fatal("acceptor ignored its deadline")
		return nil
	}
}

func readChallenge(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b := make([]byte, auth.HeaderLen+33)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatal(err)
	}
	return b[auth.HeaderLen+1:]
}

// ephemeral is a valid X25519 public key, as an opener would send.
func ephemeral(t *testing.T) []byte {
	t.Helper()
	k, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey().Bytes()
}

// recorder keeps what the opener wrote.
type recorder struct {
	net.Conn
	w bytes.Buffer
}

func (r *recorder) Write(b []byte) (int, error) { r.w.Write(b); return r.Conn.Write(b) }

func TestSessionAttacks(t *testing.T) {
	secret := authtest.SecretFile(t)
	var f failures
	acceptor := newPlane(t, authtest.SecretOptions(secret, auth.RoleDecode), &f)
	opener := newPlane(t, authtest.SecretOptions(secret, auth.RolePrefill), nil)

	t.Run("replayed opener message", func(t *testing.T) {
		c, s := tcpPair(t)
		rec := &recorder{Conn: c}
		if o, a := handshake(opener, acceptor, rec, s, auth.RoleDecode); o.err != nil || a.err != nil {
			t.Fatal(o.err, a.err)
		}
		openMsg := rec.w.Bytes()
		err := attack(t, acceptor, time.Second, func(c net.Conn) {
			readChallenge(t, c)
			_, _ = c.Write(openMsg)
		})
		if !strings.Contains(err.Error(), "bad proof") {
			t.Fatalf("replay refused for the wrong reason: %v", err)
		}
	})
	t.Run("acceptor's proof reflected as the opener's", func(t *testing.T) {
		eph := ephemeral(t)
		err := attack(t, acceptor, time.Second, func(c net.Conn) {
			a := readChallenge(t, c)
			b := make([]byte, 32)
			_, _ = rand.Read(b)
			// Forged with the real key, under the acceptor's label: what an
			// attacker could get an acceptor to say.
			proof := auth.AcceptorProof(opener, a, b, auth.RolePrefill, "prefill-test", eph, auth.RoleDecode, "decode-test", eph)
			open := append(auth.Fields([]byte("prefill"), []byte("prefill-test")), b...)
			_, _ = c.Write(auth.Frame(auth.TypeOpen, append(open, auth.Fields(proof, eph)...)))
		})
		if !strings.Contains(err.Error(), "bad proof") {
			t.Fatalf("got %v", err)
		}
		// Sanity: the opener label with the same fields does pass.
		c, s := tcpPair(t)
		done := make(chan error, 1)
		go func() {
			_, _, err := acceptor.AcceptSession(s, time.Now().Add(time.Second))
			done <- err
		}()
		a := readChallenge(t, c)
		b := make([]byte, 32)
		open := append(auth.Fields([]byte("prefill"), []byte("prefill-test")), b...)
		_, _ = c.Write(auth.Frame(auth.TypeOpen, append(open, auth.Fields(auth.OpenerProof(opener, a, b, auth.RolePrefill, "prefill-test", eph), eph)...)))
		if err := <-done; err != nil {
			t.Fatalf("the honest proof was refused: %v", err)
		}
	})
	t.Run("opener's proof mirrored as the acceptor's", func(t *testing.T) {
		noLeaks(t)
		c, s := tcpPair(t)
		done := make(chan error, 1)
		go func() {
			_, _, err := opener.OpenSession(c, time.Now().Add(2*time.Second), auth.RoleDecode)
			done <- err
		}()
		a := make([]byte, 32)
		_, _ = s.Write(auth.Frame(auth.TypeChallenge, append([]byte{auth.SecretModeByte}, a...)))
		_ = s.SetDeadline(time.Now().Add(2 * time.Second))
		h := make([]byte, auth.HeaderLen)
		if _, err := io.ReadFull(s, h); err != nil {
			t.Fatal(err)
		}
		payload := make([]byte, int(h[6])<<8|int(h[7]))
		if _, err := io.ReadFull(s, payload); err != nil {
			t.Fatal(err)
		}
		// The open ends with the opener's signature and its ephemeral key.
		eph := payload[len(payload)-32:]
		proof := payload[len(payload)-33-64 : len(payload)-33]
		_, _ = s.Write(auth.Frame(auth.TypeAccept, auth.Fields([]byte("decode"), []byte("decode-test"), proof, eph)))
		if err := <-done; err == nil || !strings.Contains(err.Error(), "bad acceptor proof") {
			t.Fatalf("opener took a mirrored proof: %v", err)
		}
	})
	t.Run("garbage", func(t *testing.T) {
		err := attack(t, acceptor, time.Second, func(c net.Conn) {
			_, _ = c.Write([]byte("GET / HTTP/1.1\r\nHost: decode\r\n\r\n"))
		})
		if !strings.Contains(err.Error(), "not a baton transfer peer") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("oversized length", func(t *testing.T) {
		err := attack(t, acceptor, time.Second, func(c net.Conn) {
			readChallenge(t, c)
			_, _ = c.Write([]byte{'B', 'T', 'N', 'S', 1, auth.TypeOpen, 0xff, 0xff})
		})
		if !strings.Contains(err.Error(), "oversized frame") {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("truncated then silent", func(t *testing.T) {
		err := attack(t, acceptor, 300*time.Millisecond, func(c net.Conn) {
			readChallenge(t, c)
			_, _ = c.Write([]byte{'B', 'T', 'N', 'S', 1, auth.TypeOpen, 0, 100, 1, 2, 3})
		})
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("got %v, want a timeout", err)
		}
	})
	t.Run("truncated then closed", func(t *testing.T) {
		err := attack(t, acceptor, time.Second, func(c net.Conn) {
			readChallenge(t, c)
			_, _ = c.Write([]byte{'B', 'T', 'N', 'S', 1, auth.TypeOpen, 0, 100, 1, 2, 3})
			c.Close()
		})
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("silent", func(t *testing.T) {
		attack(t, acceptor, 200*time.Millisecond, func(net.Conn) {})
	})
	t.Run("malformed fields", func(t *testing.T) {
		for _, payload := range [][]byte{
			nil,
			{200},
			auth.Fields([]byte("prefill"), []byte("bad name!")),
			append(auth.Fields([]byte("prefill"), []byte("p")), make([]byte, 31)...),
			append(append(auth.Fields([]byte("admin"), []byte("p")), make([]byte, 32)...), 0),
			append(append(auth.Fields([]byte("prefill"), []byte("p")), make([]byte, 32)...), 0, 9),
		} {
			err := attack(t, acceptor, time.Second, func(c net.Conn) {
				readChallenge(t, c)
				_, _ = c.Write(auth.Frame(auth.TypeOpen, payload))
			})
			if !strings.Contains(err.Error(), "malformed open") {
				t.Fatalf("%x: got %v", payload, err)
			}
		}
	})
	t.Run("old version", func(t *testing.T) {
		err := attack(t, acceptor, time.Second, func(c net.Conn) {
			readChallenge(t, c)
			_, _ = c.Write([]byte{'B', 'T', 'N', 'S', 0, auth.TypeOpen, 0, 0})
		})
		if !strings.Contains(err.Error(), "version") {
			t.Fatalf("got %v", err)
		}
	})
	f.want(t, "transfer", "read")
}
