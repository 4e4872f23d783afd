package auth_test

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

// failures records OnFailure calls.
type failures struct {
	mu  sync.Mutex
	got []string // "rpc:reason"
}

func (f *failures) on(rpc, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, rpc+":"+reason)
}

func (f *failures) list() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.got...)
}

// want fails unless an OnFailure call with rpc and reason arrived, waiting a
// little for one made by a server goroutine.
func (f *failures) want(t *testing.T, rpc, reason string) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); ; {
		for _, g := range f.list() {
			if g == rpc+":"+reason {
				return
			}
		}
		if time.Now().After(end) {
			t.Fatalf("OnFailure(%q, %q) not called; got %q", rpc, reason, f.list())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (f *failures) none(t *testing.T) {
	t.Helper()
	if g := f.list(); len(g) > 0 {
		t.Fatalf("unexpected refusals: %q", g)
	}
}

func newPlane(t testing.TB, o auth.Options, f *failures) *auth.Plane {
	t.Helper()
	if f != nil {
		o.OnFailure = f.on
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	p, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func TestNewRefuses(t *testing.T) {
	ca := authtest.NewCA(t)
	stranger := authtest.NewCA(t)
	cert, key := ca.Issue(t, auth.RolePrefill)
	_, key2 := ca.Issue(t, auth.RolePrefill)
	decodeCert, decodeKey := ca.Issue(t, auth.RoleDecode)
	expCert, expKey := ca.IssueExpired(t, auth.RolePrefill)
	noRoleCert, noRoleKey := ca.IssueWithoutRole(t)
	strCert, strKey := stranger.Issue(t, auth.RolePrefill)
	twoCert, twoKey := ca.IssueSpec(t, authtest.Spec{Role: auth.RolePrefill, URIs: []string{auth.RoleSAN(auth.RoleDecode)}})
	secret := authtest.SecretFile(t)
	short := authtest.WriteSecret(t, strings.Repeat("x", 31)+"\n \n")
	emptyCA := authtest.WriteSecret(t, "not a pem")

	for _, tc := range []struct {
		name string
		o    auth.Options
		want string
	}{
		{"unknown role", auth.Options{Role: "scheduler"}, "unknown role"},
		{"bad name", auth.Options{Role: auth.RolePrefill, Name: "a b"}, "member name"},
		{"both modes", auth.Options{Role: auth.RolePrefill, CertFile: cert, KeyFile: key, CAFile: ca.CAFile, SecretFile: secret}, "choose one"},
		{"cert only", auth.Options{Role: auth.RolePrefill, CertFile: cert}, "--internal-tls-key, --internal-tls-ca missing"},
		{"no key", auth.Options{Role: auth.RolePrefill, CertFile: cert, CAFile: ca.CAFile}, "--internal-tls-key missing"},
		{"no ca", auth.Options{Role: auth.RolePrefill, CertFile: cert, KeyFile: key}, "--internal-tls-ca missing"},
		{"no cert", auth.Options{Role: auth.RolePrefill, KeyFile: key, CAFile: ca.CAFile}, "--internal-tls-cert missing"},
		{"key mismatch", auth.Options{Role: auth.RolePrefill, CertFile: cert, KeyFile: key2, CAFile: ca.CAFile}, "private key does not match"},
		{"other role", auth.Options{Role: auth.RolePrefill, CertFile: decodeCert, KeyFile: decodeKey, CAFile: ca.CAFile}, "is for role decode"},
		{"no role SAN", auth.Options{Role: auth.RolePrefill, CertFile: noRoleCert, KeyFile: noRoleKey, CAFile: ca.CAFile}, "no baton://role/<role> URI SAN"},
		{"two roles", auth.Options{Role: auth.RolePrefill, CertFile: twoCert, KeyFile: twoKey, CAFile: ca.CAFile}, "more than one role"},
		{"stranger CA", auth.Options{Role: auth.RolePrefill, CertFile: strCert, KeyFile: strKey, CAFile: ca.CAFile}, "does not verify"},
		{"expired", auth.Options{Role: auth.RolePrefill, CertFile: expCert, KeyFile: expKey, CAFile: ca.CAFile}, "expired"},
		{"CA file without PEM", auth.Options{Role: auth.RolePrefill, CertFile: cert, KeyFile: key, CAFile: emptyCA}, "no PEM certificate"},
		{"missing CA file", auth.Options{Role: auth.RolePrefill, CertFile: cert, KeyFile: key, CAFile: filepath.Join(t.TempDir(), "nope")}, "--internal-tls-ca"},
		{"short secret", auth.Options{Role: auth.RolePrefill, SecretFile: short}, "31 bytes, want at least 32"},
		{"missing secret", auth.Options{Role: auth.RolePrefill, SecretFile: filepath.Join(t.TempDir(), "nope")}, "--cluster-secret-file"},
		{"secret is a directory", auth.Options{Role: auth.RolePrefill, SecretFile: t.TempDir()}, "--cluster-secret-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := auth.New(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestNewModes(t *testing.T) {
	ca := authtest.NewCA(t)
	p := newPlane(t, ca.Options(t, auth.RoleDecode), nil)
	if p.Mode() != auth.ModeMTLS || p.Describe() != "mtls" || p.Name() != "decode-test" {
		t.Errorf("mtls plane: mode %s, %q, name %q", p.Mode(), p.Describe(), p.Name())
	}
	p = newPlane(t, authtest.SecretOptions(authtest.SecretFile(t), auth.RoleRouter), nil)
	if p.Mode() != auth.ModeSecret || p.Describe() != "secret" {
		t.Errorf("secret plane: mode %s, %q", p.Mode(), p.Describe())
	}
	p = newPlane(t, auth.Options{Role: auth.RoleRouter}, nil)
	if p.Mode() != auth.ModeNone || p.Describe() != "none (loopback only)" || p.Name() == "" {
		t.Errorf("none plane: mode %s, %q, name %q", p.Mode(), p.Describe(), p.Name())
	}
	p = newPlane(t, auth.Options{Role: auth.RoleRouter, Insecure: true}, nil)
	if !strings.Contains(p.Describe(), "--insecure-internal") {
		t.Errorf("insecure plane: %q", p.Describe())
	}
}

func TestCheckBind(t *testing.T) {
	none := newPlane(t, auth.Options{Role: auth.RoleDecode}, nil)
	var logs bytes.Buffer
	insecure, err := auth.New(auth.Options{Role: auth.RoleDecode, Insecure: true, Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	secret := newPlane(t, authtest.SecretOptions(authtest.SecretFile(t), auth.RoleDecode), nil)
	for _, tc := range []struct {
		hosts []string
		ok    bool
	}{
		{[]string{"127.0.0.1"}, true},
		{[]string{"127.3.4.5", "::1", "localhost", "LOCALHOST"}, true},
		{[]string{"[::1]"}, true},
		{[]string{"127.0.0.1:9000"}, true},
		{nil, true},
		{[]string{""}, false},
		{[]string{"0.0.0.0"}, false},
		{[]string{"::"}, false},
		{[]string{"127.0.0.1", "10.0.0.7"}, false},
		{[]string{"decode-0.decode"}, false},
		{[]string{"localhost.evil.example"}, false},
		{[]string{"128.0.0.1"}, false},
	} {
		err := none.CheckBind(tc.hosts...)
		if (err == nil) != tc.ok {
			t.Errorf("none: CheckBind(%q) = %v, want ok=%v", tc.hosts, err, tc.ok)
		}
		if err != nil {
			for _, flag := range []string{"--internal-tls-cert", "--cluster-secret-file", "--insecure-internal"} {
				if !strings.Contains(err.Error(), flag) {
					t.Errorf("CheckBind error %q does not mention %s", err, flag)
				}
			}
		}
		if err := insecure.CheckBind(tc.hosts...); err != nil {
			t.Errorf("insecure: CheckBind(%q) = %v", tc.hosts, err)
		}
		if err := secret.CheckBind(tc.hosts...); err != nil {
			t.Errorf("secret: CheckBind(%q) = %v", tc.hosts, err)
		}
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "UNAUTHENTICATED") {
		t.Errorf("--insecure-internal on a public host logged no loud warning: %q", logs.String())
	}
}

func TestPeerID(t *testing.T) {
	for _, tc := range []struct {
		p    auth.Peer
		want string
	}{
		{auth.Peer{Role: auth.RolePrefill, Name: "p-0", Addr: "10.0.0.1:5000", Authenticated: true}, "prefill/p-0@10.0.0.1"},
		// A role key: the name is the caller's to choose, so it is not in the ID.
		{auth.Peer{Role: auth.RoleRouter, Name: "r-0", Key: "0123abcd", Addr: "10.0.0.2:5000", Authenticated: true}, "router/key:0123abcd@10.0.0.2"},
		{auth.Peer{Role: auth.RoleRouter, Name: "fresh-1", Key: "0123abcd", Addr: "10.0.0.2:6000", Authenticated: true}, "router/key:0123abcd@10.0.0.2"},
		{auth.Peer{Role: auth.RolePrefill, Name: "p-0", Addr: "10.0.0.1:5000"}, "10.0.0.1"},
		{auth.Peer{Addr: "[fd00::1]:5000"}, "fd00::1"},
		{auth.Peer{Addr: "pipe"}, "pipe"},
	} {
		if got := tc.p.ID(); got != tc.want {
			t.Errorf("%+v.ID() = %q, want %q", tc.p, got, tc.want)
		}
	}
}
