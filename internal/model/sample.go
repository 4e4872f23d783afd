package model

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Sampling holds the parameters that pick the next token.
type Sampling struct {
	Temperature float64 // 0 means greedy
	TopP        float64 // 1 or 0: off
	TopK        int     // 0: off
	MinP        float64 // 0: off
	TopLogprobs int     // how many alternatives to report
	// LogitBias is added to its tokens' logits before the choice.
	LogitBias map[int32]float64
	// PresencePenalty and FrequencyPenalty (OpenAI) weigh the generated
	// tokens; RepetitionPenalty (vLLM) the prompt's and the generated ones,
	// 0 or 1 being off.
	PresencePenalty, FrequencyPenalty, RepetitionPenalty float64
}

// TokenLogprob is one candidate and its log-probability under the model's
// raw distribution (before temperature and truncation, as llama.cpp reports).
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Sampled is the chosen token with its logprob and the top alternatives.
type Sampled struct {
	TokenLogprob
	Top []TokenLogprob
}

// Sampler picks tokens from logits; its scratch space is reused across calls.
type Sampler struct {
	probs []float64
	idx   []int32
	work  []float32 // adjusted logits
	count []uint32  // per-token counts of the history, zero between calls
}

// Sample picks one token from logits (length vocab). rng may be nil when
// the sampling is greedy.
func (s *Sampler) Sample(logits []float32, p Sampling, rng *rand.Rand) Sampled {
	return s.SampleAfter(logits, p, rng, History{})
}

// SampleAfter is Sample for a request with a history: bias, penalties and
// bans shape the choice, while the logprobs reported stay those of the
// model's raw distribution (vLLM's default), so they say what the model
// thought rather than what the request asked for.
func (s *Sampler) SampleAfter(logits []float32, p Sampling, rng *rand.Rand, h History) Sampled {
	pick := logits
	if p.adjusts(h) {
		if cap(s.work) < len(logits) {
			s.work = make([]float32, len(logits))
		}
		pick = s.work[:len(logits)]
		s.adjust(pick, logits, p, h)
	}
	maxv := float32(math.Inf(-1))
	for _, v := range logits {
		maxv = max(maxv, v)
	}
	best := argmax(pick)
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v - maxv))
	}
	logZ := float64(maxv) + math.Log(sum)
	lp := func(id int32) float32 { return float32(float64(logits[id]) - logZ) }

	chosen := best
	if p.Temperature > 0 && p.TopK != 1 && rng != nil {
		chosen = s.draw(pick, p, rng)
	}
	out := Sampled{TokenLogprob: TokenLogprob{chosen, lp(chosen)}}
	if p.TopLogprobs > 0 {
		for _, id := range topK(logits, p.TopLogprobs, &s.idx) {
			out.Top = append(out.Top, TokenLogprob{id, lp(id)})
		}
	}
	return out
}

// Score is the logprob of a given token under logits' raw distribution,
// with the top alternatives: what a prompt token's logprob is, since it
// was not sampled.
func (s *Sampler) Score(logits []float32, id int32, top int) Sampled {
	maxv := float32(math.Inf(-1))
	for _, v := range logits {
		maxv = max(maxv, v)
	}
	var sum float64
	for _, v := range logits {
		sum += math.Exp(float64(v - maxv))
	}
	logZ := float64(maxv) + math.Log(sum)
	out := Sampled{TokenLogprob: TokenLogprob{id, float32(float64(logits[id]) - logZ)}}
	if top > 0 {
		for _, a := range topK(logits, top, &s.idx) {
			out.Top = append(out.Top, TokenLogprob{a, float32(float64(logits[a]) - logZ)})
		}
	}
	return out
}

func argmax(v []float32) int32 {
	maxv := float32(math.Inf(-1))
	best := int32(0)
	for i, x := range v {
		if x > maxv {
			maxv, best = x, int32(i)
		}
	}
	return best
}

func (s *Sampler) draw(logits []float32, p Sampling, rng *rand.Rand) int32 {
	// Candidates: the top-k (or all), sorted by logit, highest first.
	k := len(logits)
	if p.TopK > 0 && p.TopK < k {
		k = p.TopK
	}
	cand := topK(logits, k, &s.idx)
	if cap(s.probs) < len(cand) {
		s.probs = make([]float64, len(cand))
	}
	probs := s.probs[:len(cand)]
	top := float64(logits[cand[0]])
	var sum float64
	for i, id := range cand {
		probs[i] = math.Exp((float64(logits[id]) - top) / p.Temperature)
		sum += probs[i]
	}
	n := len(cand)
	if p.MinP > 0 { // keep tokens with p >= min_p * p_max; p_max is probs[0]/sum
		for n > 1 && probs[n-1] < p.MinP*probs[0] {
			sum -= probs[n-1]
			n--
		}
	}
	if p.TopP > 0 && p.TopP < 1 {
		var acc float64
		for i := 0; i < n; i++ {
			acc += probs[i] / sum
			if acc >= p.TopP {
				n = i + 1
				break
			}
		}
		sum = 0
		for i := 0; i < n; i++ {
			sum += probs[i]
		}
	}
	r := rng.Float64() * sum
	for i := 0; i < n; i++ {
		r -= probs[i]
		if r <= 0 {
			return cand[i]
		}
	}
	return cand[n-1]
}

// topK returns the ids of the k largest logits, largest first (ties: lower id first).
func topK(logits []float32, k int, buf *[]int32) []int32 {
	if k > len(logits) {
		k = len(logits)
	}
	idx := (*buf)[:0]
	if k*8 < len(logits) {
		// Partial selection: keep a sorted window of k; cheap for small k.
		for i, v := range logits {
			if len(idx) == k && v <= logits[idx[k-1]] {
				continue
			}
			pos := sort.Search(len(idx), func(j int) bool { return logits[idx[j]] < v })
			if len(idx) < k {
				idx = append(idx, 0)
			}
			copy(idx[pos+1:], idx[pos:len(idx)-1])
			idx[pos] = int32(i)
		}
	} else {
		for i := range logits {
			idx = append(idx, int32(i))
		}
		sort.SliceStable(idx, func(a, b int) bool { return logits[idx[a]] > logits[idx[b]] })
		idx = idx[:k]
	}
	*buf = idx
	return append([]int32(nil), idx...)
}
