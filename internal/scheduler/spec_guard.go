package scheduler

import (
	"errors"
	"fmt"

	"github.com/batonlm/baton/internal/request"
)

// FinishSpecAnomaly ends a generation whose speculation figures left the
// guard's bounds (SpecGuard).
const FinishSpecAnomaly = request.FinishSpecAnomaly

// SpecCounts are one request's speculation figures.
type SpecCounts = request.SpecCounts

// SpecGuard stops a generation whose speculation says its KV is not what
// the model wrote (an incident report's rule): past MinTokens generated,
// an accept length below MinAcceptLength means the draft and the target
// disagree about the state, and an accept rate above MaxAcceptRate means
// attention has fallen into a loop.
//
// Which figure is asked depends on the drafter. An n-gram draft comes
// from the text, not from a model state: it is proposed whenever the last
// tokens occurred before, and most are rejected on text that does not
// repeat, so its accept length says how repetitive the text is, not
// whether two views of the KV agree; only the loop test (MaxAcceptRate)
// applies to it. A draft model proposes every step from its own view of
// the sequence, so both tests apply.
//
// An n-gram draft also says what it copies, which tells a loop from an
// echo: a model asked to repeat or edit a text copies its prompt, and its
// drafts are accepted nearly all the time, which the incident's rule
// alone would take for a loop. For n-gram drafts the loop test therefore
// counts only the accepted tokens of drafts that copied the request's own
// output from a short period back (ngramLoopPeriod), the loop's
// signature. A draft model's drafts carry no source, so its loop test is
// the incident's, and an echo with a draft model can still trip it.
type SpecGuard struct {
	On              bool
	MinTokens       int
	MinAcceptLength float64
	MaxAcceptRate   float64
}

// DefaultSpecGuard is the incident's rule.
var DefaultSpecGuard = SpecGuard{On: true, MinTokens: 128, MinAcceptLength: 1.4, MaxAcceptRate: 0.96}

// Validate refuses bounds that mean nothing.
func (g SpecGuard) Validate() error {
	switch {
	case g.MinTokens < 0:
		return errors.New("the spec guard's minimum tokens cannot be negative")
	case g.MinAcceptLength < 0:
		return errors.New("the spec guard's minimum accept length cannot be negative")
	case g.MaxAcceptRate < 0 || g.MaxAcceptRate > 1:
		return fmt.Errorf("the spec guard's maximum accept rate %v is outside 0..1", g.MaxAcceptRate)
	}
	return nil
}

// SpecAnomalyError is what ends a request the guard stopped.
type SpecAnomalyError struct {
	Counts    SpecCounts
	Generated int
	Rule      string
}

func (e *SpecAnomalyError) Error() string {
	return fmt.Sprintf("%s: %s after %d generated tokens (%d drafted, %d accepted over %d verifying steps)",
		FinishSpecAnomaly, e.Rule, e.Generated, e.Counts.Drafted, e.Counts.Accepted, e.Counts.Steps)
}

// trips says which of g's rules, if any, the figures c of a request that
// generated n tokens break; modelDraft says the drafter is a model, and
// looped is how many of an n-gram drafter's accepted tokens copied the
// request's recent output.
func (g SpecGuard) trips(c SpecCounts, looped, n int, modelDraft bool) string {
	if !g.On || n < g.MinTokens || c.Steps == 0 || c.Drafted == 0 {
		return ""
	}
	if modelDraft {
		if c.AcceptLength() < g.MinAcceptLength {
			return fmt.Sprintf("accept length %.2f below %.2f", c.AcceptLength(), g.MinAcceptLength)
		}
		if c.AcceptRate() > g.MaxAcceptRate {
			return fmt.Sprintf("accept rate %.3f above %.3f", c.AcceptRate(), g.MaxAcceptRate)
		}
		return ""
	}
	if rate := float64(looped) / float64(c.Drafted); rate > g.MaxAcceptRate {
		return fmt.Sprintf("accept rate %.3f above %.3f, copying its own output", rate, g.MaxAcceptRate)
	}
	return ""
}

// counts is r's speculation figures so far.
func (s *specState) counts() SpecCounts {
	return SpecCounts{Drafted: s.drafted, Accepted: s.accepted, Steps: s.steps}
}

// specCounts is what r's last event carries: its figures, or nil when it
// never speculated.
func specCounts(r *Request) *SpecCounts {
	if r.spec.steps == 0 {
		return nil
	}
	c := r.spec.counts()
	return &c
}

// specGuard asks the guard about r after a verifying step, before any
// of that step's tokens is delivered; true when it stopped r.
func (e *Engine) specGuard(r *Request) bool {
	rule := e.cfg.SpecGuard.trips(r.spec.counts(), r.spec.loopAccepted, r.generated, e.cfg.Spec.Algorithm != "ngram")
	if rule == "" {
		return false
	}
	err := &SpecAnomalyError{Counts: r.spec.counts(), Generated: r.generated, Rule: rule}
	e.remove(r)
	if !e.tearDown(r, err.Error()) {
		return true
	}
	e.m.SpecAnomalies.Inc()
	e.specObserve(r)
	e.m.Outcome("aborted")
	r.emit(Event{Finish: FinishSpecAnomaly, Err: err, Spec: specCounts(r)})
	return true
}
