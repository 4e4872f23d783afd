package auth

import (
	"bytes"
	"container/heap"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
	"google.golang.org/protobuf/proto"
)

// Secret-mode call credentials. Every value is ASCII so the metadata needs no
// -bin keys.
const (
	mdRole  = "baton-auth-role"
	mdName  = "baton-auth-name"
	mdTS    = "baton-auth-ts" // unix milliseconds
	mdNonce = "baton-auth-nonce"
	mdBody  = "baton-auth-body" // unary only: SHA-256 of the deterministic marshal of the request
	mdSig   = "baton-auth-sig"  // Ed25519 signature by the caller's role key over callMessage
)

const (
	kindUnary  = 1
	kindStream = 2
)

var b64 = base64.RawURLEncoding

// ServerOptions authenticate every call before any handler sees it and leave
// the caller in the context for Caller and Allow. Add them before other
// interceptors so those see the caller too. They install the server's tap
// handle in secret mode, so no other option may.
func (p *Plane) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{grpc.ChainUnaryInterceptor(p.unaryServer), grpc.ChainStreamInterceptor(p.streamServer)}
	switch p.mode {
	case ModeMTLS:
		opts = append(opts, grpc.Creds(countingCreds{credentials.NewTLS(p.serverTLS("tls")), p}))
	case ModeSecret:
		opts = append(opts, grpc.InTapHandle(p.tap))
	}
	return opts
}

// tap refuses a secret-mode call whose headers carry no valid signature
// before a stream exists. A unary handler runs only once the request has
// arrived, so without it a stranger could send headers and never the body,
// and hold an open stream, which keeps its connection from ever being idle.
// The body and the nonce are checked later, by the interceptors.
func (p *Plane) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	kind := byte(kindStream)
	if len(info.Header.Get(mdBody)) > 0 {
		kind = kindUnary
	}
	c, _, reason := p.verifyHeaders(info.Header, Caller(ctx), info.FullMethodName, kind)
	if reason != "" {
		p.fail(shortName(info.FullMethodName), reason, "peer", c.ID())
		return ctx, status.Error(codes.Unauthenticated, "internal plane: "+reason)
	}
	return ctx, nil
}

// DialOptions make a client that proves this member's role. In mtls it also
// refuses a server whose certificate is not for role expect; in secret mode
// the server does not prove itself (the secret authenticates callers only),
// so expect is not checked there.
func (p *Plane) DialOptions(expect Role) []grpc.DialOption {
	switch p.mode {
	case ModeMTLS:
		return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS("tls", expect)))}
	case ModeSecret:
		return []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithChainUnaryInterceptor(p.unaryClient),
			grpc.WithChainStreamInterceptor(p.streamClient),
		}
	default:
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
}

// countingCreds reports handshakes that fail before verifyPeer could judge
// them, such as a plaintext client. A connection closed without a word (a TCP
// probe) is not a refusal and is not counted.
type countingCreds struct {
	credentials.TransportCredentials
	p *Plane
}

func (c countingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, ai, err := c.TransportCredentials.ServerHandshake(conn)
	var ve *verifyError
	if err != nil && !errors.As(err, &ve) && !errors.Is(err, io.EOF) {
		c.p.fail("tls", "handshake", "addr", conn.RemoteAddr().String(), "err", err)
	}
	return nc, ai, err
}

func (c countingCreds) Clone() credentials.TransportCredentials {
	return countingCreds{c.TransportCredentials.Clone(), c.p}
}

func (p *Plane) unaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	body, err := bodyHash(req)
	if err != nil {
		return status.Errorf(codes.Internal, "internal plane: cannot sign %s: %v", method, err)
	}
	ctx, err = p.sign(ctx, method, kindUnary, body)
	if err != nil {
		return err
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func (p *Plane) streamClient(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	// The metadata leaves before the first message is known, so a stream's
	// credentials cover who calls which method, not what it sends.
	ctx, err := p.sign(ctx, method, kindStream, nil)
	if err != nil {
		return nil, err
	}
	return streamer(ctx, desc, cc, method, opts...)
}

func (p *Plane) sign(ctx context.Context, method string, kind byte, body []byte) (context.Context, error) {
	var nonce [16]byte
	if _, err := p.rand.Read(nonce[:]); err != nil {
		return nil, status.Errorf(codes.Internal, "internal plane: no randomness: %v", err)
	}
	ts := p.now().UnixMilli()
	sig := ed25519.Sign(p.keys.sign, callMessage(method, p.role, p.name, ts, nonce[:], kind, body))
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	// Set, not append: a forwarded context must not carry two sets of credentials.
	md.Set(mdRole, string(p.role))
	md.Set(mdName, p.name)
	md.Set(mdTS, strconv.FormatInt(ts, 10))
	md.Set(mdNonce, b64.EncodeToString(nonce[:]))
	md.Set(mdSig, b64.EncodeToString(sig))
	if kind == kindUnary {
		md.Set(mdBody, b64.EncodeToString(body))
	} else {
		md.Delete(mdBody)
	}
	return metadata.NewOutgoingContext(ctx, md), nil
}

// callMessage is what a call's signature covers. The method keeps a
// signature made for one RPC from passing for another that takes the same
// request (Finish and Abort); the body hash keeps an on-path attacker, who
// sees the plaintext, from rewriting the request and its claimed hash.
func callMessage(method string, role Role, name string, ts int64, nonce []byte, kind byte, body []byte) []byte {
	var m bytes.Buffer
	m.WriteString("baton grpc call v2\x00")
	writeLP(&m, []byte(method))
	writeLP(&m, []byte(role))
	writeLP(&m, []byte(name))
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(ts))
	m.Write(b[:])
	writeLP(&m, nonce)
	m.WriteByte(kind)
	writeLP(&m, body)
	return m.Bytes()
}

// writeLP length-prefixes each field so no two field lists share an encoding.
func writeLP(w io.Writer, b []byte) {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(b)))
	_, _ = w.Write(n[:])
	_, _ = w.Write(b)
}

func bodyHash(req any) ([]byte, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "request %T is not a protobuf message", req)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(b)
	return sum[:], nil
}

func (p *Plane) unaryServer(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	c, err := p.authenticate(ctx, info.FullMethod, kindUnary, req)
	if err != nil {
		return nil, err
	}
	return handler(withPeer(ctx, c), req)
}

func (p *Plane) streamServer(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	c, err := p.authenticate(ss.Context(), info.FullMethod, kindStream, nil)
	if err != nil {
		return err
	}
	return handler(srv, &peerStream{ServerStream: ss, ctx: withPeer(ss.Context(), c)})
}

type peerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *peerStream) Context() context.Context { return s.ctx }

func (p *Plane) authenticate(ctx context.Context, method string, kind byte, req any) (Peer, error) {
	c := Caller(ctx)
	reason := ""
	switch p.mode {
	case ModeNone:
		return c, nil
	case ModeMTLS:
		// The handshake verified the chain; this reads who it proved.
		gp, _ := peer.FromContext(ctx)
		var ok bool
		if gp != nil {
			if ti, isTLS := gp.AuthInfo.(credentials.TLSInfo); isTLS {
				c, ok = tlsPeer(ti.State, c.Addr)
			}
		}
		if !ok {
			reason = "no certificate"
		}
	case ModeSecret:
		c, reason = p.checkCall(ctx, c, method, kind, req)
	}
	if reason != "" {
		p.fail(shortName(method), reason, "peer", c.ID())
		return c, status.Error(codes.Unauthenticated, "internal plane: "+reason)
	}
	return c, nil
}

// checkCall verifies secret-mode credentials; the reason it returns, if any,
// names what failed without revealing anything an attacker could use.
func (p *Plane) checkCall(ctx context.Context, c Peer, method string, kind byte, req any) (Peer, string) {
	md, _ := metadata.FromIncomingContext(ctx)
	c, cl, reason := p.verifyHeaders(md, c, method, kind)
	if reason != "" {
		return c, reason
	}
	if kind == kindUnary {
		// The signature covers the hash the caller claimed; this ties it to what arrived.
		got, err := bodyHash(req)
		if err != nil || !hmac.Equal(got, cl.body) {
			return c, "body mismatch"
		}
	}
	// Only after the signature: strangers must not be able to fill the cache.
	if r := p.replay.add([16]byte(cl.nonce), cl.ts+window.Milliseconds(), p.now().UnixMilli()); r != "" {
		return c, r
	}
	c.Role, c.Name, c.Key, c.Authenticated = cl.role, cl.name, p.keys.ids[cl.role], true
	return c, ""
}

// claims are what a call's metadata says and its signature proves.
type claims struct {
	role  Role
	name  string
	ts    int64
	nonce []byte
	body  []byte // unary: the request hash the caller signed
}

// verifyHeaders checks a call's signature and timestamp: everything but
// the body and the nonce, which the tap handle cannot see or must not spend.
func (p *Plane) verifyHeaders(md metadata.MD, c Peer, method string, kind byte) (Peer, claims, string) {
	one := func(k string) string {
		if v := md.Get(k); len(v) == 1 {
			return v[0]
		}
		return ""
	}
	var cl claims
	roleS, name, tsS, nonceS, sigS := one(mdRole), one(mdName), one(mdTS), one(mdNonce), one(mdSig)
	if roleS == "" || name == "" || tsS == "" || nonceS == "" || sigS == "" {
		return c, cl, "missing credentials"
	}
	role := Role(roleS)
	ts, err := strconv.ParseInt(tsS, 10, 64)
	nonce, err1 := b64.DecodeString(nonceS)
	sig, err2 := b64.DecodeString(sigS)
	if !role.valid() || !validName(name) || err != nil || err1 != nil || err2 != nil || len(nonce) != 16 || len(sig) != ed25519.SignatureSize {
		return c, cl, "malformed credentials"
	}
	var body []byte
	if kind == kindUnary {
		if body, err = b64.DecodeString(one(mdBody)); err != nil || len(body) != sha256.Size {
			return c, cl, "malformed credentials"
		}
	}
	// The claimed role picks the key: a call signed with any other role's
	// key, or claiming another role than the key's, fails here.
	if !ed25519.Verify(p.keys.public[role], callMessage(method, role, name, ts, nonce, kind, body), sig) {
		return c, cl, "bad signature"
	}
	if d := p.now().UnixMilli() - ts; d > window.Milliseconds() || d < -window.Milliseconds() {
		return c, cl, "stale timestamp"
	}
	return c, claims{role: role, name: name, ts: ts, nonce: nonce, body: body}, ""
}

// shortName turns "/baton.pd.v1.Decode/Reserve" into "Reserve" for the
// failure counter's label.
func shortName(fullMethod string) string {
	if i := strings.LastIndexByte(fullMethod, '/'); i >= 0 {
		return fullMethod[i+1:]
	}
	return fullMethod
}

// replayCache remembers each accepted nonce until its timestamp leaves the
// window, after which the timestamp check refuses the call anyway.
type replayCache struct {
	mu   sync.Mutex
	max  int
	seen map[[16]byte]struct{}
	exp  expiries
}

func newReplayCache(max int) *replayCache {
	return &replayCache{max: max, seen: map[[16]byte]struct{}{}}
}

// add records nonce, or says why the call must be refused. When full it
// refuses: forgetting a live nonce would let its call be replayed.
func (c *replayCache) add(nonce [16]byte, expires, now int64) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.exp) > 0 && c.exp[0].at < now {
		delete(c.seen, heap.Pop(&c.exp).(expiry).nonce)
	}
	if _, ok := c.seen[nonce]; ok {
		return "replayed nonce"
	}
	if len(c.seen) >= c.max {
		return "replay cache full"
	}
	c.seen[nonce] = struct{}{}
	heap.Push(&c.exp, expiry{at: expires, nonce: nonce})
	return ""
}

type expiry struct {
	at    int64
	nonce [16]byte
}

type expiries []expiry

func (h expiries) Len() int           { return len(h) }
func (h expiries) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiries) Push(x any)        { *h = append(*h, x.(expiry)) }
func (h *expiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
