package scheduler

import (
	"fmt"
	"log/slog"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/model"
)

// DraftModel is the second model of --speculative-algorithm draft: a
// smaller model with the target's tokenizer, with a KV pool of its own
// (its own page layout: layers, heads and head dim are the draft's).
// Requests take pages of Pool for the draft's KV the first time they
// draft and give them back with their own pages.
type DraftModel struct {
	Model *model.Model
	Pool  *kvpool.Pool
}

// CheckDraft refuses a draft model whose tokens do not mean the target's:
// its vocabulary must be the target's size (the caller compares the
// tokenizers themselves, which this package does not hold).
func CheckDraft(target, draft *model.Config) error {
	if target.Vocab != draft.Vocab {
		return fmt.Errorf("the draft model's vocabulary has %d tokens, the target's %d: a draft must share the target's tokenizer", draft.Vocab, target.Vocab)
	}
	return nil
}

// A drafter proposes the tokens a speculating request verifies.
type drafter interface {
	// prepare runs before a step's batch is built, once, so that a drafter
	// that runs a model can run it over every drafting request together.
	prepare(e *Engine)
	// draft appends to dst up to k tokens proposed for r.
	draft(dst []int32, r *Request, k int) []int32
	// settle is told that r keeps the KV of its first keep positions and
	// the rest of what this step proposed was rejected.
	settle(r *Request, keep int) error
	// drop gives back what the drafter holds for r.
	drop(r *Request)
}

func newDrafter(c SpecConfig) drafter {
	if c.Algorithm == "draft" {
		if c.Draft == nil {
			panic("scheduler: --speculative-algorithm draft without a draft model")
		}
		return &modelDrafter{dm: c.Draft, seqs: map[*Request]*draftSeq{}}
	}
	return ngramDrafter{}
}

// ngramDrafter drafts from the request's own sequence and holds nothing.
type ngramDrafter struct{}

func (ngramDrafter) prepare(*Engine) {}
func (ngramDrafter) draft(dst []int32, r *Request, k int) []int32 {
	dst, at, period := ngramMatch(dst, r.seq, k)
	r.spec.loopDraft = period > 0 && period <= ngramLoopPeriod && at >= len(r.Prompt)
	return dst
}

// ngramLoopPeriod is the longest period at which an n-gram draft that
// copies the request's own output counts as a loop's: attention pulled
// into a loop by corrupted KV repeats what the model just wrote, a token
// or a phrase at a time, while a model echoing its input (an edit, a
// quotation) copies the prompt, or its own output at the period of the
// text it echoes.
const ngramLoopPeriod = 32

func (ngramDrafter) settle(*Request, int) error { return nil }
func (ngramDrafter) drop(*Request)              {}

// draftSeq is a request's state in the draft model.
type draftSeq struct {
	owner kvpool.Owner
	pages []int32
	// computed is how many leading positions of the request's sequence
	// have their KV in the draft's pages. The sequence only grows and its
	// past never changes, so KV below computed stays right; what the
	// draft has not seen (tokens emitted without a draft, the target's
	// own token after a verify) is caught up in the next draft's first
	// forward pass.
	computed int
	// tokens is this step's draft, proposed by prepare.
	tokens []int32
	k      int    // how many tokens this step may propose
	round  uint64 // the prepare that proposed tokens
}

// modelDrafter runs the draft model: greedy, autoregressive, batched over
// the drafting requests. A greedy draft is a point mass, which is what
// Sampler.Verify's rejection rule takes, so the target's distribution is
// kept whatever the draft proposes.
type modelDrafter struct {
	dm    *DraftModel
	seqs  map[*Request]*draftSeq
	batch model.Batch
	live  []draftRow
	round uint64 // prepare calls so far
	// failures counts draft passes that failed (tests require none).
	failures int
}

// draftRow is one request's place in a draft forward pass: positions
// [d.computed, end) of its sequence and draft go in.
type draftRow struct {
	r   *Request
	d   *draftSeq
	end int
}

func (m *modelDrafter) draft(dst []int32, r *Request, k int) []int32 {
	d := m.seqs[r]
	if d == nil || d.round != m.round {
		return dst // not prepared this step: nothing it proposed still holds
	}
	return append(dst, d.tokens[:min(k, len(d.tokens))]...)
}

// prepare proposes the step's drafts. The first pass catches each request
// up (its unseen tokens, the prompt the first time, within the chunk
// budget) and ends with the logits of its last token; each further pass
// feeds every request its last draft token. A request that cannot get
// pages, or whose catch-up does not fit this step, drafts nothing now and
// is verified one token at a time, which changes nothing it emits.
func (m *modelDrafter) prepare(e *Engine) {
	m.live = m.live[:0]
	m.round++
	budget := e.cfg.ChunkSize
	for _, r := range e.running {
		if len(r.seq)-r.computed != 1 || !e.speculates(r) {
			continue
		}
		k := e.draftBudget(r)
		if k <= 0 {
			continue
		}
		d := m.seqs[r]
		if d == nil {
			p := m.dm.Pool
			a, err := p.Alloc(r.room, p.PagesFor(e.maxSeqLen(r)))
			if err != nil {
				continue // the draft pool is full: plain decoding for now
			}
			d = &draftSeq{owner: a.Owner, pages: a.Pages}
			m.seqs[r] = d
		}
		d.tokens, d.k, d.round = d.tokens[:0], k, m.round
		if budget <= 0 {
			continue
		}
		// A catch-up over the budget is cut to it and proposes nothing
		// this step (its pass ends before the request's last token).
		end := min(len(r.seq), d.computed+budget)
		budget -= end - d.computed
		m.live = append(m.live, draftRow{r: r, d: d, end: end})
	}
	vocab := m.dm.Model.Config.Vocab
	ps := m.dm.Pool.PageSize()
	b := &m.batch
	for pass := 0; len(m.live) > 0; pass++ {
		b.Tokens, b.Positions, b.Slots, b.Seqs = b.Tokens[:0], b.Positions[:0], b.Slots[:0], b.Seqs[:0]
		for i := range m.live {
			x := &m.live[i]
			if pass > 0 {
				x.end = len(x.r.seq) + len(x.d.tokens) // through the last draft token
			}
			q0 := len(b.Tokens)
			for p := x.d.computed; p < x.end; p++ {
				tok := int32(0)
				if p < len(x.r.seq) {
					tok = x.r.seq[p]
				} else {
					tok = x.d.tokens[p-len(x.r.seq)]
				}
				b.Tokens = append(b.Tokens, tok)
				b.Positions = append(b.Positions, int32(p))
				b.Slots = append(b.Slots, x.d.pages[p/ps]*int32(ps)+int32(p%ps))
			}
			b.Seqs = append(b.Seqs, kernels.AttnSeq{Pages: x.d.pages, QStart: q0, QLen: x.end - x.d.computed, KVLen: x.end})
		}
		logits, err := m.forward(b)
		if err != nil {
			// The draft is an optimisation: a failed pass leaves this
			// step's requests to plain decoding, and their draft KV to be
			// computed again.
			slog.Error("draft model forward pass failed; decoding without drafts this step", "err", err)
			m.failures++
			for _, x := range m.live {
				x.d.tokens = x.d.tokens[:0]
				x.d.computed = 0
				_ = m.dm.Pool.Rollback(x.d.owner, x.d.pages, 0)
			}
			m.live = m.live[:0]
			return
		}
		keep := m.live[:0]
		for i, x := range m.live {
			x.d.computed = x.end
			if x.end < len(x.r.seq) {
				continue // still catching up
			}
			x.d.tokens = append(x.d.tokens, argmax(logits[i*vocab:(i+1)*vocab]))
			if len(x.d.tokens) < x.d.k {
				keep = append(keep, x)
			}
		}
		m.live = keep
	}
}

// forward runs one draft pass: the read gate over the draft's own pages,
// the model, and the written marks.
func (m *modelDrafter) forward(b *model.Batch) ([]float32, error) {
	p := m.dm.Pool
	for _, x := range m.live {
		if err := p.CheckReadable(x.d.owner, x.d.pages, x.d.computed); err != nil {
			return nil, fmt.Errorf("draft KV read gate: %w", err)
		}
	}
	logits, err := m.dm.Model.Forward(b, p.KV())
	if err != nil {
		return nil, err
	}
	for _, x := range m.live {
		if err := p.MarkPositions(x.d.owner, x.d.pages, x.end); err != nil {
			return nil, err
		}
	}
	return logits, nil
}

// settle rolls the draft's KV back to what the target kept: the draft
// wrote KV for its own tokens but the last, and those past the first
// rejected one are not r's.
func (m *modelDrafter) settle(r *Request, keep int) error {
	d := m.seqs[r]
	if d == nil || d.computed <= keep {
		return nil
	}
	d.computed = keep
	if err := m.dm.Pool.Rollback(d.owner, d.pages, keep); err != nil {
		return fmt.Errorf("rolling back rejected draft-model KV: %w", err)
	}
	return nil
}

func (m *modelDrafter) drop(r *Request) {
	d := m.seqs[r]
	if d == nil {
		return
	}
	delete(m.seqs, r)
	if err := m.dm.Pool.Release(d.owner, d.pages); err != nil {
		slog.Error("draft KV pool refused a release", "request_id", r.ID, "err", err)
	}
}

// DraftPages is how many pages of the draft pool requests hold (tests).
func (e *Engine) DraftPages() int {
	if m, ok := e.drafter.(*modelDrafter); ok {
		return m.dm.Pool.NumPages() - m.dm.Pool.Free()
	}
	return 0
}

func argmax(row []float32) int32 {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return int32(best)
}
