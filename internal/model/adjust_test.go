package model

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestSampleAfterAdjusts(t *testing.T) {
	logits := []float32{1, 3, 2, -1, 0}
	greedy := Sampling{}
	var s Sampler
	for _, c := range []struct {
		name string
		p    Sampling
		h    History
		want int32
	}{
		{"none", greedy, History{}, 1},
		{"bias bans", Sampling{LogitBias: map[int32]float64{1: -100}}, History{}, 2},
		{"bias lifts", Sampling{LogitBias: map[int32]float64{3: 4.5}}, History{}, 3},
		{"bias outside vocab is ignored", Sampling{LogitBias: map[int32]float64{99: 100}}, History{}, 1},
		{"presence counts generated only", Sampling{PresencePenalty: 1.5}, History{Prompt: []int32{2}, Generated: []int32{1}}, 2},
		{"presence ignores prompt", Sampling{PresencePenalty: 2}, History{Prompt: []int32{1}}, 1},
		// 3-0.6*2 = 1.8 < 2; one occurrence (3-0.6) would still win.
		{"frequency counts occurrences", Sampling{FrequencyPenalty: 0.6}, History{Generated: []int32{1, 1}}, 2},
		{"frequency once", Sampling{FrequencyPenalty: 0.6}, History{Generated: []int32{1}}, 1},
		// 3/1.6 = 1.875 < 2: the prompt counts for repetition.
		{"repetition over prompt", Sampling{RepetitionPenalty: 1.6}, History{Prompt: []int32{1, 1, 1}}, 2},
		{"repetition below one favours", Sampling{RepetitionPenalty: 0.2}, History{Generated: []int32{2}}, 2},
		{"ban", greedy, History{Ban: []int32{1, 2}}, 0},
	} {
		got := s.SampleAfter(logits, c.p, nil, c.h)
		if got.ID != c.want {
			t.Errorf("%s: chose %d, want %d", c.name, got.ID, c.want)
		}
		// The logprob reported is the raw distribution's.
		raw := s.Sample(logits, Sampling{TopLogprobs: 5}, nil)
		for _, a := range raw.Top {
			if a.ID == got.ID && math.Abs(float64(a.Logprob-got.Logprob)) > 1e-6 {
				t.Errorf("%s: logprob %g, raw %g", c.name, got.Logprob, a.Logprob)
			}
		}
		for _, x := range s.count {
			if x != 0 {
				t.Fatalf("%s: count scratch not cleared", c.name)
			}
		}
	}
	if logits[1] != 3 {
		t.Fatal("the caller's logits were changed")
	}
}

// A drawn token respects a ban as the argmax does.
func TestSampleAfterBanWhenDrawing(t *testing.T) {
	logits := []float32{5, 5, 0}
	rng := rand.New(rand.NewPCG(1, 2))
	var s Sampler
	for range 200 {
		if got := s.SampleAfter(logits, Sampling{Temperature: 1.5}, rng, History{Ban: []int32{0}}); got.ID == 0 {
			t.Fatal("drew a banned token")
		}
	}
}
