package model

import (
	"math"
	"math/rand/v2"
	"sort"

	"github.com/batonlm/baton/internal/model/expsum"
	"github.com/batonlm/baton/internal/request"
)

// Sampling holds the parameters that pick the next token.
type Sampling = request.Sampling

// SamplingEps is the smallest temperature that samples; below it a
// request is greedy.
const SamplingEps = request.SamplingEps

// TokenLogprob is one candidate and its log-probability under the model's
// raw distribution (before temperature and truncation, as llama.cpp reports).
type TokenLogprob = request.TokenLogprob

// Sampled is the chosen token with its logprob and the top alternatives.
type Sampled = request.Sampled

// Sampler picks tokens from logits; its scratch space is reused across calls.
type Sampler struct {
	probs []float64
	idx   []int32
	keys  []uint64
	work  []float32 // adjusted logits
	count tokenCounts
	iota  []int32 // 0, 1, 2, ...: the candidates of distAll
	kept  []int32 // distAll's candidates after min-p
	// The maximum and the sum of exponentials of the last distAll, kept so
	// that SampleAfter can reuse them as the logprobs' normaliser; allSum
	// is 0 when the last dist was not a distAll.
	allTop, allSum float64
}

// Sample picks one token from logits (length vocab). rng may be nil when
// the sampling is greedy.
func (s *Sampler) Sample(logits []float32, p Sampling, rng *rand.Rand) Sampled {
	return s.SampleAfter(logits, p, rng, History{})
}

// adjusted is logits after the request's bias, penalties and bans (in the
// sampler's scratch), or logits itself when those change nothing.
func (s *Sampler) adjusted(logits []float32, p Sampling, h History) []float32 {
	if !adjusts(p, h) {
		return logits
	}
	if cap(s.work) < len(logits) {
		s.work = make([]float32, len(logits))
	}
	w := s.work[:len(logits)]
	s.adjust(w, logits, p, h)
	return w
}

// SampleAfter is Sample for a request with a history: bias, penalties and
// bans shape the choice, while the logprobs reported stay those of the
// model's raw distribution (vLLM's default), so they say what the model
// thought rather than what the request asked for.
func (s *Sampler) SampleAfter(logits []float32, p Sampling, rng *rand.Rand, h History) Sampled {
	pick := s.adjusted(logits, p, h)
	var chosen int32
	haveZ, logZ := false, 0.0
	if p.Draws() && rng != nil {
		chosen = s.draw(pick, p, rng)
		// A draw over the whole vocabulary at temperature 1 from the raw
		// logits summed the very exponentials that logZ needs.
		if s.allSum > 0 && p.Temperature == 1 && !adjusts(p, h) {
			haveZ, logZ = true, s.allTop+math.Log(s.allSum)
		}
	} else {
		chosen = argmax(pick)
	}
	if !haveZ {
		logZ = logSumExp(logits)
	}
	lp := func(id int32) float32 { return float32(float64(logits[id]) - logZ) }
	out := Sampled{TokenLogprob: TokenLogprob{ID: chosen, Logprob: lp(chosen)}}
	if p.TopLogprobs > 0 {
		for _, id := range s.topK(logits, p.TopLogprobs) {
			out.Top = append(out.Top, TokenLogprob{ID: id, Logprob: lp(id)})
		}
	}
	return out
}

// logSumExp is log Σ exp(v) over logits.
func logSumExp(logits []float32) float64 {
	top := float64(expsum.Max(logits))
	return top + math.Log(expsum.Sum(nil, logits, top, 1))
}

// Score is the logprob of a given token under logits' raw distribution,
// with the top alternatives: what a prompt token's logprob is, since it
// was not sampled.
func (s *Sampler) Score(logits []float32, id int32, top int) Sampled {
	logZ := logSumExp(logits)
	out := Sampled{TokenLogprob: TokenLogprob{ID: id, Logprob: float32(float64(logits[id]) - logZ)}}
	if top > 0 {
		for _, a := range s.topK(logits, top) {
			out.Top = append(out.Top, TokenLogprob{ID: a, Logprob: float32(float64(logits[a]) - logZ)})
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
	cand, probs, sum := s.dist(logits, p)
	return pick(cand, probs, sum, -1, rng)
}

// pick draws from the candidates in proportion to probs (summing to sum),
// leaving out index skip (-1: none).
func pick(cand []int32, probs []float64, sum float64, skip int, rng *rand.Rand) int32 {
	r := rng.Float64() * sum
	last := -1
	for i := range cand {
		if i == skip {
			continue
		}
		last = i
		r -= probs[i]
		if r <= 0 {
			return cand[i]
		}
	}
	return cand[last]
}

// Verify judges a draft token (speculative decoding) against the target's
// logits at its position, under the same rules as SampleAfter. Greedy: the
// draft is accepted when it is the argmax, and the argmax is returned
// either way. Sampling: a point-mass draft d is accepted with probability
// q(d) of the target distribution q; on rejection the token is drawn from
// q with d removed and renormalised. Either way the returned token is
// distributed as q, so speculation leaves the output distribution as it
// was (it takes a different number of draws from rng than SampleAfter).
func (s *Sampler) Verify(logits []float32, p Sampling, rng *rand.Rand, h History, draft int32) (Sampled, bool) {
	if !p.Draws() || rng == nil {
		out := s.SampleAfter(logits, p, nil, h)
		return out, out.ID == draft
	}
	choice := s.adjusted(logits, p, h)
	cand, probs, sum := s.dist(choice, p)
	at := -1
	for i, id := range cand {
		if id == draft {
			at = i
			break
		}
	}
	var chosen int32
	accepted := false
	switch {
	case at >= 0 && (len(cand) == 1 || rng.Float64()*sum < probs[at]):
		chosen, accepted = draft, true
	case at >= 0:
		chosen = pick(cand, probs, sum-probs[at], at, rng)
	default:
		chosen = pick(cand, probs, sum, -1, rng)
	}
	return s.Score(logits, chosen, p.TopLogprobs), accepted
}

// dist is the target distribution of a draw: the candidates left after
// top-k, min-p and top-p, highest logit first, their unnormalised
// probabilities at the temperature, and those probabilities' sum.
func (s *Sampler) dist(logits []float32, p Sampling) ([]int32, []float64, float64) {
	s.allSum = 0
	k := len(logits)
	if p.TopK > 0 && p.TopK < k {
		k = p.TopK
	}
	if k == len(logits) && !(p.TopP > 0 && p.TopP < 1) {
		return s.distAll(logits, p)
	}
	// Candidates: the top-k, sorted by logit, highest first (top-p needs
	// that order).
	cand := s.topK(logits, k)
	if cap(s.probs) < len(cand) {
		s.probs = make([]float64, len(cand))
	}
	probs := s.probs[:len(cand)]
	top := float64(logits[cand[0]])
	var sum float64
	for i, id := range cand {
		probs[i] = expsum.ExpNeg((float64(logits[id]) - top) / p.Temperature)
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
	return cand[:n], probs[:n], sum
}

// distAll is dist without top-k and top-p: every token is a candidate,
// taken in id order rather than sorted. The order of the candidates changes
// which token a given random number picks, not the distribution, and
// leaving the vocabulary unsorted saves a sort of it per sampled token (at
// a 32K vocabulary that and a second pass of exponentials were a sixth of
// a 32-sequence decode step).
func (s *Sampler) distAll(logits []float32, p Sampling) ([]int32, []float64, float64) {
	n := len(logits)
	if cap(s.probs) < n {
		s.probs = make([]float64, n)
	}
	if len(s.iota) < n {
		s.iota = make([]int32, n)
		for i := range s.iota {
			s.iota[i] = int32(i)
		}
		s.kept = make([]int32, n)
	}
	top, inv := float64(expsum.Max(logits)), 1/p.Temperature
	probs := s.probs[:n]
	sum := expsum.Sum(probs, logits, top, inv)
	s.allTop, s.allSum = top, sum
	if p.MinP <= 0 {
		return s.iota[:n], probs, sum
	}
	// Keep tokens with p >= min_p * p_max; p_max is exp(0)/sum.
	m := 0
	sum = 0
	for i, e := range probs {
		if e >= p.MinP {
			probs[m] = e
			s.kept[m] = int32(i)
			m++
			sum += e
		}
	}
	return s.kept[:m], probs[:m], sum
}

// topK returns the ids of the k largest logits, largest first (ties: lower
// id first), in s.idx: valid until the next call.
func (s *Sampler) topK(logits []float32, k int) []int32 {
	k = min(k, len(logits))
	idx := s.idx[:0]
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
		s.idx = idx
		return idx
	}
	// The whole vocabulary in order, for every sampled token of every
	// sequence of a batch: a stable radix sort on the logits' bits (four
	// passes of 8 bits) instead of a comparison sort, which cost more than
	// the forward pass at a vocabulary of 32000 and 32 sequences. Ids go in
	// ascending, and a stable sort keeps ties that way.
	n := len(logits)
	if cap(s.keys) < 2*n {
		s.keys = make([]uint64, 2*n)
	}
	a, b := s.keys[:n], s.keys[n:2*n]
	for i, v := range logits {
		a[i] = uint64(descKey(v))<<32 | uint64(i)
	}
	var count [256]int
	for shift := uint(32); shift < 64; shift += 8 {
		clear(count[:])
		for _, x := range a {
			count[x>>shift&255]++
		}
		sum := 0
		for i, c := range count {
			count[i] = sum
			sum += c
		}
		for _, x := range a {
			d := x >> shift & 255
			b[count[d]] = x
			count[d]++
		}
		a, b = b, a
	}
	for _, x := range a[:k] {
		idx = append(idx, int32(uint32(x)))
	}
	s.idx = idx
	return idx
}

// descKey maps a float to a key whose unsigned order is the float's
// descending order (equal floats, -0 and +0 included, get equal keys).
func descKey(f float32) uint32 {
	if f == 0 {
		f = 0
	}
	b := math.Float32bits(f)
	if b&0x80000000 != 0 {
		b = ^b
	} else {
		b |= 0x80000000
	}
	return ^b
}
