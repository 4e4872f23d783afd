// Package auth decides who may talk on the internal plane: the gRPC control
// plane between router, prefill and decode workers, and the KV transfer
// sessions between prefill and decode. A member proves its role with a
// certificate from the cluster CA (mtls), or with its role's key (secret);
// on loopback it may prove nothing (none).
//
// # Role keys (secret mode)
//
// Whoever deploys the cluster holds one master secret. Each role's key is
// an Ed25519 key whose seed is HKDF-SHA256(master, salt "baton role key
// v1", info = the role). A member mounts a role key file (baton keys
// derive): its own role's private key and the three roles' public keys.
// Every gRPC call is signed with the caller's key over the method, the
// claimed role and name, a timestamp, a nonce, the kind of call and, for
// a unary call, the SHA-256 of the request; the callee verifies it with the
// public key of the role the caller claims. A transfer session is a signed
// X25519 exchange: each end signs both challenges, both names and both
// ephemeral keys, and the session ID is keyed by the shared secret, so no
// one who only watches the wire can compute it.
//
// Verifying needs public keys only, so a member can check every role's
// calls and sign as its own role alone: a prefill pod cannot sign as the
// router or as decode, towards anyone. Symmetric keys could not give this:
// whoever checks a router's MAC holds the router's key. Members of one role
// share one key; the claimed name is for logs, and per-peer quotas key on
// the role, the key that verified and the caller's address (Peer.ID), so a
// new name per call is the same peer.
//
// --cluster-secret-file also takes the master secret itself, for a single
// file on every member (development, one host): then every member holds
// every role's key and can act as any role, as before role keys existed.
// The plane works, but roles bind nobody who holds the file.
//
// Secret mode authenticates, it does not encrypt: KV pages and tokens cross
// the network in clear, and a stream's messages are not signed (its
// credentials leave before the first one).
package auth

import (
	"context"
	"crypto/rand"
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
	// SecretFile is a role key file (baton keys derive) or, in one-file
	// set-ups, the cluster master secret.
	SecretFile string

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

	// secret
	keys   *keyring
	replay *replayCache

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
		keys, err := loadSecretFile(o.SecretFile, p.role)
		if err != nil {
			return nil, err
		}
		p.keys = keys
		if keys.master {
			p.log.Warn("internal plane: "+FlagClusterSecret+" holds the cluster master secret, so this member holds every role's key "+
				"and anyone who reads the file can act as any role; mount a role key file instead (baton keys derive)", "role", p.role)
		}
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
	Role Role
	// Name is the certificate's name in mtls; in secret mode it is what
	// the caller says, covered by its signature but chosen by it.
	Name string
	// Key is the KeyID of the role key that verified a secret-mode call.
	Key           string
	Addr          string
	Authenticated bool
}

// ID keys per-peer quotas. For a proven member it is its role, the
// credential that proved it (the certificate's name, or the role key) and
// its host: never a name the caller merely claims, which costs nothing to
// change, and the host because the replicas of one Deployment share one
// credential and are each a peer. Unproven, it is the host alone.
func (p Peer) ID() string {
	host := p.Addr
	if h, _, err := net.SplitHostPort(p.Addr); err == nil {
		host = h
	}
	if !p.Authenticated {
		return host
	}
	cred := p.Name
	if p.Key != "" {
		cred = "key:" + p.Key
	}
	id := string(p.Role) + "/" + cred
	if host != "" {
		id += "@" + host
	}
	return id
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
