package scheduler

import (
	"slices"
	"testing"

	"github.com/batonlm/baton/internal/model"
)

func generate(t *testing.T, e *Engine, prompt []int32, p Params) ([]int32, string) {
	t.Helper()
	r := NewRequest("r", prompt, p)
	if err := e.Submit(r); err != nil {
		t.Fatal(err)
	}
	toks, fin := collect(t, r)
	ids := make([]int32, len(toks))
	for i, tok := range toks {
		ids[i] = tok.ID
	}
	return ids, fin
}

// Each control changes the greedy reference in the way it promises; with the
// control switched off the reference comes back, so a control the engine
// ignored fails here.
func TestEngineSamplingControls(t *testing.T) {
	want := loadRef(t)
	e, _ := newEngine(t, 16, 300, 512)
	n := len(want.GeneratedIDs)
	base, _ := generate(t, e, want.PromptIDs, Params{MaxTokens: n})
	if !slices.Equal(base, want.GeneratedIDs) {
		t.Fatalf("greedy %v, reference %v", base, want.GeneratedIDs)
	}
	first := want.GeneratedIDs[0]

	got, _ := generate(t, e, want.PromptIDs, Params{MaxTokens: n, Sampling: model.Sampling{LogitBias: map[int32]float64{first: -100}}})
	if slices.Contains(got, first) {
		t.Errorf("logit_bias -100 on %d: it was still generated: %v", first, got)
	}

	// Frequency and presence: the greedy reference repeats tokens; a strong
	// penalty never lets a token come twice.
	if !repeats(want.GeneratedIDs) {
		t.Fatal("the reference has no repeated token to penalise")
	}
	for _, s := range []model.Sampling{{FrequencyPenalty: 2}, {PresencePenalty: 2}} {
		got, _ := generate(t, e, want.PromptIDs, Params{MaxTokens: n, Sampling: s})
		if slices.Equal(got, base) {
			t.Errorf("%+v changed nothing: %v", s, got)
		}
	}
	got, _ = generate(t, e, want.PromptIDs, Params{MaxTokens: n, Sampling: model.Sampling{RepetitionPenalty: 2}})
	if slices.Equal(got, base) {
		t.Errorf("repetition_penalty 2 changed nothing: %v", got)
	}
	got, _ = generate(t, e, want.PromptIDs, Params{MaxTokens: n, Sampling: model.Sampling{RepetitionPenalty: 1}})
	if !slices.Equal(got, base) {
		t.Errorf("repetition_penalty 1 is off, yet %v != %v", got, base)
	}
}

func repeats(ids []int32) bool {
	seen := map[int32]bool{}
	for _, id := range ids {
		if seen[id] {
			return true
		}
		seen[id] = true
	}
	return false
}

// min_tokens holds off both EOS and stop tokens, then lets them end it.
func TestEngineMinTokens(t *testing.T) {
	want := loadRef(t)
	e, _ := newEngine(t, 16, 300, 512)
	stop := want.GeneratedIDs[1]
	got, fin := generate(t, e, want.PromptIDs, Params{MaxTokens: 40, StopTokenIDs: []int32{stop}})
	if fin != FinishStop || len(got) != 2 {
		t.Fatalf("stop token %d: %v (%s)", stop, got, fin)
	}
	got, fin = generate(t, e, want.PromptIDs, Params{MaxTokens: 40, StopTokenIDs: []int32{stop}, MinTokens: 5})
	if len(got) <= 5 || slices.Contains(got[:5], stop) {
		t.Fatalf("min_tokens 5: %v (%s)", got, fin)
	}
	// EOS (id 2 in these tests) is banned too: bias it to the top, and it
	// still cannot come before min_tokens.
	eos := map[int32]float64{2: 100}
	got, fin = generate(t, e, want.PromptIDs, Params{MaxTokens: 40, Sampling: model.Sampling{LogitBias: eos}})
	if fin != FinishStop || len(got) != 1 {
		t.Fatalf("EOS biased up: %v (%s)", got, fin)
	}
	got, fin = generate(t, e, want.PromptIDs, Params{MaxTokens: 40, MinTokens: 3, Sampling: model.Sampling{LogitBias: eos}})
	if fin != FinishStop || len(got) != 4 || got[3] != 2 {
		t.Fatalf("EOS biased up with min_tokens 3: %v (%s)", got, fin)
	}
}
