package gates

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/test/harness"
)

// intruderHost is where attackers that hold a member's key dial from:
// another host than the real members (all on 127.0.0.1), as a stolen key
// used from another pod would be. Linux routes all of 127/8 to loopback.
const intruderHost = "127.0.0.2"

// fromHost makes a client's connections leave from ip.
func fromHost(ip string) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return d.DialContext(ctx, "tcp", addr)
	})
}

// identityPool is decode's pool in this gate: 512 pages of 4 tokens, four
// times the 512-token context, so that half the pool (the default
// --max-pages-per-peer) is more than one request and less than all.
const (
	identityPoolTokens = 2048
	identityPerPeer    = 4
)

// deriveKeys runs `baton keys derive` as an operator would and returns each
// role's key file.
func deriveKeys(t *testing.T, bin, master string) map[auth.Role]string {
	dir := t.TempDir()
	out, err := exec.Command(bin, "keys", "derive", "--master", master, "--role", "all", "--out", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("baton keys derive: %v\n%s", err, out)
	}
	keys := map[auth.Role]string{}
	for _, r := range auth.Roles {
		keys[r] = filepath.Join(dir, string(r)+".key")
	}
	return keys
}

// keyHolder is an attacker holding one role key file, dialling both
// workers from intruderHost under a name of its choosing; relabel, when
// set, rewrites the role its calls claim after they are signed.
func keyHolder(t *testing.T, file string, role auth.Role, name string, relabel auth.Role, d, p *harness.Server) *attacker {
	o := auth.Options{Role: role, Name: name, SecretFile: file}
	plane, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	opts := func(expect auth.Role) []grpc.DialOption {
		opts := append(plane.DialOptions(expect), fromHost(intruderHost))
		if relabel != "" {
			opts = append(opts, grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				md = md.Copy()
				md.Set("baton-auth-role", string(relabel))
				return invoker(metadata.NewOutgoingContext(ctx, md), method, req, reply, cc, opts...)
			}))
		}
		return opts
	}
	return dialWorkers(t, fmt.Sprintf("%s (%s key)", name, role), d, p, opts(auth.RoleDecode), opts(auth.RolePrefill), transfer.Plain{})
}

// authFailures reads a worker's baton_internal_auth_failures_total by rpc.
func authFailures(t *testing.T, s *harness.Server, role string) map[string]float64 {
	m := harness.Metrics(t, s)
	out := map[string]float64{}
	for _, rpc := range []string{"Reserve", "Info", "Abort", "Finish", "Stream", "Prefill", "Tokenizer"} {
		out[rpc] = m[fmt.Sprintf(`baton_internal_auth_failures_total{role=%q,rpc=%q}`, role, rpc)]
	}
	return out
}

// pagesHeld is how many of decode's pages are neither free nor cached.
func pagesHeld(t *testing.T, d *harness.Server) (held, total float64) {
	m := harness.Metrics(t, d)
	return m["baton_kv_pages_capacity"] - m["baton_kv_pages_free"] - m["baton_kv_pages_cached"], m["baton_kv_pages_capacity"]
}

// scenarioAdversaryIdentity runs a cluster whose members each hold only
// their own role's key, derived with `baton keys derive`, and attacks it
// with keys a member could steal from its own pod. The holder of the
// prefill key tries to be the router, and is refused and counted; the
// holder of a router key, calling from another host with a new name for
// every call, is still one caller to decode's bounds and holds at most
// --max-reservations-per-peer reservations and half the pool, so that a
// victim still gets pages and the reference text; every page comes back.
func scenarioAdversaryIdentity(t *testing.T, guardsOff string) violations {
	ref := loadReference(t)
	var v violations
	keys := deriveKeys(t, faultsBinary(t), authtest.SecretFile(t))
	c := startCluster(t, setup{
		guardsOff:   guardsOff,
		workerArgs:  []string{"--page-size", "4", "--handoff-timeout", "30s"},
		prefillArgs: []string{"--cluster-secret-file", keys[auth.RolePrefill]},
		decodeArgs: []string{"--cluster-secret-file", keys[auth.RoleDecode], "--max-total-tokens", fmt.Sprint(identityPoolTokens),
			"--max-reservations-per-peer", fmt.Sprint(identityPerPeer)},
		routerArgs: []string{"--cluster-secret-file", keys[auth.RoleRouter]},
	})
	d, p := c.Decode[0], c.Prefill[0]
	dinfo, pinfo := serverInfo(t, d), serverInfo(t, p)
	if dinfo["internal_auth"] != "secret" || pinfo["internal_auth"] != "secret" {
		v.add("workers say their plane is %v / %v, want secret", dinfo["internal_auth"], pinfo["internal_auth"])
	}
	if code, text, body := greedy(t, c.Router.URL, ref); code != 200 || text != ref.GeneratedText {
		v.add("before the attacks, a request through the router: %d %s", code, body)
	}
	prefillGRPC, _ := pinfo["grpc_addr"].(string)
	// The layout is no secret (it follows from the model); attackers get it
	// right so that only the guards stand in their way.
	info, err := keyHolder(t, keys[auth.RoleRouter], auth.RoleRouter, "reader", "", d, p).decode.Info(timeout(t), &pdv1.InfoRequest{})
	if err != nil {
		t.Fatalf("decode's Info with the router key: %v", err)
	}
	layout := info.Layout

	// The prefill key cannot make a router or a decode member at all...
	for _, r := range []auth.Role{auth.RoleRouter, auth.RoleDecode} {
		if _, err := auth.New(auth.Options{Role: r, Name: "intruder", SecretFile: keys[auth.RolePrefill]}); err == nil {
			v.add("the prefill key file made a %s member", r)
		}
	}
	// ...and its calls are prefill's, whatever they claim.
	dBefore, pBefore := authFailures(t, d, "decode"), authFailures(t, p, "prefill")
	asPrefill := keyHolder(t, keys[auth.RolePrefill], auth.RolePrefill, "intruder-prefill", "", d, p)
	relabelled := keyHolder(t, keys[auth.RolePrefill], auth.RolePrefill, "router-0", auth.RoleRouter, d, p)
	// Its key file rewritten to claim the router, so that it signs as one.
	signsAsRouter := keyHolder(t, authtest.ForgeRoleKey(t, keys[auth.RolePrefill], auth.RoleRouter), auth.RoleRouter, "router-1", "", d, p)
	attackers := []*attacker{asPrefill, relabelled, signsAsRouter}
	for _, a := range attackers {
		routerOnly(t, a, ref.PromptIDs, layout, prefillGRPC, &v)
	}
	dAfter, pAfter := authFailures(t, d, "decode"), authFailures(t, p, "prefill")
	for _, rpc := range []string{"Reserve", "Info", "Abort", "Finish", "Stream"} {
		if n := dAfter[rpc] - dBefore[rpc]; n < float64(len(attackers)) {
			v.add("decode counted %v refused %s calls from the prefill key, want %d (as prefill, relabelled, signed as router)", n, rpc, len(attackers))
		}
	}
	for _, rpc := range []string{"Prefill", "Tokenizer", "Info"} {
		if n := pAfter[rpc] - pBefore[rpc]; n < float64(len(attackers)) {
			v.add("prefill counted %v refused %s calls from the prefill key, want %d", n, rpc, len(attackers))
		}
	}

	// A router key used from another host, a fresh name per call: small
	// reservations stop at --max-reservations-per-peer...
	reserveAs := func(i, maxTokens int) (*pdv1.Reservation, error) {
		a := keyHolder(t, keys[auth.RoleRouter], auth.RoleRouter, fmt.Sprintf("fresh-%d", i), "", d, p)
		return a.decode.Reserve(timeout(t), &pdv1.ReserveRequest{RequestId: fmt.Sprintf("hoard-%d", i), Prompt: ref.PromptIDs[:4],
			Sampling: &pdv1.SamplingParams{MaxTokens: uint32(maxTokens)}, Layout: layout, Writer: prefillGRPC})
	}
	release := func(held []*pdv1.Reservation) {
		a := keyHolder(t, keys[auth.RoleRouter], auth.RoleRouter, "cleanup", "", d, p)
		for _, r := range held {
			if _, err := a.decode.Abort(timeout(t), &pdv1.AbortRequest{Room: r.Room, Epoch: r.Epoch, Capability: r.Capability}); err != nil {
				v.add("aborting a hoarded reservation: %v", err)
			}
		}
	}
	hoard := func(maxTokens int) []*pdv1.Reservation {
		var held []*pdv1.Reservation
		for i := range 3 * identityPerPeer {
			res, err := reserveAs(len(held)*100+i, maxTokens)
			if err != nil {
				if status.Code(err) != codes.ResourceExhausted {
					v.add("a hoarding Reserve failed otherwise than by a bound: %v", err)
				}
				continue
			}
			held = append(held, res)
		}
		return held
	}
	held := hoard(4)
	if len(held) > identityPerPeer {
		v.add("a router key with a fresh name per call held %d reservations, more than --max-reservations-per-peer %d", len(held), identityPerPeer)
	}
	release(held)

	// ...and reservations of the whole context stop at half the pool.
	held = hoard(0)
	inUse, total := pagesHeld(t, d)
	if inUse > total/2 {
		v.add("a router key with a fresh name per call held %v of %v pages (%d reservations), more than half the pool", inUse, total, len(held))
	}
	if len(held) == 0 {
		v.add("a router key from another host could not reserve at all: the bound is not per caller")
	}
	// The real router is another caller: its victim gets pages and the
	// reference while the intruder holds all it may.
	done := make(chan string, 1)
	go func() {
		code, text, body := greedy(t, c.Router.URL, ref)
		if code != 200 || text != ref.GeneratedText {
			done <- fmt.Sprintf("%d %s", code, body)
			return
		}
		done <- ""
	}()
	select {
	case msg := <-done:
		if msg != "" {
			v.add("a victim while the intruder holds %v pages: %s", inUse, msg)
		}
	case <-time.After(20 * time.Second):
		v.add("a victim while the intruder holds %v pages got no answer in 20s", inUse)
	}
	release(held)
	checkClean(t, c, &v)
	return v
}

// routerOnly tries what only the router may do; each must be refused.
func routerOnly(t *testing.T, a *attacker, prompt []int32, layout *pdv1.KVLayout, prefillGRPC string, v *violations) {
	ctx := timeout(t)
	if res, err := a.decode.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "intruder", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 8},
		Layout: layout, Writer: prefillGRPC}); err == nil {
		v.add("%s reserved pages (room %d)", a.name, res.Room)
		_, _ = a.decode.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	} else if c := status.Code(err); c != codes.PermissionDenied && c != codes.Unauthenticated {
		v.add("%s: Reserve refused as %v, want PermissionDenied or Unauthenticated", a.name, c)
	}
	if _, err := a.decode.Info(ctx, &pdv1.InfoRequest{}); err == nil {
		v.add("%s read decode's Info", a.name)
	}
	_, _ = a.decode.Abort(ctx, &pdv1.AbortRequest{Room: 1, Epoch: 1})
	_, _ = a.decode.Finish(ctx, &pdv1.AbortRequest{Room: 1, Epoch: 1})
	if st, err := a.decode.Stream(ctx, &pdv1.StreamRequest{Room: 1, Epoch: 1}); err == nil {
		if _, err := st.Recv(); err == nil {
			v.add("%s streamed a room", a.name)
		}
	}
	if st, err := a.decode.Generate(ctx, &pdv1.GenerateRequest{RequestId: "intruder", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 8}}); err == nil {
		if _, err := st.Recv(); err == nil {
			v.add("%s had decode generate for it", a.name)
		} else if c := status.Code(err); c != codes.PermissionDenied && c != codes.Unauthenticated {
			v.add("%s: Generate refused as %v, want PermissionDenied or Unauthenticated", a.name, c)
		}
	}
	if _, err := a.prefill.Info(ctx, &pdv1.InfoRequest{}); err == nil {
		v.add("%s read prefill's Info", a.name)
	}
	if _, err := a.prefill.Tokenizer(ctx, &pdv1.TokenizerRequest{}); err == nil {
		v.add("%s read prefill's tokenizer files", a.name)
	}
	if _, err := a.prefill.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "intruder", Prompt: prompt}); err == nil {
		v.add("%s had prefill compute a prompt", a.name)
	}
}

// Gate 5b, adversary identity: a member's key is its role. The prefill key
// cannot act as the router, and a router key cannot multiply decode's
// bounds by renaming itself.
func TestGateAdversaryIdentity(t *testing.T) { requireClean(t, scenarioAdversaryIdentity(t, "")) }
