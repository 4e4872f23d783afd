// Package auth decides who may talk on the internal plane: the gRPC control
// plane between router, prefill and decode workers, and the KV transfer
// sessions between prefill and decode. A member proves its role with a
// certificate from the cluster CA (mtls), or with a key derived from a
// shared cluster secret (secret); on loopback it may prove nothing (none).
package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Role is what a member does in the cluster; it decides which RPCs and
// sessions it may start.
type Role string

const (
	RoleRouter  Role = "router"
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

func (r Role) valid() bool {
	return r == RoleRouter || r == RolePrefill || r == RoleDecode
}

// Mode is how members prove who they are.
type Mode string

const (
	ModeNone   Mode = "none"
	ModeMTLS   Mode = "mtls"
	ModeSecret Mode = "secret"
)

// The command-line flags the errors point at; the commands use the same names.
const (
	FlagTLSCert        = "--internal-tls-cert"
	FlagTLSKey         = "--internal-tls-key"
	FlagTLSCA          = "--internal-tls-ca"
	FlagClusterSecret  = "--cluster-secret-file"
	FlagInsecure       = "--insecure-internal"
	minSecretLen       = 32
	maxSecretFileBytes = 64 << 10
	maxNameLen         = 128
	// window bounds both clock skew and how long a signed call stays
	// replayable, so the replay cache only needs to remember that long.
	window              = 30 * time.Second
	defaultReplayNonces = 1 << 20
)

// Options configures a Plane. Exactly one of the TLS files (all three) or
// SecretFile may be set; neither means ModeNone.
type Options struct {
	Role Role   // this process's role
	Name string // this member's name for logs and quotas (default: os.Hostname()); in mtls the certificate names us instead

	CertFile, KeyFile, CAFile string
	SecretFile                string

	Insecure bool // --insecure-internal: allow ModeNone on non-loopback listeners

	// OnFailure is called on every refused call or session, with the RPC's
	// short name ("tls" for a refused gRPC handshake, "transfer" for a
	// refused transfer session) and a short reason that reveals no secret.
	OnFailure func(rpc, reason string)
	Log       *slog.Logger
	Now       func() time.Time // tests

	// ReplayNonces bounds the secret-mode replay cache (default 1<<20,
	// about 80 MiB at worst); when full, calls are refused, not forgotten.
	ReplayNonces int
}

// Plane holds this member's credentials and checks those of its peers.
type Plane struct {
	mode      Mode
	role      Role
	name      string
	insecure  bool
	onFailure func(rpc, reason string)
	log       *slog.Logger
	now       func() time.Time
	rand      io.Reader

	// mtls
	tlsFiles [3]string // cert, key, CA
	creds    atomic.Pointer[tlsCreds]
	checked  atomic.Int64 // when the files were last looked at, unix ns

	// secret: one key per use, so a MAC made for one can never pass for the other.
	kGRPC, kXfer []byte
	replay       *replayCache

	lastWarn atomic.Int64
}

// New checks the options and loads the credentials; it refuses to start on
// anything that would leave the plane weaker than the operator asked for.
func New(o Options) (*Plane, error) {
	if !o.Role.valid() {
		return nil, fmt.Errorf("auth: unknown role %q", o.Role)
	}
	p := &Plane{role: o.Role, name: o.Name, insecure: o.Insecure, onFailure: o.OnFailure, log: o.Log, now: o.Now, rand: rand.Reader}
	if p.onFailure == nil {
		p.onFailure = func(string, string) {}
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	if p.now == nil {
		p.now = time.Now
	}
	if p.name == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("auth: no member name given and no hostname: %w", err)
		}
		p.name = h
	}
	if !validName(p.name) {
		return nil, fmt.Errorf("auth: member name %q: want 1-%d characters of [A-Za-z0-9._:-]", p.name, maxNameLen)
	}

	anyTLS := o.CertFile != "" || o.KeyFile != "" || o.CAFile != ""
	switch {
	case anyTLS && o.SecretFile != "":
		return nil, fmt.Errorf("auth: both internal TLS (%s, %s, %s) and %s are set; choose one", FlagTLSCert, FlagTLSKey, FlagTLSCA, FlagClusterSecret)
	case anyTLS:
		var missing []string
		for _, f := range []struct{ v, flag string }{{o.CertFile, FlagTLSCert}, {o.KeyFile, FlagTLSKey}, {o.CAFile, FlagTLSCA}} {
			if f.v == "" {
				missing = append(missing, f.flag)
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("auth: internal TLS is half configured: %s missing (mutual TLS needs %s, %s and %s)",
				strings.Join(missing, ", "), FlagTLSCert, FlagTLSKey, FlagTLSCA)
		}
		if err := p.loadTLS(o.CertFile, o.KeyFile, o.CAFile); err != nil {
			return nil, err
		}
		p.mode = ModeMTLS
	case o.SecretFile != "":
		secret, err := readSecret(o.SecretFile)
		if err != nil {
			return nil, err
		}
		p.kGRPC = derive(secret, "baton grpc v1")
		p.kXfer = derive(secret, "baton transfer v1")
		n := o.ReplayNonces
		if n <= 0 {
			n = defaultReplayNonces
		}
		p.replay = newReplayCache(n)
		p.mode = ModeSecret
	default:
		p.mode = ModeNone
	}
	if o.Insecure && p.mode != ModeNone {
		p.log.Info("internal plane: "+FlagInsecure+" has no effect when credentials are configured", "mode", p.mode)
	}
	return p, nil
}

func readSecret(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", FlagClusterSecret, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("auth: %s: %w", FlagClusterSecret, err)
	}
	if len(b) > maxSecretFileBytes {
		return nil, fmt.Errorf("auth: %s %s: larger than %d bytes; is it the right file?", FlagClusterSecret, path, maxSecretFileBytes)
	}
	// Editors and `echo` leave a newline; it must not make two members disagree.
	b = []byte(strings.TrimRight(string(b), " \t\r\n"))
	if len(b) < minSecretLen {
		return nil, fmt.Errorf("auth: %s %s: the secret is %d bytes, want at least %d (e.g. `head -c 32 /dev/urandom | base64`)",
			FlagClusterSecret, path, len(b), minSecretLen)
	}
	return b, nil
}

func derive(secret []byte, label string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// validName keeps peer-supplied names safe to put in logs, metric labels
// and gRPC metadata.
func validName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == ':') {
			return false
		}
	}
	return true
}

// Mode says how members prove who they are.
func (p *Plane) Mode() Mode { return p.mode }

// Role is this member's role.
func (p *Plane) Role() Role { return p.role }

// Name is this member's name as its peers see it.
func (p *Plane) Name() string { return p.name }

// Describe says in a few words how the plane is protected, for the startup log.
func (p *Plane) Describe() string {
	switch {
	case p.mode != ModeNone:
		return string(p.mode)
	case p.insecure:
		return "none (" + FlagInsecure + ": anyone who reaches the ports is trusted)"
	default:
		return "none (loopback only)"
	}
}

// CheckBind refuses to listen beyond loopback without credentials: anyone
// who reaches an open control or transfer port can read, write or abort
// other users' requests.
func (p *Plane) CheckBind(hosts ...string) error {
	if p.mode != ModeNone {
		return nil
	}
	var open []string
	for _, h := range hosts {
		if !isLoopback(h) {
			open = append(open, fmt.Sprintf("%q", h))
		}
	}
	if len(open) == 0 {
		return nil
	}
	if p.insecure {
		p.log.Warn("INTERNAL PLANE IS UNAUTHENTICATED: "+FlagInsecure+" is set and the control/transfer ports listen beyond loopback; "+
			"anyone who reaches them can read, write or abort any request's KV", "hosts", strings.Join(open, ","))
		return nil
	}
	return fmt.Errorf("auth: refusing to listen on %s without internal authentication: set %s, %s and %s, or %s, "+
		"or accept the risk with %s", strings.Join(open, ", "), FlagTLSCert, FlagTLSKey, FlagTLSCA, FlagClusterSecret, FlagInsecure)
}

func isLoopback(h string) bool {
	if host, _, err := net.SplitHostPort(h); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// Peer is the other end of a call or session.
type Peer struct {
	Role          Role
	Name          string
	Addr          string
	Authenticated bool
}

// ID keys per-peer quotas: a proven identity when there is one, else the
// address, since a claimed name costs nothing to change.
func (p Peer) ID() string {
	if p.Authenticated {
		return string(p.Role) + "/" + p.Name
	}
	if h, _, err := net.SplitHostPort(p.Addr); err == nil {
		return h
	}
	return p.Addr
}

type peerKey struct{}

func withPeer(ctx context.Context, p Peer) context.Context {
	return context.WithValue(ctx, peerKey{}, p)
}

// Caller is the peer of the call being handled. Outside the server
// interceptors (or in ModeNone) it is unauthenticated, named by address.
func Caller(ctx context.Context) Peer {
	if p, ok := ctx.Value(peerKey{}).(Peer); ok {
		return p
	}
	var out Peer
	if gp, ok := peer.FromContext(ctx); ok && gp.Addr != nil {
		out.Addr = gp.Addr.String()
	}
	return out
}

// Allow lets the call on only if the caller proved one of roles. In ModeNone
// nobody proved anything and CheckBind kept strangers away, so all may pass.
func (p *Plane) Allow(ctx context.Context, rpc string, roles ...Role) error {
	if p.mode == ModeNone {
		return nil
	}
	c := Caller(ctx)
	if c.Authenticated {
		for _, r := range roles {
			if c.Role == r {
				return nil
			}
		}
	}
	p.fail(rpc, "role", "peer", c.ID())
	return status.Errorf(codes.PermissionDenied, "%s: role %q may not call this", rpc, c.Role)
}

// fail reports a refusal. The log is rate limited: a scanner must not be able
// to flood it; the counter behind OnFailure keeps the full count.
func (p *Plane) fail(rpc, reason string, attrs ...any) {
	p.onFailure(rpc, reason)
	now := p.now().UnixNano()
	last := p.lastWarn.Load()
	if now-last < int64(time.Second) || !p.lastWarn.CompareAndSwap(last, now) {
		return
	}
	p.log.Warn("internal plane: refused", append([]any{"rpc", rpc, "reason", reason}, attrs...)...)
}
