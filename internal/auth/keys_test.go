package auth_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

func keyOptions(file string, role auth.Role) auth.Options {
	return auth.Options{Role: role, Name: string(role) + "-test", SecretFile: file}
}

func TestRoleKeyFiles(t *testing.T) {
	master := authtest.SecretFile(t)
	keys := authtest.RoleKeys(t, master)
	again := authtest.RoleKeys(t, master)
	for _, r := range auth.Roles {
		a, b := readFile(t, keys[r]), readFile(t, again[r])
		if a != b {
			t.Errorf("%s: deriving twice gave two files", r)
		}
		if newPlane(t, keyOptions(keys[r], r), nil).Mode() != auth.ModeSecret {
			t.Errorf("%s: a role key file is not secret mode", r)
		}
	}
	otherKeys := authtest.RoleKeys(t, authtest.SecretFile(t))
	if readFile(t, keys[auth.RolePrefill]) == readFile(t, otherKeys[auth.RolePrefill]) {
		t.Error("two masters gave the same prefill key")
	}
	// Each file holds one private key: its own role's.
	for _, r := range auth.Roles {
		if n := strings.Count(readFile(t, keys[r]), "\nprivate "); n != 1 {
			t.Errorf("%s key file holds %d private keys", r, n)
		}
	}

	for _, tc := range []struct {
		name, content, want string
		role                auth.Role
	}{
		{"another role's key", readFile(t, keys[auth.RolePrefill]), "holds the prefill key but this process is router", auth.RoleRouter},
		{"another role's key", readFile(t, keys[auth.RolePrefill]), "holds the prefill key but this process is decode", auth.RoleDecode},
		{"no private key", strings.Join(dropLines(readFile(t, keys[auth.RolePrefill]), "private "), "\n"), "incomplete", auth.RolePrefill},
		{"a public key missing", strings.Join(dropLines(readFile(t, keys[auth.RolePrefill]), "public router "), "\n"), "no router public key", auth.RolePrefill},
		{"private and public disagree", swapPublic(t, readFile(t, keys[auth.RolePrefill]), "prefill", readFile(t, otherKeys[auth.RolePrefill])), "does not match", auth.RolePrefill},
		{"garbage line", readFile(t, keys[auth.RolePrefill]) + "admin yes\n", "not a line of a role key file", auth.RolePrefill},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := keyOptions(authtest.WriteSecret(t, tc.content), tc.role)
			o.Log = slog.New(slog.DiscardHandler)
			if _, err := auth.New(o); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
	if _, err := auth.ReadMaster(keys[auth.RoleRouter], "--master"); err == nil || !strings.Contains(err.Error(), "role key file") {
		t.Errorf("a role key file taken for the master: %v", err)
	}
}

func dropLines(s, prefix string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if !strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// swapPublic replaces role's public key line in s with the one in other.
func swapPublic(t *testing.T, s, role, other string) string {
	t.Helper()
	var line string
	for _, l := range strings.Split(other, "\n") {
		if strings.HasPrefix(l, "public "+role+" ") {
			line = l
		}
	}
	out := dropLines(s, "public "+role+" ")
	return strings.Join(append(out, line), "\n") + "\n"
}

// claimingRole returns a client that signs as p but names role in its
// metadata: a holder of p's key trying to pass for role.
func claimingRole(p *auth.Plane, role auth.Role) []grpc.DialOption {
	rewrite := func(ctx context.Context) context.Context {
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		md.Set("baton-auth-role", string(role))
		return metadata.NewOutgoingContext(ctx, md)
	}
	// Appended after the plane's, so it runs after signing.
	return append(p.DialOptions(auth.RoleDecode),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(rewrite(ctx), method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(rewrite(ctx), desc, cc, method, opts...)
		}))
}

// TestRoleKeysBindTheRole: a member holding only the prefill key is
// prefill to everyone. It cannot get a plane for another role, and a call
// it signs and relabels as the router's fails the signature.
func TestRoleKeysBindTheRole(t *testing.T) {
	master := authtest.SecretFile(t)
	keys := authtest.RoleKeys(t, master)
	var f failures
	decode := newPlane(t, keyOptions(keys[auth.RoleDecode], auth.RoleDecode), &f)
	s := serve(t, decode, auth.RoleRouter)

	router := newPlane(t, keyOptions(keys[auth.RoleRouter], auth.RoleRouter), nil)
	passes(t, s, dial(t, s.addr, router, auth.RoleDecode), auth.Peer{Role: auth.RoleRouter, Name: "router-test", Authenticated: true})
	f.none(t)

	for _, r := range []auth.Role{auth.RoleRouter, auth.RoleDecode} {
		if _, err := auth.New(keyOptions(keys[auth.RolePrefill], r)); err == nil {
			t.Errorf("the prefill key made a %s plane", r)
		}
	}
	prefill := newPlane(t, keyOptions(keys[auth.RolePrefill], auth.RolePrefill), nil)
	// As itself: authenticated, and refused by role.
	c := dial(t, s.addr, prefill, auth.RoleDecode)
	wantCode(t, check(t, c, ctx(t), "kv"), codes.PermissionDenied)
	f.want(t, "Check", "role")
	// As the router: the router's public key does not verify its signature.
	for _, r := range []auth.Role{auth.RoleRouter, auth.RoleDecode} {
		c := dialWith(t, s.addr, claimingRole(prefill, r)...)
		wantCode(t, check(t, c, ctx(t), "kv"), codes.Unauthenticated)
		wantCode(t, watch(t, c, ctx(t)), codes.Unauthenticated)
	}
	// Signing its claim to be the router with its own key, from a key
	// file it rewrote to say so: the router's real public key refuses it.
	for _, r := range []auth.Role{auth.RoleRouter, auth.RoleDecode} {
		liar := newPlane(t, keyOptions(authtest.ForgeRoleKey(t, keys[auth.RolePrefill], r), r), nil)
		c := dial(t, s.addr, liar, auth.RoleDecode)
		wantCode(t, check(t, c, ctx(t), "kv"), codes.Unauthenticated)
		wantCode(t, watch(t, c, ctx(t)), codes.Unauthenticated)
	}
	f.want(t, "Check", "bad signature")
	f.want(t, "Watch", "bad signature")
	if n := s.count(); n != 2 { // the router's two calls in passes
		t.Errorf("%d calls reached the handler, want 2", n)
	}

	// A master-secret member and role-key members of the same master agree.
	mc := newPlane(t, authtest.SecretOptions(master, auth.RoleRouter), nil)
	if err := check(t, dial(t, s.addr, mc, auth.RoleDecode), ctx(t), "kv"); err != nil {
		t.Errorf("a master-secret router to a role-key decode: %v", err)
	}
}

// TestQuotaIdentityIgnoresClaimedNames: the ID quotas key on is the same
// for every name a role-key holder gives itself, and differs by role.
func TestQuotaIdentityIgnoresClaimedNames(t *testing.T) {
	for _, mode := range []string{"role keys", "master"} {
		t.Run(mode, func(t *testing.T) {
			master := authtest.SecretFile(t)
			keys := authtest.RoleKeys(t, master)
			file := func(r auth.Role) string {
				if mode == "master" {
					return master
				}
				return keys[r]
			}
			s := serve(t, newPlane(t, keyOptions(file(auth.RoleDecode), auth.RoleDecode), nil))
			ids := map[string]bool{}
			for i := range 5 {
				o := keyOptions(file(auth.RoleRouter), auth.RoleRouter)
				o.Name = "fresh-" + strings.Repeat("x", i)
				if err := check(t, dial(t, s.addr, newPlane(t, o, nil), auth.RoleDecode), ctx(t), "kv"); err != nil {
					t.Fatal(err)
				}
				ids[s.last(t).ID()] = true
			}
			if len(ids) != 1 {
				t.Fatalf("five names, %d quota identities: %v", len(ids), ids)
			}
			if err := check(t, dial(t, s.addr, newPlane(t, keyOptions(file(auth.RolePrefill), auth.RolePrefill), nil), auth.RoleDecode), ctx(t), "kv"); err != nil {
				t.Fatal(err)
			}
			if ids[s.last(t).ID()] {
				t.Fatalf("prefill and router share the identity %q", s.last(t).ID())
			}
		})
	}
}

// decodeStub answers Abort and Finish, the two RPCs that take the same
// request.
type decodeStub struct {
	pdv1.UnimplementedDecodeServer
	calls chan string
}

func (d *decodeStub) Abort(context.Context, *pdv1.AbortRequest) (*pdv1.Ack, error) {
	d.calls <- "Abort"
	return &pdv1.Ack{}, nil
}

func (d *decodeStub) Finish(context.Context, *pdv1.AbortRequest) (*pdv1.Ack, error) {
	d.calls <- "Finish"
	return &pdv1.Ack{}, nil
}

func serveDecodeStub(t *testing.T, p *auth.Plane) (string, *decodeStub) {
	t.Helper()
	gs := grpc.NewServer(p.ServerOptions()...)
	stub := &decodeStub{calls: make(chan string, 16)}
	pdv1.RegisterDecodeServer(gs, stub)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), stub
}

// TestSignatureCoversMethodAndBody: secret mode is plaintext, so whoever is
// on the path sees every signed call; what the signature covers is all that
// stops them from reusing it. These fail if the signed message leaves out
// the method or the body hash.
func TestSignatureCoversMethodAndBody(t *testing.T) {
	keys := authtest.RoleKeys(t, authtest.SecretFile(t))
	var f failures
	addr, stub := serveDecodeStub(t, newPlane(t, keyOptions(keys[auth.RoleDecode], auth.RoleDecode), &f))
	router := newPlane(t, keyOptions(keys[auth.RoleRouter], auth.RoleRouter), nil)
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plain.Close() })
	// signed captures the credentials router would send for call, without sending it.
	signed := func(call func(pdv1.DecodeClient) error) metadata.MD {
		var md metadata.MD
		cc, err := grpc.NewClient(addr, capture(router, &md)...)
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if err := call(pdv1.NewDecodeClient(cc)); err != nil {
			t.Fatal(err)
		}
		return md
	}
	req := &pdv1.AbortRequest{Room: 7, Epoch: 1, Capability: bytes.Repeat([]byte{1}, 32)}
	noCall := func(t *testing.T) {
		t.Helper()
		select {
		case c := <-stub.calls:
			t.Fatalf("%s reached the handler", c)
		default:
		}
	}

	t.Run("a Finish signature replayed as Abort", func(t *testing.T) {
		md := signed(func(c pdv1.DecodeClient) error { _, err := c.Finish(ctx(t), req); return err })
		_, err := pdv1.NewDecodeClient(plain).Abort(metadata.NewOutgoingContext(ctx(t), md), req)
		wantCode(t, err, codes.Unauthenticated)
		f.want(t, "Abort", "bad signature")
		noCall(t)
	})
	t.Run("a body rewritten in transit with its hash", func(t *testing.T) {
		md := signed(func(c pdv1.DecodeClient) error { _, err := c.Abort(ctx(t), req); return err })
		// The attacker's own request, and the hash the server will compute of it.
		other := &pdv1.AbortRequest{Room: 8, Epoch: 1, Capability: req.Capability}
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(other)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		md = md.Copy()
		md.Set("baton-auth-body", base64.RawURLEncoding.EncodeToString(sum[:]))
		_, err = pdv1.NewDecodeClient(plain).Abort(metadata.NewOutgoingContext(ctx(t), md), other)
		wantCode(t, err, codes.Unauthenticated)
		f.want(t, "Abort", "bad signature")
		noCall(t)
	})
	t.Run("the signed call itself passes", func(t *testing.T) {
		md := signed(func(c pdv1.DecodeClient) error { _, err := c.Abort(ctx(t), req); return err })
		if _, err := pdv1.NewDecodeClient(plain).Abort(metadata.NewOutgoingContext(ctx(t), md), req); err != nil {
			t.Fatal(err)
		}
		if got := <-stub.calls; got != "Abort" {
			t.Fatalf("handler got %s", got)
		}
	})
}

// TestHeadersWithoutBodyRefused: a unary handler runs once its request has
// arrived; a stranger's stream that sends headers and never a request is
// refused at once, so it cannot keep its connection busy.
func TestHeadersWithoutBodyRefused(t *testing.T) {
	var f failures
	s := serve(t, newPlane(t, authtest.SecretOptions(authtest.SecretFile(t), auth.RoleDecode), &f))
	cc, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	st, err := cc.NewStream(c, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, healthpb.Health_Check_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = st.RecvMsg(new(healthpb.HealthCheckResponse))
	wantCode(t, err, codes.Unauthenticated)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("refused after %v: the server waited for the body", d)
	}
	f.want(t, "Check", "missing credentials")
}

// TestSessionRoleKeys: transfer sessions between members that each hold
// their own role's key, and a prefill key holder playing decode's part.
func TestSessionRoleKeys(t *testing.T) {
	keys := authtest.RoleKeys(t, authtest.SecretFile(t))
	prefill := newPlane(t, keyOptions(keys[auth.RolePrefill], auth.RolePrefill), nil)
	var f failures
	decode := newPlane(t, keyOptions(keys[auth.RoleDecode], auth.RoleDecode), &f)

	c, s := tcpPair(t)
	o, a := handshake(prefill, decode, c, s, auth.RoleDecode, auth.RolePrefill)
	if o.err != nil || a.err != nil {
		t.Fatalf("opener %v, acceptor %v", o.err, a.err)
	}
	if o.s.ID != a.s.ID || a.s.Peer.Key == "" || a.s.Peer.Role != auth.RolePrefill {
		t.Fatalf("IDs %x / %x, acceptor sees %+v", o.s.ID, a.s.ID, a.s.Peer)
	}

	// A prefill pod answering as itself, where decode was dialled...
	c, s = pipePair(t)
	o, _ = handshake(prefill, newPlane(t, keyOptions(keys[auth.RolePrefill], auth.RolePrefill), nil), c, s, auth.RoleDecode)
	if o.err == nil || !strings.Contains(o.err.Error(), "acceptor is prefill, want decode") {
		t.Errorf("opener: %v", o.err)
	}
	// ...or claiming to be decode, signing with the key it has.
	t.Run("prefill key answers as decode", func(t *testing.T) {
		noLeaks(t)
		c, s := tcpPair(t)
		done := make(chan error, 1)
		go func() {
			_, _, err := prefill.OpenSession(c, time.Now().Add(2*time.Second), auth.RoleDecode)
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
		// open: role, name, B, signature, eph
		name := string(payload[1+len("prefill")+1 : 1+len("prefill")+1+int(payload[1+len("prefill")])])
		b := payload[len(payload)-33-65-32 : len(payload)-33-65]
		openerEph := payload[len(payload)-32:]
		eph := ephemeral(t)
		attacker := newPlane(t, keyOptions(keys[auth.RolePrefill], auth.RolePrefill), nil)
		sig := auth.AcceptorProof(attacker, a, b, auth.RolePrefill, name, openerEph, auth.RoleDecode, "decode-0", eph)
		_, _ = s.Write(auth.Frame(auth.TypeAccept, auth.Fields([]byte("decode"), []byte("decode-0"), sig, eph)))
		if err := <-done; err == nil || !strings.Contains(err.Error(), "bad acceptor proof") {
			t.Fatalf("opener took a prefill key's word for decode: %v", err)
		}
	})
	// The router may not open a session at all, as itself...
	router := newPlane(t, keyOptions(keys[auth.RoleRouter], auth.RoleRouter), nil)
	refusedBoth(t, router, decode, &f, "role", auth.RoleDecode, auth.RolePrefill)
	// ...nor as prefill, signing that claim with its own key.
	liar := newPlane(t, keyOptions(authtest.ForgeRoleKey(t, keys[auth.RoleRouter], auth.RolePrefill), auth.RolePrefill), nil)
	refusedBoth(t, liar, decode, &f, "bad proof", auth.RoleDecode, auth.RolePrefill)
}

// RoleKeyID names the key a role key file carries for that role, the one
// its member signs with and its peers log.
func TestRoleKeyID(t *testing.T) {
	master := []byte("0123456789abcdef0123456789abcdef-master")
	ids := map[string]auth.Role{}
	for _, r := range auth.Roles {
		b, err := auth.RoleKeyFile(master, r)
		if err != nil {
			t.Fatal(err)
		}
		var want string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "public" && f[1] == string(r) {
				pub, err := base64.StdEncoding.DecodeString(f[2])
				if err != nil {
					t.Fatal(err)
				}
				want = auth.KeyID(pub)
			}
		}
		if id := auth.RoleKeyID(master, r); id != want || id == "" {
			t.Errorf("%s: RoleKeyID %q, the file's key is %q", r, id, want)
		}
		if other, dup := ids[want]; dup {
			t.Errorf("%s and %s have one key ID %s", r, other, want)
		}
		ids[want] = r
	}
}
