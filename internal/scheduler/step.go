package scheduler

import (
	"errors"
	"fmt"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/model"
)

// A step is three phases, as vLLM's engine core is schedule → execute →
// update:
//
//	prepare  each running request's own business before it may step: its
//	         mask asked for, its loads looked at, its draft proposed
//	plan     who runs and which rows, under the read and write gates; it
//	         changes nothing, so a plan can be read (and tested) whole
//	forward  one pass of the model over the plan's batch
//	settle   what the logits mean for each member: KV marked written,
//	         prompt chunks handed on, tokens sampled and delivered
//
// What the role changes is decided once, in roleTraits.

// roleTraits are what a role changes in the loop, chosen once (a
// request's from its role, an engine's from its own) so that the loop asks
// a property, not a role. A decode engine runs standalone requests too:
// prompts short enough to compute where they decode (Enqueue).
type roleTraits struct {
	// handsOn: the first sampled token ends the request here, and the
	// worker takes it from Sending on (prefill). Such a request's pages
	// hold its prompt only.
	handsOn bool
	// computesPrompts: prompts are computed here, so their tokens are
	// counted and the prefix cache is read and fed for them (not decode,
	// whose prompts arrive written).
	computesPrompts bool
	// preempts: a request that waited long for a full batch may take a
	// running one's slot (a standalone engine: the engine's trait, not a
	// request's).
	preempts bool
}

func traitsOf(r Role) roleTraits {
	switch r {
	case RolePrefill:
		return roleTraits{handsOn: true, computesPrompts: true}
	case RoleDecode:
		return roleTraits{}
	}
	return roleTraits{computesPrompts: true, preempts: true}
}

// stepPlan is one forward pass: its batch, the requests with rows in it
// (in batch order), and the requests a gate turned away.
type stepPlan struct {
	batch   model.Batch
	members []*Request
	refused []refusal
}

// refusal is a request the read or write gate turned away from a step.
type refusal struct {
	r   *Request
	err error
}

// step runs one forward pass over the running batch. It reports whether a
// forward pass ran.
func (e *Engine) step() bool {
	e.drawDeferred()
	e.drafter.prepare(e)
	e.prepare()
	p := e.plan()
	e.refuse(p.refused)
	if len(p.members) == 0 {
		return false
	}
	e.begin(p)
	forward := e.model.Forward
	if e.onDevice != nil {
		forward = e.model.ForwardDevice
	}
	logits, err := forward(&p.batch, e.pool.KV())
	if err != nil {
		for _, r := range p.members {
			e.remove(r)
			e.fail(r, err)
		}
		return true
	}
	e.settleStep(p, logits)
	e.gauges()
	return true
}

// prepare does each running request's own business before a step may
// take it: a constrained request's next mask is asked for (it is made
// while the forward pass runs), a request whose loads ended takes its
// loaded pages, and a speculating request proposes its draft.
func (e *Engine) prepare() {
	for i := 0; i < len(e.running); i++ {
		r := e.running[i]
		if r.grammar.deferred {
			continue // its last draw waits for its mask
		}
		if constrained(r) {
			e.askMask(r)
			if err := e.maskFailed(r); err != nil {
				e.running = append(e.running[:i], e.running[i+1:]...)
				i--
				e.fail(r, err)
				continue
			}
		}
		if r.loading > 0 {
			if !loadsEnded(e, r) {
				if !r.loadWait {
					r.loadWait = true
					e.m.HiCacheLoadWaits.Inc()
				}
				continue
			}
			e.loaded(r)
		}
		r.spec.speculating = len(r.seq)-r.computed == 1 && e.speculates(r)
		if r.spec.speculating {
			e.propose(r)
		} else {
			r.spec.draft = r.spec.draft[:0]
		}
	}
}

// plan picks who runs this step and which rows: one token for each
// decoding request (with its draft), prompt chunks within ChunkSize, in
// running order. Requests whose pages are loading or whose draw waits for
// its mask sit it out; a request the read or write gate refuses is
// returned among the refused. It changes nothing.
func (e *Engine) plan() *stepPlan {
	ps := e.pool.PageSize()
	budget := e.cfg.ChunkSize
	p := &stepPlan{}
	b := &p.batch
	for _, r := range e.running {
		if r.grammar.deferred || r.loading > 0 {
			continue
		}
		todo := len(r.seq) - r.computed + len(r.spec.draft)
		if todo > 1 && len(r.spec.draft) == 0 { // prefill
			if budget <= 0 {
				continue
			}
			todo = min(todo, budget)
			budget -= todo
		}
		end := r.computed + todo
		// The read gate: every position this step attends over, beyond the
		// ones it writes itself, must be in pages tagged as this request's own
		// and already written.
		if err := readable(e, r); err != nil {
			p.refused = append(p.refused, refusal{r, fmt.Errorf("KV read gate refused the batch: %w", err)})
			continue
		}
		// The write gate: the positions this step stores must fall in the
		// request's own pages, never in a shared page others read.
		if err := writable(e, r, r.computed, end); err != nil {
			p.refused = append(p.refused, refusal{r, fmt.Errorf("KV write gate refused the batch: %w", err)})
			continue
		}
		q0 := len(b.Tokens)
		for pos := r.computed; pos < end; pos++ {
			tok := r.seq[min(pos, len(r.seq)-1)]
			if pos >= len(r.seq) { // a draft token: its KV is rolled back if rejected
				tok = r.spec.draft[pos-len(r.seq)]
			}
			b.Tokens = append(b.Tokens, tok)
			b.Positions = append(b.Positions, int32(pos))
			b.Slots = append(b.Slots, r.pages[pos/ps]*int32(ps)+int32(pos%ps))
		}
		b.Seqs = append(b.Seqs, kernels.AttnSeq{Pages: r.pages, QStart: q0, QLen: todo, KVLen: end})
		// A prompt's own logprobs and a draft's verification need the
		// prediction of every row.
		if (r.Params.PromptLogprobs && r.computed < len(r.Prompt)) || len(r.spec.draft) > 0 {
			if b.Every == nil {
				b.Every = make([]bool, len(b.Seqs)-1, len(e.running))
			}
			b.Every = append(b.Every, true)
		} else if b.Every != nil {
			b.Every = append(b.Every, false)
		}
		p.members = append(p.members, r)
	}
	return p
}

// refuse fails the requests a gate turned away, counting each refusal.
func (e *Engine) refuse(refused []refusal) {
	for _, x := range refused {
		e.m.ReadGateFailures.Inc()
		if errors.Is(x.err, kvpool.ErrLoading) {
			e.m.KVReadBeforeReady.Inc()
		}
		e.remove(x.r)
		e.fail(x.r, x.err)
	}
}

// begin moves the plan's members into the step: a request's first chunk
// starts its prefill, a draft counts a verification step.
func (e *Engine) begin(p *stepPlan) {
	for _, r := range p.members {
		if r.life.State() == StateAdmitted {
			e.must(r, r.life.To(StatePrefilling, ""))
		}
		if r.spec.speculating {
			r.spec.steps++
		}
	}
}

// settleStep takes the step's logits member by member: the positions it
// stored are marked written, a prompt chunk goes to OnChunk, a draft is
// verified, and a request at the end of its sequence has its next token
// sampled (constrained ones under their masks, waited for at most
// maskWait in all) and settled.
//
// With sampling on the device the logits stay there unless a member reads
// them on the host; each draw's row is then checked for NaN by the device
// sampler instead, before its token is used.
func (e *Engine) settleStep(p *stepPlan, logits []float32) {
	b := &p.batch
	vocab := e.model.Config.Vocab
	onHost := e.onDevice == nil
	toHost := func() {
		if !onHost {
			kernels.Host(e.model.Backend(), logits)
			onHost = true
		}
	}
	var maskBy time.Time // how long this step waits for masks
	at := 0              // the first logit row of member i
	for i, r := range p.members {
		s := b.Seqs[i]
		rows := b.Rows(i)
		at += rows
		if i < len(b.Every) && b.Every[i] {
			toHost()
			e.scorePrompt(r, logits[(at-rows)*vocab:at*vocab], s.KVLen-s.QLen)
		}
		if err := e.pool.MarkPositions(r.owner, r.pages, s.KVLen); err != nil {
			e.remove(r)
			e.fail(r, err)
			continue
		}
		if r.generated == 0 && r.traits().computesPrompts {
			e.m.PromptTokens.Add(float64(s.QLen))
		}
		if r.OnChunk != nil {
			r.OnChunk(e.pool.KV(), r.pages, r.computed, s.KVLen)
		}
		if len(r.spec.draft) > 0 {
			toHost()
			e.speculated(r, logits[(at-rows)*vocab:at*vocab], s.KVLen-s.QLen)
			continue
		}
		r.computed = s.KVLen
		if r.computed < len(r.seq) {
			continue // more prompt to prefill
		}
		if r.generated == 0 {
			e.publish(r)
		}
		row := logits[(at-1)*vocab : at*vocab]
		device := e.onDevice != nil && model.CanSample(r.Params.Sampling)
		if !device {
			toHost()
			if hasNaN(row) {
				e.failNaN(r)
				continue
			}
		}
		d := pendingDraw{r: r, row: row, at: at - 1, device: device, h: e.history(r)}
		if constrained(r) {
			if maskBy.IsZero() {
				maskBy = time.Now().Add(maskWait)
			}
			mask, ready, err := e.takeMask(r, maskBy)
			if err != nil {
				e.remove(r)
				e.fail(r, err)
				continue
			}
			if !ready {
				toHost()
				if device && hasNaN(row) {
					e.failNaN(r)
					continue
				}
				e.deferDraw(r, row)
				continue
			}
			d.h.Allow = mask
		}
		e.draws = append(e.draws, d)
	}
	e.sampleDraws(logits)
	for _, d := range e.draws {
		if d.nan {
			e.failNaN(d.r)
			continue
		}
		e.settle(d.r, d.tok)
	}
	clear(e.draws) // the requests and rows are not kept past the step
	e.draws = e.draws[:0]
}

// failNaN fails r, whose logits hold a NaN: poisoned KV reached
// attention (a page that was read had not been written by this request).
// Never sample from it.
func (e *Engine) failNaN(r *Request) {
	e.m.NaNLogits.Inc()
	e.remove(r)
	e.fail(r, errors.New("NaN logits: the request attended over KV it did not write"))
}

// pendingDraw is a token a step still has to sample for r from row (row
// at of the step's logits), on the device or by the host's sampler.
type pendingDraw struct {
	r      *Request
	row    []float32
	at     int
	device bool
	h      model.History
	tok    model.Sampled
	nan    bool // the device found a NaN in row: nothing was sampled
}

// sampleDraws samples the step's pending draws on the backend's threads:
// each draw reads its own row, history and mask and advances its own
// request's generator, so they are independent of each other and of the
// order they run in. One by one on the engine's goroutine they were 4% of
// a 32-sequence decode step's time (2.6 ms at a 32K vocabulary) while the
// backend's other threads waited for the next step. A single draw (one
// sequence decoding) runs on the caller: Parallel does not split one item.
//
// Draws on the device go in one call for the whole step, and only their
// choices (and NaN flags) come back.
func (e *Engine) sampleDraws(logits []float32) {
	dr := &e.devRows
	dr.Reset()
	for _, d := range e.draws {
		if d.device {
			dr.Add(d.at, e.model.Config.Vocab, d.r.Params.Sampling, d.r.rng, d.h)
		}
	}
	if dr.Len() > 0 {
		dr.Sample(e.onDevice, logits, e.model.Config.Vocab)
		j := 0
		for i := range e.draws {
			if d := &e.draws[i]; d.device {
				d.tok, d.nan = dr.Result(j)
				j++
			}
		}
	}
	if dr.Len() == len(e.draws) {
		return
	}
	kernels.Parallel(e.model.Backend(), len(e.draws), func(lo, hi int) {
		s := e.samplers.Get().(*model.Sampler)
		defer e.samplers.Put(s)
		for i := lo; i < hi; i++ {
			if d := &e.draws[i]; !d.device {
				d.tok = s.SampleAfter(d.row, d.r.Params.Sampling, d.r.rng, d.h)
			}
		}
	})
}
