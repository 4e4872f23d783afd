package roles

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
)

// generate plays the router's short-prompt path: Generate on the decode
// worker alone, the tokens and the finish back.
func (p *pair) generate(ctx context.Context, prompt []int32, maxTokens int) ([]int32, string, error) {
	st, err := p.dc.Generate(ctx, &pdv1.GenerateRequest{RequestId: "g", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: uint32(maxTokens)}})
	if err != nil {
		return nil, "", err
	}
	return readTokens(st)
}

// A decode worker computes a prompt itself when asked to (Generate): the
// greedy reference comes out, in the same batches as handed-over requests
// (which still come out right), chunked at the prefill chunk size, and every
// page comes back with no writer involved.
func TestGenerateOnDecode(t *testing.T) {
	want := loadRef(t)
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {2, 3}} {
		p := newPair(t, tc.page, tc.chunk)
		if !p.decode.WorkerInfo().PrefillsLocally {
			t.Fatal("decode does not say it prefills locally")
		}
		before := p.dPool.Stats()
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				var toks []int32
				var fin string
				var err error
				if i%2 == 0 {
					toks, fin, err = p.generate(ctx, want.PromptIDs, len(want.GeneratedIDs))
				} else {
					toks, fin, err = p.handoff(t, want.PromptIDs, len(want.GeneratedIDs))
				}
				if err != nil || fin != "length" || !slices.Equal(toks, want.GeneratedIDs) {
					t.Errorf("page %d chunk %d, request %d: %v %q %v, want %v", tc.page, tc.chunk, i, toks, fin, err, want.GeneratedIDs)
				}
			}()
		}
		wg.Wait()
		waitAllFree(t, p.dPool, p.pPool)
		st := p.dPool.Stats()
		if got := st.WritersDone - before.WritersDone; got != 3 || st.ReleaseErrors != 0 || st.Reclaims != before.Reclaims {
			t.Errorf("decode pool: %d writers done (want 3, one per handoff), %d release errors", got, st.ReleaseErrors)
		}
	}
}

// Bad input and a caller that leaves: a prompt past the context is refused
// as the client's fault; a request whose router goes away mid-stream is
// torn down and its pages come back; a worker shutting down takes none.
func TestGenerateRefusesAndCancels(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 16, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, err := p.generate(ctx, make([]int32, 600), 4); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a prompt past the context: %v, want InvalidArgument", err)
	}
	if _, _, err := p.generate(ctx, nil, 4); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("an empty prompt: %v, want InvalidArgument", err)
	}
	cctx, ccancel := context.WithCancel(ctx)
	st, err := p.dc.Generate(cctx, &pdv1.GenerateRequest{RequestId: "gone", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 400}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	ccancel()
	waitAllFree(t, p.dPool)
	p.decode.SetShuttingDown()
	if _, _, err := p.generate(ctx, want.PromptIDs, 4); status.Code(err) != codes.Unavailable {
		t.Fatalf("Generate on a worker shutting down: %v, want Unavailable", err)
	}
}
