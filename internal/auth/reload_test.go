package auth_test

import (
	"crypto/tls"
	"math/big"
	"os"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

// install copies PEM files over dst, as a certificate rotation would.
func install(t *testing.T, dst string, srcs ...string) {
	t.Helper()
	var all []byte
	for _, s := range srcs {
		all = append(all, []byte(readFile(t, s))...)
	}
	if err := os.WriteFile(dst, all, 0o600); err != nil {
		t.Fatal(err)
	}
}

// servedSerial is the serial of the certificate a TLS server presents.
func servedSerial(t *testing.T, addr string) *big.Int {
	t.Helper()
	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}, MinVersion: tls.VersionTLS13})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].SerialNumber
}

func TestCertificateRotation(t *testing.T) {
	ca, ca2 := authtest.NewCA(t), authtest.NewCA(t)
	dir := t.TempDir()
	certF, keyF, caF := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), filepath.Join(dir, "ca.crt")
	c1, k1 := ca.Issue(t, auth.RoleDecode)
	install(t, certF, c1)
	install(t, keyF, k1)
	install(t, caF, ca.CAFile)
	var f failures
	srv := newPlane(t, auth.Options{Role: auth.RoleDecode, CertFile: certF, KeyFile: keyF, CAFile: caF}, &f)
	s := serve(t, srv)
	first := servedSerial(t, s.addr)

	// A renewed certificate is served from the next handshake on.
	c2, k2 := ca.Issue(t, auth.RoleDecode)
	install(t, certF, c2)
	install(t, keyF, k2)
	auth.ReloadNow(srv)
	second := servedSerial(t, s.addr)
	if second.Cmp(first) == 0 {
		t.Fatal("the renewed certificate is not served")
	}

	// A half-written rotation (new certificate, old key) and a certificate
	// for another role are not taken; the last good one stays.
	c3, _ := ca.Issue(t, auth.RoleDecode)
	install(t, certF, c3)
	auth.ReloadNow(srv)
	if got := servedSerial(t, s.addr); got.Cmp(second) != 0 {
		t.Fatal("a certificate without its key was taken")
	}
	c4, k4 := ca.Issue(t, auth.RolePrefill)
	install(t, certF, c4)
	install(t, keyF, k4)
	auth.ReloadNow(srv)
	if got := servedSerial(t, s.addr); got.Cmp(second) != 0 {
		t.Fatal("a certificate for another role was taken")
	}

	// A CA rotation: members of the new CA are let in once the bundle has it.
	bundle := filepath.Join(t.TempDir(), "bundle.crt")
	install(t, bundle, ca.CAFile, ca2.CAFile)
	cc, ck := ca2.Issue(t, auth.RoleRouter)
	cli := newPlane(t, auth.Options{Role: auth.RoleRouter, CertFile: cc, KeyFile: ck, CAFile: bundle}, nil)
	c := dial(t, s.addr, cli, auth.RoleDecode)
	if err := check(t, c, ctx(t), "kv"); err == nil {
		t.Fatal("a member of a CA not yet trusted got in")
	}
	f.want(t, "tls", "untrusted certificate")
	install(t, certF, c2)
	install(t, keyF, k2)
	install(t, caF, ca.CAFile, ca2.CAFile)
	auth.ReloadNow(srv)
	if err := check(t, dial(t, s.addr, cli, auth.RoleDecode), ctx(t), "kv"); err != nil {
		t.Fatalf("after the CA bundle was installed: %v", err)
	}
}
