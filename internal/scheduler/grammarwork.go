package scheduler

import (
	"errors"
	"fmt"
	"math/bits"
	"net/http"
	"runtime"
	"time"

	"github.com/batonlm/baton/internal/model"
)

// Grammar work runs off the engine loop. A constrained request's next mask
// depends only on the tokens it has accepted, so a mask worker computes it
// while the forward pass that yields the request's logits runs. After the
// pass the loop waits for the step's masks at most maskWait, all requests
// together; a request whose mask comes later sits the next steps out with
// its logits row kept, and is sampled when its mask arrives, while the
// rest of the batch steps on. A grammar that is costly to follow (a new
// pattern whose every position is a state of its own) thus slows its own
// request, not the batch, and each request's mask work is bounded:
// past MaskBudget plus maskPerToken for each mask made, in CPU time of the
// mask worker's thread (workClock), it fails with 400.

// maskWait is how long a step waits for the masks of its constrained
// requests, all together, before it leaves the late ones for later.
const maskWait = 2 * time.Millisecond

// defaultMaskBudget is Config.MaskBudget when unset. maskPerToken is what
// each mask adds to it: an ordinary mask, from contexts already computed,
// takes well under a millisecond even at a 150K vocabulary.
const (
	defaultMaskBudget = time.Second
	maskPerToken      = 2 * time.Millisecond
)

// maskWorkers bounds the masks computed at once, so that grammar work
// cannot take every core from the forward pass.
func maskWorkers() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// ClientError fails a request for a reason of the request's own making
// (its constraint admits nothing, or costs more than a request may): the
// client gets 400 with Message. Reason is the metric label.
type ClientError struct {
	Reason, Message string
}

func (e *ClientError) Error() string { return e.Message }

// HTTPStatus is the status the client sees.
func (e *ClientError) HTTPStatus() int { return http.StatusBadRequest }

// maskJob is one mask in the making. Its worker writes the fields, then
// closes done; the loop reads them only after that.
type maskJob struct {
	done    chan struct{}
	matcher Matcher // the request's matcher, when the job had to make it
	mask    []uint64
	took    time.Duration
	err     error
}

// grammarState is the engine-owned grammar side of a request.
type grammarState struct {
	job     *maskJob      // the next token's mask, in the making or made
	spent   time.Duration // mask work so far
	masks   int           // masks made so far
	spare   []uint64      // the last mask's buffer, for the next job
	pending *int32        // a token to accept before the first mask (decode: prefill's first token)
	// row holds the logits of a draw waiting for its mask; deferred says
	// the request sits out steps until then.
	row      []float32
	deferred bool
}

// constrained: r's output follows a grammar.
func constrained(r *Request) bool { return r.Params.Constraint.Kind != "" }

// askMask starts the worker that computes r's next mask, unless one is
// already on it. The first job also makes r's matcher, which compiles
// the grammar if no cache has it.
func (e *Engine) askMask(r *Request) {
	g := &r.grammar
	if g.job != nil {
		return
	}
	j := &maskJob{done: make(chan struct{})}
	g.job = j
	m, buf, pending := r.matcher, g.spare, g.pending
	g.spare, g.pending = nil, nil
	c, tenant, words := r.Params.Constraint, r.Params.Tenant, (e.model.Config.Vocab+63)/64
	output := r.Params.Output(r.Prompt)
	allowance := e.maskBudget() + time.Duration(g.masks+1)*maskPerToken - g.spent
	constrain := e.cfg.Constrain
	go func() {
		e.maskSlots <- struct{}{}
		defer func() {
			<-e.maskSlots
			close(j.done)
			e.poke()
		}()
		stop := workClock()
		defer func() {
			if stop != nil { // an early return
				j.took = stop()
			}
		}()
		if m == nil {
			if constrain == nil {
				j.err = errNoConstraints
				return
			}
			var err error
			if m, err = constrain(c, tenant, output); err != nil {
				j.err = fmt.Errorf("constraint: %w", err)
				return
			}
			j.matcher = m
		}
		if pending != nil {
			if err := m.Accept(*pending); err != nil {
				j.err = fmt.Errorf("constraint refused token %d: %w", *pending, err)
				return
			}
		}
		n := max(m.MaskWords(), words)
		if cap(buf) < n {
			buf = make([]uint64, n)
		}
		j.mask = buf[:n]
		m.FillMask(j.mask)
		j.took, stop = stop(), nil
		j.err = maskVerdict(m, j.mask, j.took, allowance)
	}()
}

// maskVerdict is what a filled mask says about its request: nothing wrong,
// or the 400 that ends it.
func maskVerdict(m Matcher, mask []uint64, took, allowance time.Duration) error {
	if gm, ok := m.(interface{ Err() error }); ok && gm.Err() != nil {
		return &ClientError{Reason: "too_complex", Message: "the constraint cannot be followed: " + gm.Err().Error()}
	}
	if took > allowance {
		return &ClientError{Reason: "budget", Message: "the constraint took too long to follow (its masks of allowed tokens used up the work a request may take); simplify the schema, pattern or grammar"}
	}
	n := 0
	for _, w := range mask {
		n += bits.OnesCount64(w)
	}
	if n == 0 {
		return &ClientError{Reason: "no_token", Message: "the constraint admits no token here: the output can neither go on nor end"}
	}
	return nil
}

func (e *Engine) maskBudget() time.Duration {
	if e.cfg.MaskBudget > 0 {
		return e.cfg.MaskBudget
	}
	return defaultMaskBudget
}

// takeMask returns r's next mask once its job is done, waiting for it
// until deadline (not at all for a zero deadline). ready is false when the
// job is still running; err ends the request.
func (e *Engine) takeMask(r *Request, deadline time.Time) (mask []uint64, ready bool, err error) {
	g := &r.grammar
	j := g.job
	if j == nil {
		// prepare asks for every running constrained request's mask
		// before the step that samples it: a draw with none asked for
		// is a bug in the loop, not a mask to wait for.
		return nil, false, errors.New("scheduler: a constrained draw with no mask asked for")
	}
	select {
	case <-j.done:
	default:
		wait := time.Until(deadline)
		if deadline.IsZero() || wait <= 0 {
			return nil, false, nil
		}
		t := time.NewTimer(wait)
		select {
		case <-j.done:
			t.Stop()
		case <-t.C:
			return nil, false, nil
		}
	}
	g.job = nil
	if j.matcher != nil {
		r.matcher = j.matcher
	}
	g.spent += j.took
	g.masks++
	g.spare = j.mask
	e.m.GrammarMaskSeconds.Observe(j.took.Seconds())
	if j.err != nil {
		var ce *ClientError
		if errors.As(j.err, &ce) {
			e.m.GrammarRefusals.WithLabelValues(ce.Reason).Inc()
		}
		return nil, false, j.err
	}
	return j.mask, true, nil
}

// maskFailed ends nothing itself: it reports a mask job of r's that
// already failed, so that r ends now rather than after its whole prompt.
func (e *Engine) maskFailed(r *Request) error {
	j := r.grammar.job
	if j == nil {
		return nil
	}
	select {
	case <-j.done:
		if j.err != nil {
			_, _, err := e.takeMask(r, time.Time{})
			return err
		}
	default:
	}
	return nil
}

// deferDraw keeps row for r's draw until its mask arrives.
func (e *Engine) deferDraw(r *Request, row []float32) {
	r.grammar.row = append(r.grammar.row[:0], row...)
	r.grammar.deferred = true
}

// drawDeferred samples the draws whose masks have arrived since their step,
// and settles them as the step would have.
func (e *Engine) drawDeferred() {
	var ready []*Request
	for _, r := range e.running {
		if r.grammar.deferred {
			ready = append(ready, r)
		}
	}
	for _, r := range ready {
		mask, ok, err := e.takeMask(r, time.Time{})
		if err != nil {
			r.grammar.deferred = false
			e.remove(r)
			e.fail(r, err)
			continue
		}
		if !ok {
			continue
		}
		r.grammar.deferred = false
		h := e.history(r)
		h.Allow = mask
		tok := e.sampler.SampleAfter(r.grammar.row, r.Params.Sampling, r.rng, h)
		e.settle(r, tok)
	}
}

// follow tells r's matcher which token was chosen (or, on decode, which
// token prefill chose); a token the constraint refuses fails the request.
// A request whose matcher is not made yet (decode's first token) has the
// token accepted by its first mask job, off the loop.
func (e *Engine) follow(r *Request, id int32) error {
	if !constrained(r) {
		return nil
	}
	if r.matcher == nil {
		r.grammar.pending = &id
		return nil
	}
	if err := r.matcher.Accept(id); err != nil {
		return fmt.Errorf("constraint refused token %d: %w", id, err)
	}
	return nil
}

// settle takes the token sampled for r: the constraint follows it, then a
// prefill request is done with and any other gets it delivered.
func (e *Engine) settle(r *Request, tok model.Sampled) {
	if err := e.follow(r, tok.ID); err != nil {
		e.remove(r)
		e.fail(r, err)
		return
	}
	if r.traits().handsOn {
		e.prefilled(r, tok)
		return
	}
	e.deliver(r, tok)
}

// allWaiting: no running request can step until a load ends or a mask
// arrives; both poke the loop.
func (e *Engine) allWaiting() bool {
	for _, r := range e.running {
		if r.loading == 0 && !r.grammar.deferred {
			return false
		}
	}
	return len(e.running) > 0
}
