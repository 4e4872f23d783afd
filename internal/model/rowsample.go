package model

import (
	"math/rand/v2"

	"github.com/batonlm/baton/internal/kernels"
)

// DeviceRows samples a step's rows on a backend that samples where the
// logits are (kernels.RowSampler), under SampleAfter's rules: Add turns a
// request's parameters and history into a row's edits and takes its
// random number from its generator exactly as SampleAfter would (one
// Float64 for a draw, none for a greedy choice), so a seed gives the same
// stream on either backend whatever the batch. Its buffers are reused from
// step to step; it is not safe for concurrent use.
type DeviceRows struct {
	rows  []kernels.SampleRow
	out   []kernels.SampleResult
	edits []kernels.LogitEdit
	slot  []int32 // per token: 1 + its edit's index in the row, 0: none
	count tokenCounts
}

// CanSample says whether the device takes a request sampled under p;
// one it does not is sampled on the host.
func CanSample(p Sampling) bool { return p.TopLogprobs <= kernels.MaxTopLogprobs }

// Reset empties the rows for a new step.
func (d *DeviceRows) Reset() {
	clear(d.rows) // the histories are not kept past the step
	d.rows, d.edits = d.rows[:0], d.edits[:0]
}

// Len is how many rows were added since Reset.
func (d *DeviceRows) Len() int { return len(d.rows) }

// Add queues a choice from logit row row for a request sampled under p
// with history h; rng may be nil when the sampling is greedy.
func (d *DeviceRows) Add(row, vocab int, p Sampling, rng *rand.Rand, h History) {
	r := kernels.SampleRow{Row: row, Allow: h.Allow, Ban: h.Ban, TopLogprobs: p.TopLogprobs}
	if p.Draws() && rng != nil {
		r.Draw, r.U = true, rng.Float64()
		r.Temperature, r.TopK, r.TopP, r.MinP = p.Temperature, p.TopK, p.TopP, p.MinP
	}
	if adjusts(p, h) {
		r.Edits, r.Repetition = d.edit(vocab, p, h)
	}
	d.rows = append(d.rows, r)
}

// edit is adjust's bias and penalties as one edit per token they touch.
func (d *DeviceRows) edit(vocab int, p Sampling, h History) ([]kernels.LogitEdit, float32) {
	if len(d.slot) < vocab {
		d.slot = make([]int32, vocab)
	}
	start := len(d.edits)
	at := func(id int32) *kernels.LogitEdit {
		if d.slot[id] == 0 {
			d.edits = append(d.edits, kernels.LogitEdit{ID: id})
			d.slot[id] = int32(len(d.edits) - start)
		}
		return &d.edits[start+int(d.slot[id])-1]
	}
	for id, b := range p.LogitBias {
		if id >= 0 && int(id) < vocab {
			at(id).Bias = float32(b)
		}
	}
	// The tokens adjust penalises, counted as it counts them.
	var rep float32
	if rp := p.RepetitionPenalty; rp > 0 && rp != 1 {
		rep = float32(rp)
		d.count.each(int32(vocab), h.Prompt, h.Generated, func(id int32, _ uint32) { at(id).Repeat = true })
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		d.count.each(int32(vocab), nil, h.Generated, func(id int32, n uint32) {
			at(id).Penalty = float32(p.PresencePenalty + p.FrequencyPenalty*float64(n))
		})
	}
	edits := d.edits[start:]
	for _, e := range edits {
		d.slot[e.ID] = 0
	}
	return edits, rep
}

// Sample runs the rows added since Reset on rs over logits (rows of vocab).
func (d *DeviceRows) Sample(rs kernels.RowSampler, logits []float32, vocab int) {
	if cap(d.out) < len(d.rows) {
		d.out = make([]kernels.SampleResult, len(d.rows))
	}
	d.out = d.out[:len(d.rows)]
	rs.SampleRows(logits, vocab, d.rows, d.out)
}

// Result is row i's choice, or nan when its raw logits hold a NaN (then
// nothing was chosen).
func (d *DeviceRows) Result(i int) (s Sampled, nan bool) {
	o := d.out[i]
	if o.NaN {
		return Sampled{}, true
	}
	s.ID, s.Logprob = o.ID, o.Logprob
	for _, t := range o.Top {
		s.Top = append(s.Top, TokenLogprob(t))
	}
	return s, false
}
