package gates

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
	"github.com/batonlm/baton/internal/roles"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
	"github.com/batonlm/baton/test/harness"
)

// perPeer is the decode worker's --max-reservations-per-peer in the
// adversary gate: the intruder's share, which must leave room for others.
const perPeer = 4

// trap is a listener an attacker controls: the address it asks a worker to
// dial. Every connection that reaches it is counted and dropped.
type trap struct {
	ln   net.Listener
	hits atomic.Int64
}

func newTrap(t *testing.T) *trap {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &trap{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tr.hits.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return tr
}

func (tr *trap) addr() string { return tr.ln.Addr().String() }

// attacker is one set of credentials aimed at the cluster's workers.
type attacker struct {
	name     string
	decode   pdv1.DecodeClient
	prefill  pdv1.PrefillClient
	sessions transfer.Sender
}

// dialWorkers makes an attacker's clients from its dial options and its
// transfer handshake.
func dialWorkers(t *testing.T, name string, d, p *harness.Server, dopts, popts []grpc.DialOption, hs transfer.Handshake) *attacker {
	dial := func(s *harness.Server, opts []grpc.DialOption) *grpc.ClientConn {
		addr, _ := serverInfo(t, s)["grpc_addr"].(string)
		cc, err := grpc.NewClient(addr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	return &attacker{name: name, decode: pdv1.NewDecodeClient(dial(d, dopts)), prefill: pdv1.NewPrefillClient(dial(p, popts)),
		sessions: tcp.NewSender(tcp.WithHandshake(hs))}
}

// member is an attacker holding the cluster secret, playing role under a
// name of its own.
func member(t *testing.T, secret string, role auth.Role, d, p *harness.Server) *attacker {
	o := authtest.SecretOptions(secret, role)
	o.Name = "intruder-" + string(role)
	plane, err := auth.New(o)
	if err != nil {
		t.Fatal(err)
	}
	// From another host than the real members: decode's bounds are per
	// credential and host, and this member must not share the router's.
	return dialWorkers(t, "a member playing "+string(role), d, p, append(plane.DialOptions(auth.RoleDecode), fromHost(intruderHost)),
		append(plane.DialOptions(auth.RolePrefill), fromHost(intruderHost)), roles.TransferHandshake(plane))
}

// guesses are the reservations an attacker names: rooms count up from 1 and
// epochs too, so the first few of each cover the live ones.
func guesses() []transfer.Key {
	var ks []transfer.Key
	for room := uint64(1); room <= 3; room++ {
		for epoch := uint64(1); epoch <= 3; epoch++ {
			ks = append(ks, transfer.Key{Room: room, Epoch: epoch, Cap: transfer.NewCapability()})
		}
	}
	return ks
}

// scenarioAdversary runs a live cluster whose members share a cluster
// secret, and tries every attack on its internal plane while a victim's
// request is in flight: first as a stranger (no credentials, then a wrong
// secret), then as a member that was never handed the victim's
// capability. Every attempt must be refused and counted, nothing may be
// dialled on an attacker's word, and the victims must get the reference.
func scenarioAdversary(t *testing.T, guardsOff string) violations {
	ref := loadReference(t)
	var v violations
	secret := authtest.SecretFile(t)
	c := startCluster(t, setup{
		// A slow writer keeps the victim's reservation open while the attacks run.
		prefillFaults: "slow_writer=300ms", guardsOff: guardsOff,
		workerArgs: []string{"--page-size", "4", "--cluster-secret-file", secret, "--handoff-timeout", "2s"},
		decodeArgs: []string{"--max-total-tokens", "512", "--max-reservations-per-peer", fmt.Sprint(perPeer)},
		routerArgs: []string{"--cluster-secret-file", secret},
	})
	d, p := c.Decode[0], c.Prefill[0]
	dinfo, pinfo := serverInfo(t, d), serverInfo(t, p)
	if dinfo["internal_auth"] != "secret" || pinfo["internal_auth"] != "secret" {
		v.add("workers say their plane is %v / %v, want secret", dinfo["internal_auth"], pinfo["internal_auth"])
	}
	transferAddr, _ := dinfo["transfer_addr"].(string)
	prefillGRPC, _ := pinfo["grpc_addr"].(string)
	tr := newTrap(t)
	// The layout is no secret (it follows from the model); attackers get
	// it right so that only the guards stand in their way.
	intruder := member(t, secret, auth.RoleRouter, d, p)
	info, err := intruder.decode.Info(timeout(t), &pdv1.InfoRequest{})
	if err != nil {
		t.Fatalf("a member's Info: %v", err)
	}
	layout := info.Layout

	victim := func() <-chan string {
		out := make(chan string, 1)
		go func() {
			code, text, body := greedy(t, c.Router.URL, ref)
			if code != 200 || text != ref.GeneratedText {
				out <- fmt.Sprintf("%d %s", code, body)
				return
			}
			out <- ""
		}()
		return out
	}
	first := victim()
	if !waitFor(t, 5*time.Second, func() bool { return harness.Metrics(t, d)["baton_kv_reservations_active"] >= 1 }) {
		v.add("the victim's request never reserved pages")
	}

	plain := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	wrongSecret := authtest.SecretFile(t)
	strangers := []*attacker{dialWorkers(t, "a stranger without credentials", d, p, plain, plain, transfer.Plain{})}
	if plane, err := auth.New(authtest.SecretOptions(wrongSecret, auth.RoleRouter)); err == nil {
		strangers = append(strangers, dialWorkers(t, "a stranger with a wrong secret", d, p, plane.DialOptions(auth.RoleDecode), plane.DialOptions(auth.RolePrefill), transfer.Plain{}))
	} else {
		t.Fatal(err)
	}
	for _, a := range strangers {
		strangerAttacks(t, a, &v, ref.PromptIDs, layout, tr, transferAddr, prefillGRPC)
	}
	insiderAttacks(t, secret, d, p, &v, layout, tr, transferAddr)
	if msg := <-first; msg != "" {
		v.add("the victim in flight during the attacks: %s", msg)
	}

	// The intruder holds its share of reservations; the pool still has
	// room for everyone else.
	held := reserveAll(t, intruder, ref.PromptIDs, layout, prefillGRPC, &v)
	if msg := <-victim(); msg != "" {
		v.add("a victim while the intruder holds %d reservations: %s", len(held), msg)
	}
	for _, r := range held {
		_, _ = intruder.decode.Abort(timeout(t), &pdv1.AbortRequest{Room: r.Room, Epoch: r.Epoch, Capability: r.Capability})
	}

	if n := tr.hits.Load(); n > 0 {
		v.add("workers dialled an attacker's address %d times", n)
	}
	m := harness.Metrics(t, d)
	for _, rpc := range []string{"Reserve", "Stream", "Generate", "Commit", "Abort", "Finish", "Drained", "Info", "transfer"} {
		if m[fmt.Sprintf(`baton_internal_auth_failures_total{role="decode",rpc=%q}`, rpc)] < 1 {
			v.add("decode counted no refused %s", rpc)
		}
	}
	mp := harness.Metrics(t, p)
	for _, rpc := range []string{"Prefill", "Abort", "Info"} {
		if mp[fmt.Sprintf(`baton_internal_auth_failures_total{role="prefill",rpc=%q}`, rpc)] < 1 {
			v.add("prefill counted no refused %s", rpc)
		}
	}
	checkClean(t, c, &v)
	return v
}

// strangerAttacks is everything a process that reaches the ports but holds
// no valid credentials tries. Each must fail.
func strangerAttacks(t *testing.T, a *attacker, v *violations, prompt []int32, layout *pdv1.KVLayout, tr *trap, transferAddr, prefillGRPC string) {
	ctx := timeout(t)
	if res, err := a.decode.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "stranger", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 8},
		Layout: layout, Writer: prefillGRPC}); err == nil {
		v.add("%s reserved pages (room %d)", a.name, res.Room)
		_, _ = a.decode.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	}
	if _, err := a.decode.Info(ctx, &pdv1.InfoRequest{}); err == nil {
		v.add("%s read decode's Info", a.name)
	}
	// A prompt decode would compute itself: tokens for a stranger, and
	// decode's time.
	if st, err := a.decode.Generate(ctx, &pdv1.GenerateRequest{RequestId: "stranger", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 8}}); err == nil {
		if ev, err := st.Recv(); err == nil {
			v.add("%s had decode generate for it (%v)", a.name, ev)
		}
	}
	if _, err := a.prefill.Info(ctx, &pdv1.InfoRequest{}); err == nil {
		v.add("%s read prefill's Info", a.name)
	}
	if _, err := a.prefill.Tokenizer(ctx, &pdv1.TokenizerRequest{}); err == nil {
		v.add("%s read prefill's tokenizer files", a.name)
	}
	// Prefill, pointed at the attacker's own address.
	fake := transfer.NewCapability()
	if _, err := a.prefill.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "stranger", Prompt: prompt, Reservation: &pdv1.Reservation{
		Room: 1, Epoch: 1, Pages: make([]int32, (len(prompt)+int(layout.PageSize)-1)/int(layout.PageSize)), PromptTokens: uint32(len(prompt)),
		Layout: layout, Transport: "tcp", TransferAddr: tr.addr(), DecodeAddr: tr.addr(), Capability: fake[:]}}); err == nil {
		v.add("%s had prefill compute a prompt", a.name)
	}
	if _, err := a.prefill.Abort(ctx, &pdv1.AbortRequest{Room: 1, Epoch: 1, DecodeAddr: tr.addr(), Capability: fake[:]}); err == nil {
		v.add("%s had prefill take an Abort", a.name)
	}
	for _, k := range guesses() {
		attackReservation(ctx, a, k, v, transferAddr, prefillGRPC)
	}
}

// attackReservation is every message about someone else's reservation k
// (named by a guessed room and epoch and a capability the attacker made up).
func attackReservation(ctx context.Context, a *attacker, k transfer.Key, v *violations, transferAddr, prefillGRPC string) {
	if s, err := a.sessions.Open(ctx, transferAddr, k); err == nil {
		_ = s.Write(transfer.PageWrite{Index: 0, Page: 0, Tokens: 1, Data: make([]byte, 4)})
		if err := s.Flush(ctx); err == nil {
			v.add("%s: a transfer session into %v was admitted", a.name, k)
		}
		_ = s.Close()
	}
	if _, err := a.decode.Commit(ctx, &pdv1.CommitRequest{Room: k.Room, Epoch: k.Epoch, TokensWritten: 5, PageChecksums: []uint64{0, 0},
		FirstToken: &pdv1.Token{Id: 1}, Writer: prefillGRPC, Capability: k.Cap[:]}); err == nil {
		v.add("%s: a Commit for %v was accepted", a.name, k)
	}
	if st, err := a.decode.Stream(ctx, &pdv1.StreamRequest{Room: k.Room, Epoch: k.Epoch, Capability: k.Cap[:]}); err == nil {
		if ev, err := st.Recv(); err == nil {
			v.add("%s: Stream of %v gave an event (%v)", a.name, k, ev)
		}
	}
	// Their answers are empty either way; what they must not do shows in
	// the victim's output and in the pool.
	_, _ = a.decode.Abort(ctx, &pdv1.AbortRequest{Room: k.Room, Epoch: k.Epoch, Capability: k.Cap[:]})
	_, _ = a.decode.Finish(ctx, &pdv1.AbortRequest{Room: k.Room, Epoch: k.Epoch, Capability: k.Cap[:]})
	_, _ = a.decode.Drained(ctx, &pdv1.DrainedRequest{Room: k.Room, Epoch: k.Epoch, Writer: prefillGRPC, Capability: k.Cap[:]})
}

// insiderAttacks are made with the cluster secret but without the
// victim's capability: a member gone wrong. The capability, the session
// binding and the known-decode rule must stop it.
func insiderAttacks(t *testing.T, secret string, d, p *harness.Server, v *violations, layout *pdv1.KVLayout, tr *trap, transferAddr string) {
	ctx := timeout(t)
	asPrefill := member(t, secret, auth.RolePrefill, d, p)
	asRouter := member(t, secret, auth.RoleRouter, d, p)
	asDecode := member(t, secret, auth.RoleDecode, d, p)
	prefillGRPC, _ := serverInfo(t, p)["grpc_addr"].(string)
	for _, k := range guesses() {
		attackReservation(ctx, asPrefill, k, v, transferAddr, prefillGRPC)
		attackReservation(ctx, asRouter, k, v, transferAddr, prefillGRPC)
	}
	// Only the router learns the tokenizer from prefill (the callers table).
	for _, m := range []*attacker{asPrefill, asDecode} {
		if _, err := m.prefill.Tokenizer(ctx, &pdv1.TokenizerRequest{}); err == nil {
			v.add("%s read prefill's tokenizer files", m.name)
		}
	}
	// Decode's Abort to prefill, answered at an address of the attacker's.
	fake := transfer.NewCapability()
	if _, err := asDecode.prefill.Abort(ctx, &pdv1.AbortRequest{Room: 1, Epoch: 1, DecodeAddr: tr.addr(), Capability: fake[:]}); err == nil {
		// Give a wrongly accepted Abort the time to dial.
		time.Sleep(200 * time.Millisecond)
	}

	// A reservation the intruder made and handed to the real prefill
	// worker: once prefill's session writes it, a second session (even
	// with the capability) is refused, and so is a Commit naming it.
	ref := loadReference(t)
	res, err := asRouter.decode.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "intruder", Prompt: ref.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: layout, Writer: prefillGRPC})
	if err != nil {
		v.add("the intruder could not reserve for the session test: %v", err)
		return
	}
	landed := harness.Metrics(t, d)["baton_kv_transfer_bytes_total"]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = asRouter.prefill.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "intruder", Prompt: ref.PromptIDs,
			Sampling: &pdv1.SamplingParams{MaxTokens: 4}, Reservation: res})
	}()
	// A frame of prefill's session landed: that session is the bound one.
	if !waitFor(t, 5*time.Second, func() bool { return harness.Metrics(t, d)["baton_kv_transfer_bytes_total"] > landed }) {
		v.add("prefill's session never wrote the intruder's reservation")
	}
	c, _ := transfer.CapabilityFrom(res.Capability)
	k := transfer.Key{Room: res.Room, Epoch: res.Epoch, Cap: c}
	if s, err := asPrefill.sessions.Open(ctx, transferAddr, k); err == nil {
		elem := 4 // f32; f16 and bf16 elements are 2 bytes
		if layout.GetDtype() != "f32" {
			elem = 2
		}
		// K and V of one token, all layers: a payload of the right size, so
		// only the session binding can refuse it.
		rowBytes := elem * int(layout.KvHeads*layout.HeadDim*layout.Layers) * 2
		_ = s.Write(transfer.PageWrite{Index: 0, Page: res.Pages[0], Tokens: 4, Data: make([]byte, 4*rowBytes)})
		if err := s.Flush(ctx); err == nil {
			v.add("a second transfer session into a reservation being written was admitted")
		}
		id := s.ID()
		if _, err := asPrefill.decode.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(ref.PromptIDs)),
			PageChecksums: make([]uint64, len(res.Pages)), FirstToken: &pdv1.Token{Id: 1}, Writer: prefillGRPC, Capability: res.Capability,
			SessionId: id[:]}); err == nil {
			v.add("a Commit from a session that did not write the pages was accepted")
		}
		_ = s.Close()
	}
	_, _ = asRouter.decode.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	wg.Wait()
}

// reserveAll reserves as a router would until decode refuses, and returns
// what it got; it must stop at the per-peer bound.
func reserveAll(t *testing.T, a *attacker, prompt []int32, layout *pdv1.KVLayout, writer string, v *violations) []*pdv1.Reservation {
	var held []*pdv1.Reservation
	for range 64 {
		res, err := a.decode.Reserve(timeout(t), &pdv1.ReserveRequest{RequestId: "hoard", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 64},
			Layout: layout, Writer: writer})
		if err != nil {
			break
		}
		held = append(held, res)
	}
	if len(held) > perPeer {
		v.add("one caller held %d reservations, more than --max-reservations-per-peer %d", len(held), perPeer)
	}
	return held
}

// Gate 5, adversary: strangers and a member without the capability get
// nothing from the internal plane, and are counted.
func TestGateAdversary(t *testing.T) { requireClean(t, scenarioAdversary(t, "")) }
