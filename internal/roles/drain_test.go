package roles

import (
	"context"
	"slices"
	"testing"
	"time"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
)

// handBackRun plays the router for one request: Reserve, Stream, Prefill,
// with HandBack called once handBackAt tokens arrived (0: never; the
// worker handed back before, and Prefill is asked only after the stream's
// first event). It returns the tokens and the last event.
func handBackRun(t *testing.T, p *pair, prompt []int32, maxTokens, handBackAt int) ([]int32, *pdv1.TokenEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sp := &pdv1.SamplingParams{MaxTokens: uint32(maxTokens), IgnoreEos: true}
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "drained", Prompt: prompt, Sampling: sp, Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	st, err := p.dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	if err != nil {
		t.Fatal(err)
	}
	prefill := func() {
		go func() {
			_, _ = p.pc.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "drained", Prompt: prompt, Sampling: sp, Reservation: res})
		}()
	}
	if handBackAt > 0 {
		prefill()
	}
	var toks []int32
	for {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("stream broke after %d tokens: %v", len(toks), err)
		}
		if handBackAt == 0 {
			// Prefill is asked only now, for a reservation the hand-back
			// ended while it was Reserved: it must be refused, and its
			// pages come back.
			prefill()
			handBackAt = -1
		}
		if ev.Token != nil {
			toks = append(toks, ev.Token.Id)
			if len(toks) == handBackAt {
				if n := p.decode.HandBack(); n != 1 {
					t.Errorf("HandBack told %d streams, want 1", n)
				}
			}
		}
		if ev.Finish != "" || ev.Error != "" {
			return toks, ev
		}
	}
}

// HandBack ends a running request with finish "drain" and code 503 after
// the tokens it generated, each a token of the uninterrupted run; one still
// waiting for prefill's Commit ends the same way before any token. Every
// page comes back on both workers by the usual rules (the aborted
// reservation's once its writer drained).
func TestHandBackEndsStreams(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 16)
	max := 400
	toks, last := handBackRun(t, p, want.PromptIDs, max, 3)
	if last.Finish != request.FinishDrain || last.Code != 503 || last.Error == "" {
		t.Fatalf("last event %+v, want finish %q code 503", last, request.FinishDrain)
	}
	if len(toks) < 3 || len(toks) >= max {
		t.Fatalf("%d tokens before the hand-back, want at least 3 and fewer than %d", len(toks), max)
	}
	n := min(len(toks), len(want.GeneratedIDs))
	if !slices.Equal(toks[:n], want.GeneratedIDs[:n]) {
		t.Errorf("tokens %v, want a prefix of %v", toks, want.GeneratedIDs)
	}
	waitAllFree(t, p.dPool, p.pPool)

	// A stream opened after the hand-back, its request not committed yet.
	toks, last = handBackRun(t, p, want.PromptIDs, max, 0)
	if last.Finish != request.FinishDrain || last.Code != 503 || len(toks) != 0 {
		t.Fatalf("uncommitted request: %d tokens, last event %+v", len(toks), last)
	}
	waitAllFree(t, p.dPool, p.pPool)
	if st := p.dPool.Stats(); st.ReleaseErrors != 0 {
		t.Fatalf("decode pool %+v", st)
	}
}

// A request its decode worker computes itself (Generate) is handed back
// like a handed-over one: finish "drain", code 503, after tokens of the
// uninterrupted run, and its pages come back.
func TestHandBackEndsGenerate(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 16)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := p.dc.Generate(ctx, &pdv1.GenerateRequest{RequestId: "local", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 400, IgnoreEos: true}})
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	var last *pdv1.TokenEvent
	for last == nil {
		ev, err := st.Recv()
		if err != nil {
			t.Fatalf("stream broke after %d tokens: %v", len(toks), err)
		}
		if ev.Token != nil {
			if toks = append(toks, ev.Token.Id); len(toks) == 3 {
				if n := p.decode.HandBack(); n != 1 {
					t.Errorf("HandBack told %d streams, want 1", n)
				}
			}
		}
		if ev.Finish != "" || ev.Error != "" {
			last = ev
		}
	}
	if last.Finish != request.FinishDrain || last.Code != 503 || len(toks) < 3 || len(toks) >= 400 {
		t.Fatalf("%d tokens, last event %+v; want finish %q code 503 after at least 3", len(toks), last, request.FinishDrain)
	}
	n := min(len(toks), len(want.GeneratedIDs))
	if !slices.Equal(toks[:n], want.GeneratedIDs[:n]) {
		t.Errorf("tokens %v, want a prefix of %v", toks, want.GeneratedIDs)
	}
	waitAllFree(t, p.dPool)
	if got := testutilCounter(t, p.dm, "baton_requests_handed_back_total"); got != 1 {
		t.Errorf("baton_requests_handed_back_total = %v, want 1", got)
	}
}
