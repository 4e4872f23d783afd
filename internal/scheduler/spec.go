package scheduler

import (
	"errors"
	"fmt"

	"github.com/batonlm/baton/internal/model"
)

// SpecConfig turns on speculative decoding. Algorithm "ngram" drafts from
// the request's own prompt and output (no second model): when the last
// few tokens occurred before, the tokens that followed them then are
// proposed, and the target model verifies them in the same batched
// forward pass that computes the request's next token.
//
// Algorithm "draft" drafts with a second, smaller model (Draft) that
// shares the target's tokenizer (spec_draft.go).
type SpecConfig struct {
	// Algorithm is "" (off), "ngram" or "draft".
	Algorithm string
	// DraftTokens caps the tokens proposed per step (SGLang's
	// --speculative-num-draft-tokens); Steps caps the length of the chain
	// (--speculative-num-steps). A lookup draft is one chain, so the
	// tokens proposed per step are at most the smaller of the two.
	DraftTokens, Steps int
	// Draft is the draft model of Algorithm "draft".
	Draft *DraftModel
	// DisableBatch, when positive, turns drafting off for a step whose
	// running batch holds at least this many requests: a large batch is
	// compute-bound, and verifying drafts there costs more than it saves.
	DisableBatch int
}

// SpecAlgorithms are the drafting algorithms the engine has.
var SpecAlgorithms = []string{"ngram", "draft"}

// Lookup bounds of the n-gram draft: the longest suffix tried first, the
// shortest that still counts as a match (a single token repeats too often
// to predict much), and how far back the lookup searches.
const (
	ngramMax    = 4
	ngramMin    = 2
	ngramWindow = 4096
)

// draftLen is the most tokens the engine proposes per step (0: off).
func (c SpecConfig) draftLen() int {
	if c.Algorithm == "" {
		return 0
	}
	return min(c.DraftTokens, c.Steps)
}

// Validate refuses settings the engine cannot run.
func (c SpecConfig) Validate() error {
	switch c.Algorithm {
	case "":
		return nil
	case "ngram", "draft":
	default:
		return fmt.Errorf("speculative algorithm %q is not available (have: ngram, draft)", c.Algorithm)
	}
	if c.DraftTokens < 1 || c.Steps < 1 {
		return errors.New("speculative decoding needs at least one draft token and one step")
	}
	return nil
}

// specState is a request's speculation, kept by the engine loop.
type specState struct {
	draft    []int32 // proposed this step, verified after the forward pass
	drafted  int     // draft tokens proposed over the request's life
	accepted int     // of them, accepted
	steps    int     // verifying steps (each emits accepted+1 tokens)
	// speculating says r speculates this step (prepare): its draft, if
	// any, is verified, and the step counts as a verifying one.
	speculating bool
	// loopDraft says this step's n-gram draft copies the request's own
	// output from at most ngramLoopPeriod tokens back; loopAccepted
	// counts the accepted tokens of such drafts (the spec guard's loop
	// rule, see SpecGuard).
	loopDraft    bool
	loopAccepted int
	// next is the draft length of the next step (0: the configured one):
	// one more than the last step accepted, so a request whose drafts
	// keep failing verifies one token a step instead of paying for k.
	next int
}

// speculates says whether r drafts this step. Requests whose next tokens
// depend on more than the logits of their own row are left out, so that
// speculation never changes what they get: a constraint (its mask follows
// each token), penalties (they count each token), and a request still
// under min_tokens (its bans lift at a token count). Logprobs are kept:
// the verifying rows are the target's own.
func (e *Engine) speculates(r *Request) bool {
	s := r.Params.Sampling
	if n := e.cfg.Spec.DisableBatch; n > 0 && len(e.running) >= n {
		return false
	}
	return e.cfg.Spec.draftLen() > 0 && r.life.State() == StateDecoding &&
		!constrained(r) && s.PresencePenalty == 0 && s.FrequencyPenalty == 0 &&
		(s.RepetitionPenalty == 0 || s.RepetitionPenalty == 1) && r.generated >= r.Params.MinTokens
}

// propose fills r.spec.draft with up to the draft length of tokens from an
// n-gram match in r's own sequence, within what r may still generate:
// every accepted draft is followed by one token of the target's, and none
// may pass max_tokens or the pages r holds.
func (e *Engine) propose(r *Request) {
	r.spec.draft = r.spec.draft[:0]
	if k := e.draftBudget(r); k > 0 {
		r.spec.draft = e.drafter.draft(r.spec.draft, r, k)
	}
}

// draftBudget is how many tokens r may have proposed this step.
func (e *Engine) draftBudget(r *Request) int {
	k := e.cfg.Spec.draftLen()
	if r.spec.next > 0 {
		k = min(k, r.spec.next)
	}
	return min(k, e.maxSeqLen(r)-len(r.seq)-1)
}

// ngramMatch appends to dst up to k tokens that followed the latest
// earlier occurrence of seq's longest repeated suffix (ngramMax down to
// ngramMin tokens), and says where the draft came from: at is where the
// matched occurrence starts in seq, period how far it lies before the
// suffix (0: no match).
func ngramMatch(dst, seq []int32, k int) (_ []int32, at, period int) {
	lo := max(0, len(seq)-ngramWindow)
	for n := min(ngramMax, len(seq)-1); n >= ngramMin; n-- {
		suffix := seq[len(seq)-n:]
	search:
		for i := len(seq) - n - 1; i >= lo; i-- {
			for j, t := range suffix {
				if seq[i+j] != t {
					continue search
				}
			}
			return append(dst, seq[i+n:min(i+n+k, len(seq))]...), i, len(seq) - n - i
		}
	}
	return dst, 0, 0
}

// verify judges r's draft against the rows the forward pass gave for it
// (rows[j] follows position c0+j, where c0 is the position of r's last
// token), and returns the tokens r emits: the accepted drafts and the
// target's own next token, with how many drafts were accepted. It stops at
// a token that ends r, so nothing after it is emitted.
func (e *Engine) verify(r *Request, rows []float32) (out []model.Sampled, accepted int, err error) {
	vocab := e.model.Config.Vocab
	h := e.history(r)
	for j := 0; j <= len(r.spec.draft); j++ {
		row := rows[j*vocab : (j+1)*vocab]
		if hasNaN(row) {
			e.m.NaNLogits.Inc()
			return nil, 0, errors.New("NaN logits: the request attended over KV it did not write")
		}
		if j == len(r.spec.draft) {
			return append(out, e.sampler.SampleAfter(row, r.Params.Sampling, r.rng, h)), accepted, nil
		}
		tok, ok := e.sampler.Verify(row, r.Params.Sampling, r.rng, h, r.spec.draft[j])
		out = append(out, tok)
		if !ok {
			return out, accepted, nil
		}
		accepted++
		if e.ends(r, tok.ID) {
			return out, accepted, nil
		}
	}
	return out, accepted, nil
}

// ends says whether tok finishes r by itself (end of generation or a stop
// token); speculating requests are past min_tokens.
func (e *Engine) ends(r *Request, tok int32) bool {
	return (!r.Params.IgnoreEOS && e.cfg.IsEOG(tok)) || containsToken(r.Params.StopTokenIDs, tok)
}

// specObserve records a finished request's speculation figures.
func (e *Engine) specObserve(r *Request) {
	s := r.spec
	if s.steps == 0 || s.drafted == 0 {
		return
	}
	e.m.SpecAcceptLength.Observe(float64(s.accepted+s.steps) / float64(s.steps))
	e.m.SpecAcceptRate.Observe(float64(s.accepted) / float64(s.drafted))
}

// speculated finishes a step in which r verified a draft: rows are its
// logits, c0 the position of its last token. The KV of every draft
// position was stored and marked; what was rejected is rolled back in the
// pool before anything else reads r's pages, then the emitted tokens are
// delivered one by one (a token that finishes r ends the delivery).
func (e *Engine) speculated(r *Request, rows []float32, c0 int) {
	out, accepted, err := e.verify(r, rows)
	if err != nil {
		e.remove(r)
		e.fail(r, err)
		return
	}
	drafted := len(r.spec.draft)
	r.spec.draft = r.spec.draft[:0]
	r.spec.next = accepted + 1
	r.spec.drafted += drafted
	r.spec.accepted += accepted
	if r.spec.loopDraft {
		r.spec.loopAccepted += accepted
	}
	e.m.SpecDraftTokens.Add(float64(drafted))
	e.m.SpecAcceptedTokens.Add(float64(accepted))
	// Positions c0..c0+accepted hold KV of tokens that stay; the rest of
	// what this step stored is the rejected drafts'.
	r.computed = c0 + 1 + accepted
	if accepted < drafted {
		if err := e.pool.Rollback(r.owner, r.pages, r.computed); err != nil {
			e.remove(r)
			e.fail(r, fmt.Errorf("rolling back rejected draft KV: %w", err))
			return
		}
	}
	if err := e.drafter.settle(r, r.computed); err != nil {
		e.remove(r)
		e.fail(r, err)
		return
	}
	// The guard judges the step before any of its tokens goes out, so
	// nothing the suspect state produced after the trip reaches anyone.
	if e.specGuard(r) {
		return
	}
	for _, tok := range out {
		if err := e.follow(r, tok.ID); err != nil {
			e.remove(r)
			e.fail(r, err)
			return
		}
		e.deliver(r, tok)
		if r.life.State() != StateDecoding {
			return
		}
	}
}
