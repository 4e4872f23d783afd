// Package authtest makes credentials for tests of the internal plane: a
// cluster CA and certificates for each role (good, expired, without the role
// SAN, from a stranger CA), cluster master secrets and the role key files
// derived from them, all written as files in t.TempDir() the way the
// workers read them.
package authtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/auth"
)

var serial atomic.Int64

// CA is a cluster CA. Two CAs from NewCA do not trust each other, so a second
// one is the stranger.
type CA struct {
	CAFile string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	dir    string
}

// NewCA makes a CA and writes its certificate to CAFile.
func NewCA(t testing.TB) *CA {
	t.Helper()
	key := newKey(t)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial.Add(1)),
		Subject:               pkix.Name{CommonName: "baton test cluster CA"},
		NotBefore:             now.Add(-100 * 24 * time.Hour),
		NotAfter:              now.Add(100 * 24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := &CA{CAFile: filepath.Join(dir, "ca.pem"), cert: cert, key: key, dir: dir}
	writePEM(t, ca.CAFile, "CERTIFICATE", der)
	return ca
}

// Spec describes a certificate to issue; the zero value of each field means
// the usual: valid from an hour ago for a day, for client and server use.
type Spec struct {
	Role        auth.Role // "" leaves out the role SAN
	Name        string    // common name; default "<role>-test"
	NotBefore   time.Time
	NotAfter    time.Time
	ExtKeyUsage []x509.ExtKeyUsage
	URIs        []string // extra URI SANs
}

// Issue writes a good certificate and key for role.
func (ca *CA) Issue(t testing.TB, role auth.Role) (certFile, keyFile string) {
	t.Helper()
	return ca.IssueSpec(t, Spec{Role: role})
}

// IssueExpired writes a certificate for role that expired a day ago.
func (ca *CA) IssueExpired(t testing.TB, role auth.Role) (certFile, keyFile string) {
	t.Helper()
	now := time.Now()
	return ca.IssueSpec(t, Spec{Role: role, NotBefore: now.Add(-72 * time.Hour), NotAfter: now.Add(-24 * time.Hour)})
}

// IssueWithoutRole writes a certificate the CA signed but that names no role.
func (ca *CA) IssueWithoutRole(t testing.TB) (certFile, keyFile string) {
	t.Helper()
	return ca.IssueSpec(t, Spec{Name: "no-role"})
}

// IssueSpec writes the certificate s describes.
func (ca *CA) IssueSpec(t testing.TB, s Spec) (certFile, keyFile string) {
	t.Helper()
	now := time.Now()
	if s.NotBefore.IsZero() {
		s.NotBefore = now.Add(-time.Hour)
	}
	if s.NotAfter.IsZero() {
		s.NotAfter = now.Add(24 * time.Hour)
	}
	if s.ExtKeyUsage == nil {
		s.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth}
	}
	if s.Name == "" {
		s.Name = string(s.Role) + "-test"
	}
	var uris []*url.URL
	if s.Role != "" {
		s.URIs = append([]string{auth.RoleSAN(s.Role)}, s.URIs...)
	}
	for _, u := range s.URIs {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, pu)
	}
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: s.Name},
		NotBefore:    s.NotBefore,
		NotAfter:     s.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  s.ExtKeyUsage,
		URIs:         uris,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	n := serial.Add(1)
	certFile = filepath.Join(ca.dir, s.Name+"-"+big.NewInt(n).String()+".crt")
	keyFile = filepath.Join(ca.dir, s.Name+"-"+big.NewInt(n).String()+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, keyFile, "PRIVATE KEY", kder)
	return certFile, keyFile
}

// Options are mtls options for a member of role with a fresh certificate.
func (ca *CA) Options(t testing.TB, role auth.Role) auth.Options {
	t.Helper()
	cert, key := ca.Issue(t, role)
	return auth.Options{Role: role, Name: string(role) + "-test", CertFile: cert, KeyFile: key, CAFile: ca.CAFile}
}

// RawTLS is a TLS client config presenting certFile that trusts any server,
// for playing a peer that auth.New would refuse to build.
func RawTLS(t testing.TB, certFile, keyFile string) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}
}

// SecretFile writes a fresh random cluster secret, newline-terminated as
// `echo` would leave it.
func SecretFile(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return WriteSecret(t, base64.StdEncoding.EncodeToString(b)+"\n")
}

// WriteSecret writes content as a secret file, for the refusals of bad ones.
func WriteSecret(t testing.TB, content string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// SecretOptions are secret-mode options for a member of role.
func SecretOptions(file string, role auth.Role) auth.Options {
	return auth.Options{Role: role, Name: string(role) + "-test", SecretFile: file}
}

// RoleKeys writes the role key file of every role derived from the master
// secret in masterFile, as `baton keys derive` would: the files a cluster's
// members mount when each holds only its own role's key.
func RoleKeys(t testing.TB, masterFile string) map[auth.Role]string {
	t.Helper()
	master, err := auth.ReadMaster(masterFile, "master")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := map[auth.Role]string{}
	for _, r := range auth.Roles {
		b, err := auth.RoleKeyFile(master, r)
		if err != nil {
			t.Fatal(err)
		}
		out[r] = filepath.Join(dir, string(r)+".key")
		if err := os.WriteFile(out[r], b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// ForgeRoleKey rewrites the role key file keyFile, as its holder could, to
// claim role as: the same private key, with the public key of role as
// replaced by the holder's own. A member built from it signs its claims to
// be as honestly as it can; only its peers' copy of as's public key can
// tell.
func ForgeRoleKey(t testing.TB, keyFile string, as auth.Role) string {
	t.Helper()
	b, err := os.ReadFile(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	var own auth.Role
	lines := strings.Split(string(b), "\n")
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "role" {
			own = auth.Role(f[1])
		}
	}
	var ownPub string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "public" && f[1] == string(own) {
			ownPub = f[2]
		}
	}
	for i, l := range lines {
		switch f := strings.Fields(l); {
		case len(f) == 2 && f[0] == "role":
			lines[i] = "role " + string(as)
		case len(f) == 3 && f[0] == "public" && f[1] == string(as):
			lines[i] = "public " + string(as) + " " + ownPub
		}
	}
	out := filepath.Join(t.TempDir(), "forged-"+string(as)+".key")
	if err := os.WriteFile(out, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
