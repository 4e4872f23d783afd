package scheduler

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/model/copymodel"
)

// A healthy echo is no loop: a model asked to repeat its prompt copies it
// (and, past its end, wraps around at the prompt's period), its n-gram
// drafts are accepted nearly every time, and the guard at the incident's
// defaults must let it run past 128 tokens to max_tokens. The model is
// two layers of internal/model/copymodel, whose weights are built to copy
// their input. (TestSpecGuardStopsALoop is the other side: a loop on its
// own output at period 1 still trips.)
func TestSpecGuardSparesAnEcho(t *testing.T) {
	dir := t.TempDir()
	s := copymodel.Shape134M
	s.Layers, s.FF = 2, 64
	if err := copymodel.Write(dir, s, 1); err != nil {
		t.Fatal(err)
	}
	l, err := model.Load(model.LoadOptions{Path: dir}, cpu.New(2))
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 64, PageSize: 16, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(l.Model, pool, Config{ContextLength: c.ContextLength, MaxRunning: 4, Spec: ngram4, SpecGuard: DefaultSpecGuard,
		IsEOG: func(id int32) bool { return id == 2 }}, metrics.New("standalone"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	// A text of 100 random tokens, an "instruction", and the text's first
	// 8 tokens: the echo is the rest of the text.
	rng := rand.New(rand.NewPCG(5, 6))
	text := make([]int32, 100)
	for i := range text {
		text[i] = int32(1000 + rng.IntN(30000))
	}
	prompt := append([]int32{1}, text...)
	prompt = append(prompt, 13, 13, 1123, 17, 5406, 29901, 13, 13)
	prompt = append(prompt, text[:8]...)
	ids, ev := runOne(t, e, NewRequest("r", prompt, Params{MaxTokens: 256, IgnoreEOS: true}))
	if ev.Finish != FinishLength || len(ids) != 256 || ev.Spec == nil {
		t.Fatalf("finish %q (%v) after %d tokens, counts %+v", ev.Finish, ev.Err, len(ids), ev.Spec)
	}
	echoed := 0
	for i, id := range ids[:92] {
		if id == text[8+i] {
			echoed++
		}
	}
	if echoed < 83 || ev.Spec.AcceptRate() <= DefaultSpecGuard.MaxAcceptRate {
		t.Fatalf("echoed %d of 92 tokens at accept rate %.3f: not the healthy echo this test is about", echoed, ev.Spec.AcceptRate())
	}
	t.Logf("echo of 256 tokens, accept rate %.3f, accept length %.2f, not stopped", ev.Spec.AcceptRate(), ev.Spec.AcceptLength())
	waitFree(t, e)
}
