package roles

import (
	"fmt"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
)

// A decode worker drafting with a draft model computes the draft's prompt
// KV itself from the prompt ids it reserved for (the handoff carries the
// model's KV only, under the same proofs), and its greedy output is the
// reference; the prefill worker runs no speculation. Draft pages come back
// with the requests.
func TestDecodeDraftsFromThePromptIDs(t *testing.T) {
	var draftPools []*kvpool.Pool
	testDecodeSpec = func(t testing.TB, be kernels.Backend) scheduler.SpecConfig {
		l, err := model.Load(model.LoadOptions{}, be)
		if err != nil {
			t.Fatal(err)
		}
		// The model's first three layers: drafts accepted and rejected.
		c := l.Model.Config
		c.Layers = 3
		w := *l.Model.Weights
		w.Layers = w.Layers[:3]
		pool, err := kvpool.New(kvpool.Config{NumPages: 1024, PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
		if err != nil {
			t.Fatal(err)
		}
		draftPools = append(draftPools, pool)
		return scheduler.SpecConfig{Algorithm: "draft", DraftTokens: 4, Steps: 4, Draft: &scheduler.DraftModel{Model: model.New(c, &w, be), Pool: pool}}
	}
	defer func() { testDecodeSpec = nil }()
	want := loadRef(t)
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {4, 3}} {
		p := newPair(t, tc.page, tc.chunk)
		handoffsMatch(t, p, want, 4, fmt.Sprintf("page %d chunk %d", tc.page, tc.chunk))
		drafted, accepted := testutilCounter(t, p.dm, "baton_spec_draft_tokens_total"), testutilCounter(t, p.dm, "baton_spec_accepted_tokens_total")
		if drafted == 0 || accepted == 0 || accepted == drafted {
			t.Errorf("page %d: drafted %v, accepted %v: want drafts accepted and rejected", tc.page, drafted, accepted)
		}
		if pd := testutilCounter(t, p.pm, "baton_spec_draft_tokens_total"); pd != 0 {
			t.Errorf("the prefill worker drafted %v tokens", pd)
		}
	}
	waitAllFree(t, draftPools...)
}
