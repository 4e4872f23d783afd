package roles

import (
	"context"
	"testing"
	"time"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
)

// An abort that decided the request had not joined the batch, and a
// Commit that lands in the gap before the abort acts: the request joins
// and decodes, so the abort must not release its pages from under the
// engine loop. The gap is held open by testHookAbort, not by sleeping:
// inside it the Commit is made and the engine is seen decoding.
func TestAbortRacesCommit(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prompt := want.PromptIDs[:8]
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "race", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 200, IgnoreEos: true},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan *pdv1.TokenEvent, 512)
	go func() {
		defer close(events)
		for {
			ev, err := st.Recv()
			if err != nil {
				return
			}
			events <- ev
		}
	}()
	sess, sums := landZeros(t, ctx, p, res)
	defer sess.Close()
	commit := &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(prompt)), PageChecksums: sums,
		FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: res.Capability, SessionId: sidOf(sess)}

	hooked := false
	testHookAbort = func(r *reservation) {
		if hooked {
			return
		}
		hooked = true
		// In the gap: the handoff completes and the engine starts decoding.
		if _, err := p.dc.Commit(ctx, commit); err != nil {
			t.Logf("commit in the gap: %v", err)
			return
		}
		for r.r.State() != scheduler.StateDecoding && ctx.Err() == nil {
			time.Sleep(time.Millisecond)
		}
	}
	defer func() { testHookAbort = nil }()
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "client left", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	if !hooked {
		t.Fatal("the abort never reached the gap")
	}
	var last *pdv1.TokenEvent
	for ev := range events {
		last = ev
		if ev.Finish != "" || ev.Error != "" {
			break
		}
	}
	if last == nil || last.Code != 499 {
		t.Errorf("the request's last event %v, want an abort (499)", last)
	}
	_ = sess.Close()
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
	if n := testutilCounter(t, p.dm, "baton_kv_read_gate_failures_total"); n != 0 {
		t.Errorf("the engine read pages the abort had released: %v read-gate failures", n)
	}
}

// landZeros opens a writer's session for res and lands every page full
// (zeros: finite KV whose checksums are known), for a Commit to claim.
func landZeros(t *testing.T, ctx context.Context, p *pair, res *pdv1.Reservation) (transfer.Session, []uint64) {
	t.Helper()
	sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	ps := int(p.layout.PageSize)
	var sums []uint64
	for i, pg := range res.Pages {
		tokens := min(ps, int(res.PromptTokens)-i*ps)
		data := make([]byte, transfer.PackedSize(p.dPool.KV(), tokens))
		if err := sess.Write(transfer.PageWrite{Index: i, Page: pg, Tokens: tokens, Data: data}); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, transfer.Checksum(data))
	}
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return sess, sums
}
