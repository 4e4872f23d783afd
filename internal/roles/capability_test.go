package roles

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
)

// Every message about a reservation that names its room and epoch but not
// its capability is refused, counted under its RPC, and changes nothing:
// the victim's request still finishes with the reference text and every
// page comes back. The same goes for a second transfer session (even one
// with the capability) and for a Commit from another session than the
// one that wrote the pages.
func TestMessagesWithoutTheCapability(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx := context.Background()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "victim", Prompt: want.PromptIDs,
		Sampling: &pdv1.SamplingParams{MaxTokens: uint32(len(want.GeneratedIDs))}, Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Capability) != len(transfer.Capability{}) {
		t.Fatalf("reservation carries a %d-byte capability", len(res.Capability))
	}
	guess := append([]byte(nil), res.Capability...)
	guess[len(guess)-1] ^= 0x80
	kv := p.dPool.KV()
	page := transfer.PageWrite{Index: 0, Page: res.Pages[0], Tokens: 4, Data: make([]byte, transfer.PackedSize(kv, 4))}

	// A session with a guessed capability is refused, its frame lands nowhere.
	k := resKey(res)
	copy(k.Cap[:], guess)
	stranger, err := tcp.NewSender().Open(ctx, res.TransferAddr, k)
	if err != nil {
		t.Fatal(err)
	}
	if err := stranger.Write(page); err != nil {
		t.Fatal(err)
	}
	if err := stranger.Flush(ctx); err == nil {
		t.Fatal("a session with a guessed capability was admitted")
	}
	_ = stranger.Close()

	// Control messages with the guess.
	if _, err := p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(want.PromptIDs)),
		PageChecksums: make([]uint64, len(res.Pages)), FirstToken: &pdv1.Token{Id: 1}, Writer: p.prefillAddr, Capability: guess}); status.Code(err) != codes.NotFound {
		t.Fatalf("Commit with a guessed capability: %v", err)
	}
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Capability: guess}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.dc.Finish(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Capability: guess}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: guess}); err != nil {
		t.Fatal(err)
	}
	st, err := p.dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: guess})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.NotFound {
		t.Fatalf("Stream with a guessed capability: %v", err)
	}
	for _, rpc := range []string{"transfer", "Commit", "Abort", "Finish", "Drained", "Stream"} {
		if n := labelled(t, p.dm, "baton_internal_auth_failures_total", "rpc", rpc); n < 1 {
			t.Errorf("%s with a guessed capability not counted", rpc)
		}
	}

	// The real writer's session binds the reservation; a second one, even
	// with the capability, is refused, and a Commit naming it is too.
	writer, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	second, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Write(page); err != nil {
		t.Fatal(err)
	}
	if err := second.Flush(ctx); err == nil {
		t.Fatal("a second session for a bound reservation was admitted")
	}
	if _, err := p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(want.PromptIDs)),
		PageChecksums: make([]uint64, len(res.Pages)), FirstToken: &pdv1.Token{Id: 1}, Writer: p.prefillAddr, Capability: res.Capability,
		SessionId: sidOf(second)}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Commit naming another session: %v", err)
	}
	_ = second.Close()
	_ = writer.Close()
	// The stranger's Abort did nothing; the router's does.
	if st := p.dPool.Stats(); st.Free == st.Total {
		t.Fatal("the reservation's pages were freed by messages without its capability")
	}
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)

	// And a full handoff still gives the reference.
	handoffsMatch(t, p, want, 1, "after the stranger")
}

// One caller holds at most MaxReservationsPerPeer reservations at once;
// ending one makes room for the next.
func TestReservationsPerPeer(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512, func(o *DecodeOptions) { o.MaxReservationsPerPeer = 2 })
	ctx := context.Background()
	reserve := func() (*pdv1.Reservation, error) {
		return p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "q", Prompt: want.PromptIDs[:4], Sampling: &pdv1.SamplingParams{MaxTokens: 4},
			Layout: p.layout, Writer: p.prefillAddr})
	}
	var held []*pdv1.Reservation
	for range 2 {
		res, err := reserve()
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, res)
	}
	if _, err := reserve(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third reservation from one caller: %v", err)
	}
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: held[0].Room, Epoch: held[0].Epoch, Capability: held[0].Capability}); err != nil {
		t.Fatal(err)
	}
	res, err := reserve()
	if err != nil {
		t.Fatalf("after one ended: %v", err)
	}
	for _, r := range []*pdv1.Reservation{held[1], res} {
		if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: r.Room, Epoch: r.Epoch, Capability: r.Capability}); err != nil {
			t.Fatal(err)
		}
	}
	waitAllFree(t, p.dPool)
}

// labelled is the value of counter name with label key=value.
func labelled(t *testing.T, ms *metrics.Set, name, key, value string) float64 {
	t.Helper()
	mfs, err := ms.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == key && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// A Commit whose token count disagrees with the reservation is refused by
// the coverage comparison itself, even when every page is written in full
// and every checksum matches: fewer tokens is the incident's placeholder
// prompt, more is an over-claim.
func TestCommitTokenCountChecked(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx := context.Background()
	prompt := want.PromptIDs[:8]
	for _, claim := range []int{len(prompt) - 1, len(prompt) + 1} {
		res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "claim", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
			Layout: p.layout, Writer: p.prefillAddr})
		if err != nil {
			t.Fatal(err)
		}
		sess, sums := landZeros(t, ctx, p, res)
		_, err = p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(claim), PageChecksums: sums,
			FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: res.Capability, SessionId: sidOf(sess)})
		if err == nil {
			t.Fatalf("a commit claiming %d tokens of %d was accepted", claim, len(prompt))
		}
		_ = sess.Close()
		if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
			t.Fatal(err)
		}
		waitAllFree(t, p.dPool)
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "coverage"); n < 1 {
		t.Error("the short claim was not counted as a coverage failure")
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "over_claim"); n < 1 {
		t.Error("the over-claim was not counted")
	}
}

// A reservation has one reader: a second Stream, even with the capability,
// is refused and counted, and the first reader still gets every token.
func TestOneStreamPerReservation(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx := context.Background()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "one", Prompt: want.PromptIDs,
		Sampling: &pdv1.SamplingParams{MaxTokens: uint32(len(want.GeneratedIDs))}, Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	first, err := p.dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	if err != nil {
		t.Fatal(err)
	}
	// Wait until the first Stream's handler has claimed the reservation.
	r := p.decode.find("test", res.Room, res.Epoch, res.Capability)
	for deadline := time.Now().Add(5 * time.Second); !r.claimed(); {
		if time.Now().After(deadline) {
			t.Fatal("the first Stream never claimed the reservation")
		}
		time.Sleep(time.Millisecond)
	}
	second, err := p.dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	if err == nil {
		_, err = second.Recv()
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a second Stream of one reservation: %v", err)
	}
	if n := labelled(t, p.dm, "baton_internal_auth_failures_total", "rpc", "Stream"); n < 1 {
		t.Error("the second Stream was not counted")
	}
	if _, err := p.pc.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "one", Prompt: want.PromptIDs,
		Sampling: &pdv1.SamplingParams{MaxTokens: uint32(len(want.GeneratedIDs))}, Reservation: res}); err != nil {
		t.Fatal(err)
	}
	var got []int32
	for {
		ev, err := first.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Token != nil {
			got = append(got, ev.Token.Id)
		}
		if ev.Finish != "" || ev.Error != "" {
			break
		}
	}
	if !slices.Equal(got, want.GeneratedIDs) {
		t.Fatalf("the first reader got %v, want %v", got, want.GeneratedIDs)
	}
	waitAllFree(t, p.dPool)
}
