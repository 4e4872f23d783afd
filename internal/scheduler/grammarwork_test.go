package scheduler

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
)

// testMatcher is a constraint whose masks the test controls: fill decides
// each mask (nil: every token), gate, when set, holds each FillMask until
// the test lets it go.
type testMatcher struct {
	vocab    int
	fill     func(mask []uint64)
	gate     chan struct{}
	inFill   chan struct{} // told each time a FillMask starts
	sleep    time.Duration // waits this long in each FillMask
	spin     time.Duration // and works this long
	accepted atomic.Int32
}

func (m *testMatcher) MaskWords() int { return (m.vocab + 63) / 64 }

func (m *testMatcher) FillMask(mask []uint64) {
	if m.inFill != nil {
		select {
		case m.inFill <- struct{}{}:
		default:
		}
	}
	if m.gate != nil {
		<-m.gate
	}
	time.Sleep(m.sleep)
	for start := time.Now(); time.Since(start) < m.spin; {
		// work, as a costly grammar's mask is: the budget counts CPU time
	}
	clear(mask)
	if m.fill != nil {
		m.fill(mask)
		return
	}
	for id := range m.vocab {
		mask[id>>6] |= 1 << (id & 63)
	}
}

func (m *testMatcher) Accept(int32) error {
	m.accepted.Add(1)
	return nil
}

// constrainedEngine is newEngine whose constrained requests all get m.
func constrainedEngine(t *testing.T, m func() *testMatcher, budget time.Duration) (*Engine, *metrics.Set) {
	t.Helper()
	lm, pool := storiesPool(t, 16, 300)
	c := lm.Config
	ms := metrics.New("standalone")
	e := NewEngine(lm, pool, Config{ContextLength: c.ContextLength, ChunkSize: 512, MaxRunning: 16, IsEOG: func(id int32) bool { return id == 2 },
		MaskBudget: budget,
		Constrain:  func(Constraint, prefixcache.Salt, []int32) (Matcher, error) { return m(), nil }}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, ms
}

var someConstraint = Constraint{Kind: "regex", Spec: "test"}

// finalEvent reads r's events to its last, within d.
func finalEvent(t *testing.T, r *Request, d time.Duration) (Event, []int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var ids []int32
	for {
		ev, ok := r.Next(ctx)
		if !ok {
			t.Fatalf("request %s: no last event within %s", r.ID, d)
		}
		if ev.Token != nil {
			ids = append(ids, ev.Token.ID)
		}
		if ev.Finish != "" {
			return ev, ids
		}
	}
}

// A constraint that admits no token at all ends its request at once with
// the client's 400 (not a 500, not a wait), counted, holding no page.
func TestConstraintAdmittingNoTokenIs400(t *testing.T) {
	e, ms := constrainedEngine(t, func() *testMatcher { return &testMatcher{vocab: 512, fill: func([]uint64) {}} }, 0)
	r := NewRequest("none", loadRef(t).PromptIDs, Params{MaxTokens: 8, Constraint: someConstraint})
	if err := e.Enqueue(r); err != nil {
		t.Fatal(err)
	}
	ev, ids := finalEvent(t, r, 10*time.Second)
	var hs interface{ HTTPStatus() int }
	if ev.Finish != FinishError || !errors.As(ev.Err, &hs) || hs.HTTPStatus() != http.StatusBadRequest || len(ids) != 0 {
		t.Fatalf("finish %q err %v tokens %v: want an error with status 400 and no token", ev.Finish, ev.Err, ids)
	}
	if got := metricValue(t, ms, "baton_grammar_refusals_total", "no_token"); got != 1 {
		t.Errorf("no_token refusals %v, want 1", got)
	}
	waitFree(t, e)
}

// A mask that takes long is made off the loop: while one request's mask
// is held, an unconstrained request runs to its end; once the mask is let
// go, the held request goes on from the logits it had, and (its masks
// allowing every token) generates exactly what it would unconstrained.
func TestSlowMaskDoesNotHoldTheBatch(t *testing.T) {
	gate, inFill := make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	e, _ := constrainedEngine(t, func() *testMatcher {
		m := &testMatcher{vocab: 512, inFill: inFill}
		once.Do(func() { m.gate = gate }) // the first request's matcher only
		return m
	}, 0)
	want := loadRef(t)
	held := NewRequest("held", want.PromptIDs, Params{MaxTokens: len(want.GeneratedIDs), Constraint: someConstraint})
	if err := e.Enqueue(held); err != nil {
		t.Fatal(err)
	}
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the engine's own cleanup: a loop stuck in the mask would never stop
	<-inFill        // its first mask is being made, and will not end until the gate opens
	victim := NewRequest("victim", want.PromptIDs, Params{MaxTokens: len(want.GeneratedIDs)})
	if err := e.Enqueue(victim); err != nil {
		t.Fatal(err)
	}
	ev, got := finalEvent(t, victim, 20*time.Second)
	if ev.Err != nil || !slices.Equal(got, want.GeneratedIDs) {
		t.Fatalf("victim: %v %v, want the reference %v", ev.Err, got, want.GeneratedIDs)
	}
	open()
	ev, got = finalEvent(t, held, 20*time.Second)
	if ev.Err != nil || !slices.Equal(got, want.GeneratedIDs) {
		t.Fatalf("held request: %v %v, want the reference %v", ev.Err, got, want.GeneratedIDs)
	}
	waitFree(t, e)
}

// Masks that arrive late, step after step and in any order, change no
// token: four constrained requests whose masks allow everything but take
// 0-3 ms each give the greedy reference.
func TestLateMasksKeepTheReference(t *testing.T) {
	var n atomic.Int32
	e, _ := constrainedEngine(t, func() *testMatcher {
		return &testMatcher{vocab: 512, sleep: time.Duration(n.Add(1)%4) * time.Millisecond}
	}, 0)
	want := loadRef(t)
	var wg sync.WaitGroup
	for i := range 4 {
		r := NewRequest("late", want.PromptIDs, Params{MaxTokens: len(want.GeneratedIDs), Constraint: someConstraint})
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev, got := finalEvent(t, r, 30*time.Second)
			if ev.Err != nil || !slices.Equal(got, want.GeneratedIDs) {
				t.Errorf("request %d: %v %v, want the reference %v", i, ev.Err, got, want.GeneratedIDs)
			}
		}()
	}
	wg.Wait()
	waitFree(t, e)
}

// A request's mask work is bounded: masks of 40 ms against a budget of
// 50 ms (plus the allowance per token) end it with 400 after a few tokens,
// counted, instead of its grammar costing every step that long.
func TestMaskWorkPastTheBudgetIs400(t *testing.T) {
	e, ms := constrainedEngine(t, func() *testMatcher { return &testMatcher{vocab: 512, spin: 40 * time.Millisecond} }, 50*time.Millisecond)
	r := NewRequest("costly", loadRef(t).PromptIDs, Params{MaxTokens: 40, Constraint: someConstraint, IgnoreEOS: true})
	if err := e.Enqueue(r); err != nil {
		t.Fatal(err)
	}
	ev, ids := finalEvent(t, r, 30*time.Second)
	var hs interface{ HTTPStatus() int }
	if ev.Finish != FinishError || !errors.As(ev.Err, &hs) || hs.HTTPStatus() != http.StatusBadRequest {
		t.Fatalf("finish %q err %v after %d tokens: want 400 for the mask budget", ev.Finish, ev.Err, len(ids))
	}
	if len(ids) >= 10 {
		t.Errorf("%d tokens before the budget ended it; 40 ms masks against 50 ms + 2 ms a token allow about 2", len(ids))
	}
	if got := metricValue(t, ms, "baton_grammar_refusals_total", "budget"); got != 1 {
		t.Errorf("budget refusals %v, want 1", got)
	}
	if got := metricValue(t, ms, "baton_grammar_mask_seconds", ""); got < 2 {
		t.Errorf("baton_grammar_mask_seconds counted %v masks, want each one", got)
	}
	waitFree(t, e)
}

// metricValue is a counter's value (of the series whose one label has
// value label, or the only series), or a histogram's count.
func metricValue(t *testing.T, ms *metrics.Set, name, label string) float64 {
	t.Helper()
	mfs, err := ms.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetValue() == label }) {
				continue
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount())
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s %s", name, label)
	return 0
}
