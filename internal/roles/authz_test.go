package roles

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
)

// Every RPC of the control plane names the roles that may call it: one
// missing from callers would be refused to everyone, or, worse, an
// oversight in a policy that allowed it.
func TestEveryRPCHasCallers(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{pdv1.Decode_ServiceDesc, pdv1.Prefill_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			if len(callers["/"+sd.ServiceName+"/"+n]) == 0 {
				t.Errorf("%s/%s has no callers", sd.ServiceName, n)
			}
		}
	}
	if got := callers["/baton.pd.v1.Prefill/Tokenizer"]; len(got) != 1 || got[0] != "router" {
		t.Errorf("Prefill/Tokenizer callers %v: only the router learns the tokenizer", got)
	}
}

// wantCallers is who may call each RPC, written out again rather than read
// from callers, so that a role added to the policy by mistake fails here.
var wantCallers = map[string][]auth.Role{
	"/baton.pd.v1.Decode/Info":       {auth.RoleRouter},
	"/baton.pd.v1.Decode/Reserve":    {auth.RoleRouter},
	"/baton.pd.v1.Decode/Commit":     {auth.RolePrefill},
	"/baton.pd.v1.Decode/Drained":    {auth.RolePrefill},
	"/baton.pd.v1.Decode/Abort":      {auth.RoleRouter},
	"/baton.pd.v1.Decode/Finish":     {auth.RoleRouter},
	"/baton.pd.v1.Decode/Stream":     {auth.RoleRouter},
	"/baton.pd.v1.Decode/Generate":   {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Info":      {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Prefill":   {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Abort":     {auth.RoleDecode},
	"/baton.pd.v1.Prefill/Tokenizer": {auth.RoleRouter},
}

type authzPrefillStub struct {
	pdv1.UnimplementedPrefillServer
}
type authzDecodeStub struct{ pdv1.UnimplementedDecodeServer }

// serveAuthed serves the control plane's services (stubs that answer
// Unimplemented: a call that gets that far passed the checks) behind the
// server options of role, as a worker does.
func serveAuthed(t *testing.T, p *auth.Plane) string {
	t.Helper()
	gs := grpc.NewServer(ServerOptions(p)...)
	pdv1.RegisterPrefillServer(gs, authzPrefillStub{})
	pdv1.RegisterDecodeServer(gs, authzDecodeStub{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

// callRPC makes the RPC method with an empty request and returns its error.
func callRPC(ctx context.Context, cc *grpc.ClientConn, method string) error {
	switch method {
	case "/baton.pd.v1.Decode/Stream":
		st, err := pdv1.NewDecodeClient(cc).Stream(ctx, &pdv1.StreamRequest{})
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	case "/baton.pd.v1.Decode/Generate":
		st, err := pdv1.NewDecodeClient(cc).Generate(ctx, &pdv1.GenerateRequest{})
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	var in, out proto.Message
	switch path.Base(method) {
	case "Info":
		in, out = &pdv1.InfoRequest{}, &pdv1.WorkerInfo{}
	case "Reserve":
		in, out = &pdv1.ReserveRequest{}, &pdv1.Reservation{}
	case "Commit":
		in, out = &pdv1.CommitRequest{}, &pdv1.Ack{}
	case "Drained":
		in, out = &pdv1.DrainedRequest{}, &pdv1.Ack{}
	case "Abort", "Finish":
		in, out = &pdv1.AbortRequest{}, &pdv1.Ack{}
	case "Prefill":
		in, out = &pdv1.PrefillRequest{}, &pdv1.PrefillReply{}
	case "Tokenizer":
		in, out = &pdv1.TokenizerRequest{}, &pdv1.TokenizerFiles{}
	default:
		panic("no request type for " + method)
	}
	return cc.Invoke(ctx, method, in, out)
}

func authedConn(t *testing.T, addr string, p *auth.Plane) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, p.DialOptions(auth.RoleDecode)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// TestCallersEnforced: a call signed by each role reaches each RPC only if
// wantCallers lets it, in particular a router's calls to prefill's Abort
// (which only decode sends) are refused. It fails if a role is added to,
// or left out of, callers.
func TestCallersEnforced(t *testing.T) {
	master := authtest.SecretFile(t)
	if len(wantCallers) != len(callers) {
		t.Fatalf("callers lists %d RPCs, this test %d", len(callers), len(wantCallers))
	}
	for _, worker := range []auth.Role{auth.RolePrefill, auth.RoleDecode} {
		addr := serveAuthed(t, authzPlane(t, authtest.SecretOptions(master, worker)))
		for _, caller := range auth.Roles {
			cc := authedConn(t, addr, authzPlane(t, authtest.SecretOptions(master, caller)))
			for method, roles := range wantCallers {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := callRPC(ctx, cc, method)
				cancel()
				allowed := slices.Contains(roles, caller)
				switch code := status.Code(err); {
				case allowed && code != codes.Unimplemented:
					t.Errorf("%s worker: %s calling %s: %v, want it let through", worker, caller, method, err)
				case !allowed && code != codes.PermissionDenied:
					t.Errorf("%s worker: %s calling %s: %v, want PermissionDenied", worker, caller, method, err)
				}
			}
		}
	}
}

func authzPlane(t *testing.T, o auth.Options) *auth.Plane {
	t.Helper()
	o.Log = slog.New(slog.DiscardHandler)
	p, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestPrefillKeyCannotActAsRouter: a member that holds only the prefill
// key can neither call decode's router-only RPCs as itself nor pass its
// calls off as the router's.
func TestPrefillKeyCannotActAsRouter(t *testing.T) {
	keys := authtest.RoleKeys(t, authtest.SecretFile(t))
	opts := func(r auth.Role) auth.Options {
		return auth.Options{Role: r, Name: string(r) + "-0", SecretFile: keys[r]}
	}
	addr := serveAuthed(t, authzPlane(t, opts(auth.RoleDecode)))
	if _, err := auth.New(auth.Options{Role: auth.RoleRouter, SecretFile: keys[auth.RolePrefill], Log: slog.New(slog.DiscardHandler)}); err == nil {
		t.Fatal("the prefill key made a router")
	}
	prefill := authzPlane(t, opts(auth.RolePrefill))
	cc := authedConn(t, addr, prefill)
	relabel := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		md.Set("baton-auth-role", "router")
		return invoker(metadata.NewOutgoingContext(ctx, md), method, req, reply, cc, opts...)
	})
	asRouter, err := grpc.NewClient(addr, append(prefill.DialOptions(auth.RoleDecode), relabel)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = asRouter.Close() })
	// The prefill key signing its own claim to be the router.
	liar := authedConn(t, addr, authzPlane(t, auth.Options{Role: auth.RoleRouter, Name: "router-0",
		SecretFile: authtest.ForgeRoleKey(t, keys[auth.RolePrefill], auth.RoleRouter)}))
	for _, m := range []string{"Reserve", "Abort", "Finish", "Info", "Stream"} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := callRPC(ctx, cc, "/baton.pd.v1.Decode/"+m); status.Code(err) != codes.PermissionDenied {
			t.Errorf("prefill key, as prefill, Decode/%s: %v", m, err)
		}
		if m != "Stream" {
			if err := callRPC(ctx, asRouter, "/baton.pd.v1.Decode/"+m); status.Code(err) != codes.Unauthenticated {
				t.Errorf("prefill key, relabelled router, Decode/%s: %v", m, err)
			}
		}
		if err := callRPC(ctx, liar, "/baton.pd.v1.Decode/"+m); status.Code(err) != codes.Unauthenticated {
			t.Errorf("prefill key, signing as router, Decode/%s: %v", m, err)
		}
		cancel()
	}
	// What prefill may call still passes.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := callRPC(ctx, cc, "/baton.pd.v1.Decode/Commit"); status.Code(err) != codes.Unimplemented {
		t.Errorf("prefill key, Commit: %v", err)
	}
}

// TestFreshNamesShareAQuota: a member that gives itself a new name for
// every Reserve is still one caller to the reservation bound.
func TestFreshNamesShareAQuota(t *testing.T) {
	want := loadRef(t)
	master := authtest.SecretFile(t)
	p := newPair(t, 4, 512, func(o *DecodeOptions) { o.MaxReservationsPerPeer = 2 })
	gs := grpc.NewServer(ServerOptions(authzPlane(t, authtest.SecretOptions(master, auth.RoleDecode)))...)
	pdv1.RegisterDecodeServer(gs, p.decode)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	var held []*pdv1.Reservation
	refused := 0
	for i := range 6 {
		o := authtest.SecretOptions(master, auth.RoleRouter)
		o.Name = fmt.Sprintf("fresh-%d", i)
		dc := pdv1.NewDecodeClient(authedConn(t, ln.Addr().String(), authzPlane(t, o)))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: o.Name, Prompt: want.PromptIDs[:4], Sampling: &pdv1.SamplingParams{MaxTokens: 4},
			Layout: p.layout, Writer: p.prefillAddr})
		cancel()
		switch {
		case err == nil:
			held = append(held, res)
		case status.Code(err) == codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("Reserve as %s: %v", o.Name, err)
		}
	}
	for _, r := range held {
		if _, err := p.dc.Abort(context.Background(), &pdv1.AbortRequest{Room: r.Room, Epoch: r.Epoch, Capability: r.Capability}); err != nil {
			t.Fatal(err)
		}
	}
	if len(held) != 2 || refused != 4 {
		t.Fatalf("six names held %d reservations (%d refused), want 2 held: the bound is per member, not per name", len(held), refused)
	}
	waitAllFree(t, p.dPool)
}

// TestPagesPerPeer: a caller's reservations hold at most MaxPagesPerPeer
// pages.
func TestPagesPerPeer(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512, func(o *DecodeOptions) { o.MaxPagesPerPeer = o.Pool.NumPages() / 2 })
	ctx := context.Background()
	var held []*pdv1.Reservation
	for range 16 {
		// MaxTokens 0: the whole context, 512 tokens, 128 pages.
		res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "q", Prompt: want.PromptIDs[:4], Layout: p.layout, Writer: p.prefillAddr})
		if status.Code(err) == codes.ResourceExhausted {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	for _, r := range held {
		if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: r.Room, Epoch: r.Epoch, Capability: r.Capability}); err != nil {
			t.Fatal(err)
		}
	}
	waitAllFree(t, p.dPool)
	if len(held)*128 > p.dPool.NumPages()/2 || len(held) == 0 {
		t.Fatalf("one caller held %d reservations of 128 pages, bound %d", len(held), p.dPool.NumPages()/2)
	}
}

// closedAfter dials addr and returns how long the server took to close it,
// answering pings as an HTTP/2 client would when h2 is set.
func closedAfter(t *testing.T, addr string, h2 bool, limit time.Duration) time.Duration {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetDeadline(start.Add(limit))
	if h2 {
		// The client preface and an empty SETTINGS frame: a connection
		// that has done everything HTTP/2 asks and will never call.
		if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
			t.Fatal(err)
		}
	}
	for {
		var h [9]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("still open after %v", limit)
			}
			return time.Since(start)
		}
		payload := make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
		if _, err := io.ReadFull(c, payload); err != nil {
			return time.Since(start)
		}
		if h2 && h[3] == 6 && h[4]&1 == 0 { // PING without ACK: answer it
			_, _ = c.Write(append([]byte{0, 0, 8, 6, 1, 0, 0, 0, 0}, payload...))
		}
	}
}

// TestIdleConnectionsClosed: the gRPC port closes a connection that never
// finishes its handshake, and one that finished it and calls nothing, and
// holds no more than MaxConns at once.
func TestIdleConnectionsClosed(t *testing.T) {
	l := PlaneLimits{Handshake: 300 * time.Millisecond, Idle: 500 * time.Millisecond, Ping: time.Hour, PingTimeout: time.Minute, MinPing: time.Minute, MaxConns: 3}
	gs := grpc.NewServer(ServerOptionsWith(authzPlane(t, authtest.SecretOptions(authtest.SecretFile(t), auth.RoleDecode)), l)...)
	pdv1.RegisterDecodeServer(gs, authzDecodeStub{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(LimitListener(ln, l.MaxConns)) }()
	t.Cleanup(gs.Stop)
	addr := ln.Addr().String()

	if d := closedAfter(t, addr, false, 5*time.Second); d < l.Handshake/2 {
		t.Errorf("a silent connection was closed after %v, before the handshake limit %v", d, l.Handshake)
	}
	if d := closedAfter(t, addr, true, 5*time.Second); d < l.Idle/2 {
		t.Errorf("an idle HTTP/2 connection was closed after %v, before the idle limit %v", d, l.Idle)
	}

	// Three held open; the fourth is closed at once; once one goes, a
	// new one is taken again.
	var open []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, c)
	}
	if d := closedAfter(t, addr, false, 5*time.Second); d > l.Handshake/2 {
		t.Errorf("a connection over the limit stayed %v", d)
	}
	for _, c := range open {
		_ = c.Close()
	}
	for _, c := range open {
		_ = c.Close()
	}
	time.Sleep(100 * time.Millisecond)
	if d := closedAfter(t, addr, false, 5*time.Second); d < l.Handshake/2 {
		t.Errorf("after the others closed, a connection was closed after %v", d)
	}
}
