package auth

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"
)

// RoleSAN is the URI SAN that names a certificate's role, e.g.
// baton://role/prefill. Pods are dialled by IP, so identity lives here and
// not in a host name.
func RoleSAN(r Role) string { return "baton://role/" + string(r) }

// alpnTransfer keeps a transfer session's TLS from ever being accepted by the
// gRPC port (which insists on h2) and the other way round.
const alpnTransfer = "baton-transfer/1"

// tlsCreds is one consistent load of the three files.
type tlsCreds struct {
	cert  tls.Certificate
	pool  *x509.CertPool
	stamp string // what the files looked like when read
}

// reloadEvery is how often a handshake looks at the files: certificates are
// rotated in place (cert-manager, mounted secrets) without a restart.
const reloadEvery = 30 * time.Second

func (p *Plane) loadTLS(certFile, keyFile, caFile string) error {
	p.tlsFiles = [3]string{certFile, keyFile, caFile}
	c, err := p.readTLS()
	if err != nil {
		return err
	}
	// Peers can only learn our name from the certificate, so it is our name.
	p.name = certName(c.cert.Leaf)
	p.creds.Store(c)
	p.checked.Store(time.Now().UnixNano())
	return nil
}

// readTLS reads and checks the files. Our own certificate must pass the very
// checks our peers will apply, or every call would fail later with a less
// helpful message.
func (p *Plane) readTLS() (*tlsCreds, error) {
	certFile, keyFile, caFile := p.tlsFiles[0], p.tlsFiles[1], p.tlsFiles[2]
	stamp := p.tlsStamp()
	// LoadX509KeyPair refuses a key that does not match the certificate.
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("auth: %s %s / %s %s: %w", FlagTLSCert, certFile, FlagTLSKey, keyFile, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("auth: %s %s: %w", FlagTLSCert, certFile, err)
		}
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", FlagTLSCA, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("auth: %s %s: no PEM certificate in it", FlagTLSCA, caFile)
	}
	role, err := roleOf(cert.Leaf)
	if err != nil {
		return nil, fmt.Errorf("auth: %s %s: %w; this process is %s and needs %s", FlagTLSCert, certFile, err, p.role, RoleSAN(p.role))
	}
	if role != p.role {
		return nil, fmt.Errorf("auth: %s %s is for role %s (%s) but this process is %s", FlagTLSCert, certFile, role, RoleSAN(role), p.role)
	}
	usages := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if p.role != RoleRouter { // the router only dials; workers also serve
		usages = append(usages, x509.ExtKeyUsageServerAuth)
	}
	for _, u := range usages {
		if err := p.verifyChain(pool, cert.Leaf, cert.Certificate[1:], u); err != nil {
			return nil, fmt.Errorf("auth: %s %s does not verify against %s %s: %w", FlagTLSCert, certFile, FlagTLSCA, caFile, err)
		}
	}
	if left := cert.Leaf.NotAfter.Sub(p.now()); left < 72*time.Hour {
		p.log.Warn("internal plane: our certificate expires soon", "not_after", cert.Leaf.NotAfter, "left", left.Round(time.Minute))
	}
	return &tlsCreds{cert: cert, pool: pool, stamp: stamp}, nil
}

// tlsStamp fingerprints the files' contents: modification times are too
// coarse for quick successive writes, and mounted secrets change by symlink.
func (p *Plane) tlsStamp() string {
	h := sha256.New()
	for _, f := range p.tlsFiles {
		b, _ := os.ReadFile(f)
		writeLP(h, b)
	}
	return string(h.Sum(nil))
}

// current returns the credentials to use now, reloading them when the files have
// changed. A reload that fails its checks (say the certificate is written
// but not yet its key) keeps the old credentials and is tried again later.
func (p *Plane) current() *tlsCreds {
	c := p.creds.Load()
	now := time.Now().UnixNano()
	last := p.checked.Load()
	if now-last < int64(reloadEvery) || !p.checked.CompareAndSwap(last, now) {
		return c
	}
	if p.tlsStamp() == c.stamp {
		return c
	}
	nc, err := p.readTLS()
	if err == nil && certName(nc.cert.Leaf) != p.name {
		err = fmt.Errorf("auth: the new certificate names %q, not %q; restart to change a member's name", certName(nc.cert.Leaf), p.name)
	}
	if err != nil {
		p.log.Error("internal plane: keeping the current certificate, the new files do not load", "err", err)
		return c
	}
	p.creds.Store(nc)
	p.log.Info("internal plane: reloaded certificate and CA", "not_after", nc.cert.Leaf.NotAfter)
	return nc
}

// roleOf reads the one role a certificate is for. Several roles would make
// Allow's answer depend on which one we happened to read, so they are refused.
func roleOf(c *x509.Certificate) (Role, error) {
	var found Role
	for _, u := range c.URIs {
		if u.Scheme != "baton" {
			continue
		}
		var r Role
		for _, k := range []Role{RoleRouter, RolePrefill, RoleDecode} {
			if u.String() == RoleSAN(k) {
				r = k
			}
		}
		if r == "" {
			return "", fmt.Errorf("certificate has an unknown baton URI SAN %q", u.String())
		}
		if found != "" && found != r {
			return "", errors.New("certificate names more than one role")
		}
		found = r
	}
	if found == "" {
		return "", errors.New("certificate has no baton://role/<role> URI SAN")
	}
	return found, nil
}

// certName is the member name a certificate proves, for logs and quotas.
func certName(c *x509.Certificate) string {
	if validName(c.Subject.CommonName) {
		return c.Subject.CommonName
	}
	for _, d := range c.DNSNames {
		if validName(d) {
			return d
		}
	}
	if len(c.IPAddresses) > 0 {
		return c.IPAddresses[0].String()
	}
	return fmt.Sprintf("serial-%x", c.SerialNumber)
}

func (p *Plane) verifyChain(pool *x509.CertPool, leaf *x509.Certificate, rest [][]byte, usage x509.ExtKeyUsage) error {
	inter := x509.NewCertPool()
	for _, raw := range rest {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return err
		}
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: p.now(), KeyUsages: []x509.ExtKeyUsage{usage}})
	return err
}

// verifyError is a refusal already reported to OnFailure.
type verifyError struct{ reason string }

func (e *verifyError) Error() string { return "internal plane: peer certificate refused: " + e.reason }

// verifyPeer checks the chain against the cluster CA, not any host name: pods
// are dialled by IP and the role SAN is the identity. expect "" takes any role.
func (p *Plane) verifyPeer(label string, cs tls.ConnectionState, usage x509.ExtKeyUsage, expect Role) error {
	reason := ""
	switch {
	case cs.Version < tls.VersionTLS13:
		reason = "tls version"
	case len(cs.PeerCertificates) == 0:
		reason = "no certificate"
	case len(cs.PeerCertificates) > 4:
		reason = "chain too long"
	default:
		leaf := cs.PeerCertificates[0]
		rest := make([][]byte, 0, len(cs.PeerCertificates)-1)
		for _, c := range cs.PeerCertificates[1:] {
			rest = append(rest, c.Raw)
		}
		if err := p.verifyChain(p.current().pool, leaf, rest, usage); err != nil {
			var ci x509.CertificateInvalidError
			if errors.As(err, &ci) && ci.Reason == x509.Expired {
				reason = "certificate expired"
			} else {
				reason = "untrusted certificate"
			}
		} else if r, err := roleOf(leaf); err != nil {
			reason = "no role"
		} else if expect != "" && r != expect {
			reason = "role"
		}
	}
	if reason == "" {
		return nil
	}
	p.fail(label, reason)
	return &verifyError{reason}
}

func (p *Plane) serverTLS(label string, alpn ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return &p.current().cert, nil
		},
		// Requested, not required, so that a missing certificate reaches
		// verifyPeer and is counted like any other refusal.
		ClientAuth: tls.RequestClientCert,
		// Every connection runs the full checks; a resumed one would skip
		// the expiry check of the peer's certificate.
		SessionTicketsDisabled: true,
		NextProtos:             alpn,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verifyPeer(label, cs, x509.ExtKeyUsageClientAuth, "")
		},
	}
}

func (p *Plane) clientTLS(label string, expect Role, alpn ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &p.current().cert, nil
		},
		// The standard verification would demand a host name; VerifyConnection
		// does the chain check against the cluster CA and the role instead.
		InsecureSkipVerify: true,
		NextProtos:         alpn,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return p.verifyPeer(label, cs, x509.ExtKeyUsageServerAuth, expect)
		},
	}
}

// tlsPeer is the identity a verified TLS connection proves.
func tlsPeer(cs tls.ConnectionState, addr string) (Peer, bool) {
	if len(cs.PeerCertificates) == 0 {
		return Peer{Addr: addr}, false
	}
	leaf := cs.PeerCertificates[0]
	r, err := roleOf(leaf)
	if err != nil {
		return Peer{Addr: addr}, false
	}
	return Peer{Role: r, Name: certName(leaf), Addr: addr, Authenticated: true}, true
}
