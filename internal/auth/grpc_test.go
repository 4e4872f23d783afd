package auth_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

// server is a health service behind a plane; an interceptor after the
// plane's records who Caller says called, and enforces allow when set.
type server struct {
	addr  string
	mu    sync.Mutex
	calls []auth.Peer
}

func (s *server) last(t *testing.T) auth.Peer {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.calls) == 0 {
		t.Fatal("no call reached the handler")
	}
	return s.calls[len(s.calls)-1]
}

func (s *server) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

func serve(t *testing.T, p *auth.Plane, allow ...auth.Role) *server {
	t.Helper()
	return serveWith(t, p, nil, allow...)
}

// serveWith puts extra options between the plane's and the recorder.
func serveWith(t *testing.T, p *auth.Plane, extra []grpc.ServerOption, allow ...auth.Role) *server {
	t.Helper()
	s := &server{}
	record := func(ctx context.Context, rpc string) error {
		if len(allow) > 0 {
			if err := p.Allow(ctx, rpc, allow...); err != nil {
				return err
			}
		}
		s.mu.Lock()
		s.calls = append(s.calls, auth.Caller(ctx))
		s.mu.Unlock()
		return nil
	}
	opts := append(append(p.ServerOptions(), extra...),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := record(ctx, "Check"); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := record(ss.Context(), "Watch"); err != nil {
				return err
			}
			return h(srv, ss)
		}))
	gs := grpc.NewServer(opts...)
	hs := health.NewServer()
	hs.SetServingStatus("kv", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(gs, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	s.addr = lis.Addr().String()
	return s
}

func dialWith(t *testing.T, addr string, opts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return healthpb.NewHealthClient(cc)
}

func dial(t *testing.T, addr string, p *auth.Plane, expect auth.Role) healthpb.HealthClient {
	t.Helper()
	return dialWith(t, addr, p.DialOptions(expect)...)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

func check(t *testing.T, c healthpb.HealthClient, ctx context.Context, service string) error {
	t.Helper()
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return err
}

func watch(t *testing.T, c healthpb.HealthClient, ctx context.Context) error {
	t.Helper()
	st, err := c.Watch(ctx, &healthpb.HealthCheckRequest{Service: "kv"})
	if err != nil {
		return err
	}
	r, err := st.Recv()
	if err == nil && r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("watch: %v", r.Status)
	}
	return err
}

func wantCode(t *testing.T, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("got %v, want %v", err, code)
	}
}

// passes checks a good client: both kinds of call get through and the
// handler sees the caller's proven identity.
func passes(t *testing.T, s *server, c healthpb.HealthClient, want auth.Peer) {
	t.Helper()
	if err := check(t, c, ctx(t), "kv"); err != nil {
		t.Fatalf("unary: %v", err)
	}
	got := s.last(t)
	if got.Role != want.Role || got.Name != want.Name || got.Authenticated != want.Authenticated || !strings.HasPrefix(got.Addr, "127.0.0.1:") {
		t.Fatalf("Caller = %+v, want %+v from 127.0.0.1", got, want)
	}
	if err := watch(t, c, ctx(t)); err != nil {
		t.Fatalf("stream: %v", err)
	}
	if got := s.last(t); got.Role != want.Role || got.Authenticated != want.Authenticated {
		t.Fatalf("stream Caller = %+v, want %+v", got, want)
	}
}

func TestGRPCNone(t *testing.T) {
	var f failures
	srv := newPlane(t, auth.Options{Role: auth.RolePrefill}, &f)
	cli := newPlane(t, auth.Options{Role: auth.RoleRouter}, &f)
	s := serve(t, srv, auth.RoleDecode) // Allow lets all pass when nobody can prove anything
	passes(t, s, dial(t, s.addr, cli, auth.RolePrefill), auth.Peer{})
	if id := s.last(t).ID(); id != "127.0.0.1" {
		t.Errorf("unauthenticated ID = %q, want the address", id)
	}
	f.none(t)
}

func TestGRPCMTLS(t *testing.T) {
	ca := authtest.NewCA(t)
	var f failures
	srv := newPlane(t, ca.Options(t, auth.RolePrefill), &f)
	s := serve(t, srv)

	t.Run("good", func(t *testing.T) {
		cli := newPlane(t, ca.Options(t, auth.RoleRouter), &f)
		passes(t, s, dial(t, s.addr, cli, auth.RolePrefill), auth.Peer{Role: auth.RoleRouter, Name: "router-test", Authenticated: true})
		if id := s.last(t).ID(); id != "router/router-test@127.0.0.1" {
			t.Errorf("ID = %q", id)
		}
		f.none(t)
	})
	t.Run("the certificate names the caller, not its metadata", func(t *testing.T) {
		cli := newPlane(t, ca.Options(t, auth.RoleRouter), &f)
		claim := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			ctx = metadata.AppendToOutgoingContext(ctx, "baton-auth-role", "decode", "baton-auth-name", "someone-else")
			return invoker(ctx, method, req, reply, cc, opts...)
		})
		if err := check(t, dialWith(t, s.addr, append(cli.DialOptions(auth.RolePrefill), claim)...), ctx(t), "kv"); err != nil {
			t.Fatal(err)
		}
		if got := s.last(t); got.Role != auth.RoleRouter || got.Name != "router-test" || got.ID() != "router/router-test@127.0.0.1" {
			t.Errorf("a claim in metadata changed who called: %+v, ID %q", got, got.ID())
		}
	})

	refused := func(t *testing.T, c healthpb.HealthClient) {
		t.Helper()
		n := s.count()
		if err := check(t, c, ctx(t), "kv"); err == nil {
			t.Fatal("call got through")
		}
		if err := watch(t, c, ctx(t)); err == nil {
			t.Fatal("stream got through")
		}
		if s.count() != n {
			t.Fatal("a refused call reached the handler")
		}
	}
	t.Run("plaintext", func(t *testing.T) {
		f := failures{}
		srv := newPlane(t, ca.Options(t, auth.RolePrefill), &f)
		s := serve(t, srv)
		c := dialWith(t, s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err := check(t, c, ctx(t), "kv"); err == nil {
			t.Fatal("plaintext call got through")
		}
		f.want(t, "tls", "handshake")
	})
	t.Run("no certificate", func(t *testing.T) {
		refused(t, dialWith(t, s.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))))
		f.want(t, "tls", "no certificate")
	})
	t.Run("stranger CA", func(t *testing.T) {
		stranger := authtest.NewCA(t)
		var cf failures
		cli := newPlane(t, stranger.Options(t, auth.RoleRouter), &cf)
		refused(t, dial(t, s.addr, cli, auth.RolePrefill))
		// The client refuses the server first: its CA did not sign it.
		cf.want(t, "tls", "untrusted certificate")
		raw := stranger.Options(t, auth.RoleRouter)
		refused(t, dialWith(t, s.addr, grpc.WithTransportCredentials(credentials.NewTLS(authtest.RawTLS(t, raw.CertFile, raw.KeyFile)))))
		f.want(t, "tls", "untrusted certificate")
	})
	t.Run("expired", func(t *testing.T) {
		cert, key := ca.IssueExpired(t, auth.RoleRouter)
		refused(t, dialWith(t, s.addr, grpc.WithTransportCredentials(credentials.NewTLS(authtest.RawTLS(t, cert, key)))))
		f.want(t, "tls", "certificate expired")
	})
	t.Run("no role SAN", func(t *testing.T) {
		cert, key := ca.IssueWithoutRole(t)
		refused(t, dialWith(t, s.addr, grpc.WithTransportCredentials(credentials.NewTLS(authtest.RawTLS(t, cert, key)))))
		f.want(t, "tls", "no role")
	})
	t.Run("client-only certificate as server", func(t *testing.T) {
		var cf failures
		cert, key := ca.IssueSpec(t, authtest.Spec{Role: auth.RoleRouter, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
		o := auth.Options{Role: auth.RoleRouter, CertFile: cert, KeyFile: key, CAFile: ca.CAFile}
		bad := serve(t, newPlane(t, o, nil))
		cli := newPlane(t, ca.Options(t, auth.RoleRouter), &cf)
		if err := check(t, dial(t, bad.addr, cli, auth.RoleRouter), ctx(t), "kv"); err == nil {
			t.Fatal("a server without the server-auth usage was trusted")
		}
		cf.want(t, "tls", "untrusted certificate")
	})
	t.Run("wrong server role", func(t *testing.T) {
		var cf failures
		cli := newPlane(t, ca.Options(t, auth.RoleRouter), &cf)
		refused(t, dial(t, s.addr, cli, auth.RoleDecode))
		cf.want(t, "tls", "role")
	})
	t.Run("allow", func(t *testing.T) {
		var sf failures
		s := serve(t, newPlane(t, ca.Options(t, auth.RoleDecode), &sf), auth.RolePrefill)
		good := newPlane(t, ca.Options(t, auth.RolePrefill), nil)
		passes(t, s, dial(t, s.addr, good, auth.RoleDecode), auth.Peer{Role: auth.RolePrefill, Name: "prefill-test", Authenticated: true})
		bad := newPlane(t, ca.Options(t, auth.RoleRouter), nil)
		c := dial(t, s.addr, bad, auth.RoleDecode)
		wantCode(t, check(t, c, ctx(t), "kv"), codes.PermissionDenied)
		wantCode(t, watch(t, c, ctx(t)), codes.PermissionDenied)
		sf.want(t, "Check", "role")
		sf.want(t, "Watch", "role")
	})
}

// capture returns dial options that sign a call and keep its metadata
// instead of sending it, for replaying it by hand.
func capture(p *auth.Plane, md *metadata.MD) []grpc.DialOption {
	return append(p.DialOptions(auth.RolePrefill), grpc.WithChainUnaryInterceptor(
		func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			*md, _ = metadata.FromOutgoingContext(ctx)
			return nil
		}))
}

func TestGRPCSecret(t *testing.T) {
	secret := authtest.SecretFile(t)
	var f failures
	srv := newPlane(t, authtest.SecretOptions(secret, auth.RolePrefill), &f)
	s := serve(t, srv)
	plain := dialWith(t, s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))

	t.Run("good", func(t *testing.T) {
		cli := newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil)
		passes(t, s, dial(t, s.addr, cli, auth.RolePrefill), auth.Peer{Role: auth.RoleRouter, Name: "router-test", Authenticated: true})
		f.none(t)
	})
	t.Run("secret file without newline", func(t *testing.T) {
		raw := strings.TrimRight(readFile(t, secret), "\n")
		cli := newPlane(t, authtest.SecretOptions(authtest.WriteSecret(t, raw), auth.RoleRouter), nil)
		passes(t, s, dial(t, s.addr, cli, auth.RolePrefill), auth.Peer{Role: auth.RoleRouter, Name: "router-test", Authenticated: true})
	})
	t.Run("no credentials", func(t *testing.T) {
		wantCode(t, check(t, plain, ctx(t), "kv"), codes.Unauthenticated)
		f.want(t, "Check", "missing credentials")
		wantCode(t, watch(t, plain, ctx(t)), codes.Unauthenticated)
		f.want(t, "Watch", "missing credentials")
	})
	t.Run("wrong secret", func(t *testing.T) {
		cli := newPlane(t, authtest.SecretOptions(authtest.SecretFile(t), auth.RoleRouter), nil)
		c := dial(t, s.addr, cli, auth.RolePrefill)
		wantCode(t, check(t, c, ctx(t), "kv"), codes.Unauthenticated)
		f.want(t, "Check", "bad signature")
		wantCode(t, watch(t, c, ctx(t)), codes.Unauthenticated)
		f.want(t, "Watch", "bad signature")
	})
	t.Run("stale timestamp", func(t *testing.T) {
		for _, skew := range []time.Duration{-31 * time.Second, 31 * time.Second} {
			o := authtest.SecretOptions(secret, auth.RoleRouter)
			o.Now = func() time.Time { return time.Now().Add(skew) }
			c := dial(t, s.addr, newPlane(t, o, nil), auth.RolePrefill)
			wantCode(t, check(t, c, ctx(t), "kv"), codes.Unauthenticated)
			f.want(t, "Check", "stale timestamp")
		}
	})
	t.Run("replay and body swap", func(t *testing.T) {
		cli := newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil)
		var md metadata.MD
		if err := check(t, dialWith(t, s.addr, capture(cli, &md)...), ctx(t), "kv"); err != nil {
			t.Fatal(err)
		}
		signed := func() context.Context { return metadata.NewOutgoingContext(ctx(t), md.Copy()) }

		wantCode(t, check(t, plain, signed(), "other"), codes.Unauthenticated)
		f.want(t, "Check", "body mismatch")

		forged := md.Copy()
		forged.Set("baton-auth-role", "decode")
		wantCode(t, check(t, plain, metadata.NewOutgoingContext(ctx(t), forged), "kv"), codes.Unauthenticated)
		f.want(t, "Check", "bad signature")

		if err := check(t, plain, signed(), "kv"); err != nil {
			t.Fatalf("the signed call itself: %v", err)
		}
		wantCode(t, check(t, plain, signed(), "kv"), codes.Unauthenticated)
		f.want(t, "Check", "replayed nonce")
	})
	t.Run("unary credentials on a stream", func(t *testing.T) {
		cli := newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil)
		var md metadata.MD
		if err := check(t, dialWith(t, s.addr, capture(cli, &md)...), ctx(t), "kv"); err != nil {
			t.Fatal(err)
		}
		wantCode(t, watch(t, plain, metadata.NewOutgoingContext(ctx(t), md)), codes.Unauthenticated)
		f.want(t, "Watch", "bad signature")
	})
	t.Run("replay cache full", func(t *testing.T) {
		var sf failures
		o := authtest.SecretOptions(secret, auth.RolePrefill)
		o.ReplayNonces = 2
		s := serve(t, newPlane(t, o, &sf))
		c := dial(t, s.addr, newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil), auth.RolePrefill)
		for range 2 {
			if err := check(t, c, ctx(t), "kv"); err != nil {
				t.Fatal(err)
			}
		}
		wantCode(t, check(t, c, ctx(t), "kv"), codes.Unauthenticated)
		sf.want(t, "Check", "replay cache full")
	})
	t.Run("allow", func(t *testing.T) {
		var sf failures
		s := serve(t, newPlane(t, authtest.SecretOptions(secret, auth.RoleDecode), &sf), auth.RolePrefill)
		good := newPlane(t, authtest.SecretOptions(secret, auth.RolePrefill), nil)
		passes(t, s, dial(t, s.addr, good, auth.RoleDecode), auth.Peer{Role: auth.RolePrefill, Name: "prefill-test", Authenticated: true})
		c := dial(t, s.addr, newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil), auth.RoleDecode)
		wantCode(t, check(t, c, ctx(t), "kv"), codes.PermissionDenied)
		wantCode(t, watch(t, c, ctx(t)), codes.PermissionDenied)
		sf.want(t, "Check", "role")
		sf.want(t, "Watch", "role")
	})
}

// TestReplayWindowExpiry: a nonce is forgotten only once its timestamp is out
// of the window, so the replay is still refused, by the clock.
func TestReplayWindowExpiry(t *testing.T) {
	secret := authtest.SecretFile(t)
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	var f failures
	o := authtest.SecretOptions(secret, auth.RolePrefill)
	o.Now = clock
	s := serve(t, newPlane(t, o, &f))
	co := authtest.SecretOptions(secret, auth.RoleRouter)
	co.Now = clock
	var md metadata.MD
	if err := check(t, dialWith(t, s.addr, capture(newPlane(t, co, nil), &md)...), ctx(t), "kv"); err != nil {
		t.Fatal(err)
	}
	plain := dialWith(t, s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err := check(t, plain, metadata.NewOutgoingContext(ctx(t), md), "kv"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(29 * time.Second)
	mu.Unlock()
	wantCode(t, check(t, plain, metadata.NewOutgoingContext(ctx(t), md), "kv"), codes.Unauthenticated)
	f.want(t, "Check", "replayed nonce")
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	wantCode(t, check(t, plain, metadata.NewOutgoingContext(ctx(t), md), "kv"), codes.Unauthenticated)
	f.want(t, "Check", "stale timestamp")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestPolicy(t *testing.T) {
	policy := map[string][]auth.Role{"/grpc.health.v1.Health/Check": {auth.RoleRouter}}
	secret := authtest.SecretFile(t)
	var f failures
	srv := newPlane(t, authtest.SecretOptions(secret, auth.RolePrefill), &f)
	s := serveWith(t, srv, srv.Policy(policy))

	router := dial(t, s.addr, newPlane(t, authtest.SecretOptions(secret, auth.RoleRouter), nil), auth.RolePrefill)
	if err := check(t, router, ctx(t), "kv"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, watch(t, router, ctx(t)), codes.PermissionDenied)
	f.want(t, "Watch", "unlisted")

	decode := dial(t, s.addr, newPlane(t, authtest.SecretOptions(secret, auth.RoleDecode), nil), auth.RolePrefill)
	wantCode(t, check(t, decode, ctx(t), "kv"), codes.PermissionDenied)
	f.want(t, "Check", "role")
	if s.count() != 1 {
		t.Fatalf("%d calls reached the handler, want 1", s.count())
	}

	none := newPlane(t, auth.Options{Role: auth.RolePrefill}, nil)
	s = serveWith(t, none, none.Policy(policy))
	c := dial(t, s.addr, newPlane(t, auth.Options{Role: auth.RoleDecode}, nil), auth.RolePrefill)
	if err := check(t, c, ctx(t), "kv"); err != nil {
		t.Fatal(err)
	}
	if err := watch(t, c, ctx(t)); err != nil {
		t.Fatal(err)
	}
}
