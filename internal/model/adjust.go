package model

import "math"

// History is what a request has seen, for the samplers that depend on it:
// penalties look at the prompt and the generated tokens, and Ban lists
// tokens that may not be chosen now (the end of generation before
// min_tokens is reached).
type History struct {
	Prompt, Generated []int32
	Ban               []int32
	// Allow, when set, is a bitset of the tokens a constraint (a grammar)
	// lets come next, bit id%64 of word id/64; every other token is out.
	Allow []uint64
}

// adjusts reports whether p or h changes the logits before the choice.
func adjusts(p Sampling, h History) bool {
	return len(p.LogitBias) > 0 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 ||
		(p.RepetitionPenalty > 0 && p.RepetitionPenalty != 1) || len(h.Ban) > 0 || h.Allow != nil
}

// adjust writes into dst the logits the choice is made from: logit bias
// first, then the penalties (as vLLM orders them), then the constraint's
// mask and the bans.
func (s *Sampler) adjust(dst, logits []float32, p Sampling, h History) {
	copy(dst, logits)
	vocab := int32(len(dst))
	for id, b := range p.LogitBias {
		if id >= 0 && id < vocab {
			dst[id] += float32(b)
		}
	}
	if rp := p.RepetitionPenalty; rp > 0 && rp != 1 {
		// vLLM/SGLang: every token of prompt or output is penalised once,
		// dividing a positive logit and multiplying a negative one so that
		// the penalty always lowers its chance.
		s.count.each(vocab, h.Prompt, h.Generated, func(id int32, _ uint32) {
			if dst[id] > 0 {
				dst[id] /= float32(rp)
			} else {
				dst[id] *= float32(rp)
			}
		})
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		// OpenAI: only what was generated counts, once for presence and per
		// occurrence for frequency.
		s.count.each(vocab, nil, h.Generated, func(id int32, n uint32) {
			dst[id] -= float32(p.PresencePenalty + p.FrequencyPenalty*float64(n))
		})
	}
	inf := float32(math.Inf(-1))
	if h.Allow != nil {
		// Last, so that no bias or penalty can bring a token back.
		for id := range dst {
			if w := id >> 6; w >= len(h.Allow) || h.Allow[w]&(1<<(id&63)) == 0 {
				dst[id] = inf
			}
		}
	}
	for _, id := range h.Ban {
		if id >= 0 && id < vocab {
			dst[id] = inf
		}
	}
}

// tokenCounts is a vocabulary-sized count of a history's tokens, zero
// between uses.
type tokenCounts []uint32

// each calls f once per distinct token of a and b with its count in them.
// The counts are cleared again through the same tokens, so a step costs
// the history's length, not the vocabulary's.
func (c *tokenCounts) each(vocab int32, a, b []int32, f func(id int32, n uint32)) {
	if len(*c) < int(vocab) {
		*c = make(tokenCounts, vocab)
	}
	count := *c
	for _, part := range [][]int32{a, b} {
		for _, id := range part {
			if id >= 0 && id < vocab {
				count[id]++
			}
		}
	}
	for _, part := range [][]int32{a, b} {
		for _, id := range part {
			if id >= 0 && id < vocab && count[id] > 0 {
				f(id, count[id])
				count[id] = 0
			}
		}
	}
}
