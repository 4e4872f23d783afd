package scheduler

import (
	"math"
	"slices"
	"testing"

	"github.com/batonlm/baton/internal/model"
)

func generate(t *testing.T, e *Engine, prompt []int32, p Params) ([]int32, string) {
	t.Helper()
	r := NewRequest("r", prompt, p)
	if err := e.Enqueue(r); err != nil {
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

// A prompt's logprobs are the model's predictions of its own tokens: with
// the reference's greedy output appended to its prompt, they equal the
// logprobs the reference generated those tokens with, however the prompt
// is chunked.
func TestEnginePromptLogprobs(t *testing.T) {
	want := loadRef(t)
	const k = 8
	prompt := append(append([]int32(nil), want.PromptIDs...), want.GeneratedIDs[:k]...)
	for _, tc := range []struct{ page, pages, chunk int }{{16, 300, 512}, {1, 4096, 3}} {
		e, _ := newEngine(t, tc.page, tc.pages, tc.chunk)
		// A request without prompt logprobs shares the batches: its rows
		// must not be mistaken for the other's.
		plain := NewRequest("p", want.PromptIDs, Params{MaxTokens: 12})
		r := NewRequest("r", prompt, Params{MaxTokens: 1, PromptLogprobs: true, Sampling: model.Sampling{TopLogprobs: 2}})
		if err := e.Enqueue(plain); err != nil {
			t.Fatal(err)
		}
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
		ev, _ := r.Next(t.Context())
		if ev.Token == nil || len(ev.Prompt) != len(prompt)-1 {
			t.Fatalf("chunk %d: first event %+v with %d prompt logprobs, want %d", tc.chunk, ev, len(ev.Prompt), len(prompt)-1)
		}
		for j := range k {
			got := ev.Prompt[len(want.PromptIDs)-1+j]
			ref := want.Top5[j][0]
			if got.ID != prompt[len(want.PromptIDs)+j] || math.Abs(float64(got.Logprob)-ref.Logprob) > 1e-3 || len(got.Top) != 2 || got.Top[0].ID != ref.ID {
				t.Errorf("chunk %d, generated token %d: %+v, reference %+v", tc.chunk, j, got, ref)
			}
		}
		collect(t, r)
		toks, _ := collect(t, plain)
		for j, tok := range toks {
			if tok.ID != want.GeneratedIDs[j] {
				t.Fatalf("chunk %d: the plain request's token %d is %d, want %d", tc.chunk, j, tok.ID, want.GeneratedIDs[j])
			}
		}
	}
	// Without the flag, nothing.
	e, _ := newEngine(t, 16, 300, 512)
	r := NewRequest("r", prompt, Params{MaxTokens: 1})
	if err := e.Enqueue(r); err != nil {
		t.Fatal(err)
	}
	if ev, _ := r.Next(t.Context()); ev.Prompt != nil {
		t.Fatalf("prompt logprobs without asking: %d", len(ev.Prompt))
	}
}

// A continuation's own output at the end of its prompt (Params.Continued)
// counts as generated for the penalties, as it did on the pair that failed
// it: a token pushed up by logit_bias is chosen next when it is only in the
// prompt, and not when the prompt's tail that holds it is the output.
func TestContinuedOutputIsPenalised(t *testing.T) {
	want := loadRef(t)
	e, _ := newEngine(t, 16, 300, 512)
	out := want.GeneratedIDs[:3]
	prompt := append(slices.Clone(want.PromptIDs), out...)
	s := model.Sampling{LogitBias: map[int32]float64{out[0]: 30}, PresencePenalty: 100}
	got, _ := generate(t, e, prompt, Params{MaxTokens: 1, Sampling: s})
	if len(got) != 1 || got[0] != out[0] {
		t.Fatalf("the prompt alone is not penalised: got %v, want %d", got, out[0])
	}
	got, _ = generate(t, e, prompt, Params{MaxTokens: 1, Sampling: s, Continued: len(out)})
	if len(got) != 1 || got[0] == out[0] {
		t.Fatalf("output at the prompt's end, counted as generated, was not penalised: got %v", got)
	}
	got, _ = generate(t, e, prompt, Params{MaxTokens: 1, Sampling: s, Continued: 1000})
	if len(got) != 1 || got[0] == out[0] {
		t.Fatalf("Continued past the prompt: got %v", got)
	}
}
