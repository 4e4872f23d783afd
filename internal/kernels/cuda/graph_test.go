package cuda

import (
	"fmt"
	"math"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/model"
)

// graphRun is a dummy model decoding several sequences at once on one
// backend; each sequence has pages of its own and a prompt of its own
// length, so a step's page tables and positions differ from the last's.
type graphRun struct {
	t     *testing.T
	b     *Backend
	m     *model.Model
	kv    kernels.PagedKV
	lens  []int
	pages [][]int32
}

const graphPage = 4

func newGraphRun(t *testing.T, b *Backend, c model.Config, w *model.Weights, seqs int) *graphRun {
	t.Helper()
	r := &graphRun{t: t, b: b, m: model.New(c, w, b)}
	// As the engine does before its first step: a step that grew the
	// model's buffers would run directly.
	r.m.Reserve(16, 16)
	host := kernels.PagedKV{PageSize: graphPage, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: kernels.BF16}
	host.Data = make([]float32, 4*seqs*host.PageFloats())
	r.kv = toDevice(t, b, host)
	for i := range seqs {
		// Pages interleaved across sequences, in no order.
		r.pages = append(r.pages, []int32{int32(4*seqs - 1 - i), int32(i), int32(seqs + i), int32(2*seqs + i)})
		n := 3 + 3*i
		bt := &model.Batch{Seqs: []kernels.AttnSeq{{Pages: r.pages[i], QLen: n, KVLen: n}}}
		for p := range n {
			bt.Tokens = append(bt.Tokens, r.token(i, p))
			bt.Positions = append(bt.Positions, int32(p))
			bt.Slots = append(bt.Slots, r.slot(i, p))
		}
		if _, err := r.m.Forward(bt, r.kv); err != nil {
			t.Fatal(err)
		}
		r.lens = append(r.lens, n)
	}
	return r
}

func (r *graphRun) token(seq, pos int) int32 { return int32((pos*37 + seq*11 + 5) % r.m.Config.Vocab) }
func (r *graphRun) slot(seq, pos int) int32 {
	return r.pages[seq][pos/graphPage]*graphPage + int32(pos%graphPage)
}

// step decodes the first n sequences one token each (through
// ForwardDevice, as the engine does) and returns their logits.
func (r *graphRun) step(n int) []float32 {
	r.t.Helper()
	bt := &model.Batch{}
	for i := range n {
		p := r.lens[i]
		bt.Tokens = append(bt.Tokens, r.token(i, p))
		bt.Positions = append(bt.Positions, int32(p))
		bt.Slots = append(bt.Slots, r.slot(i, p))
		bt.Seqs = append(bt.Seqs, kernels.AttnSeq{Pages: r.pages[i], QStart: i, QLen: 1, KVLen: p + 1})
		r.lens[i]++
	}
	logits, err := r.m.ForwardDevice(bt, r.kv)
	if err != nil {
		r.t.Fatal(err)
	}
	kernels.Host(r.b, logits)
	return append([]float32(nil), logits...)
}

func argmax(row []float32) int {
	best := 0
	for i, v := range row {
		if v > row[best] {
			best = i
		}
	}
	return best
}

// sameLogits fails where got and want differ by more than 1e-4 of the
// largest logit, or choose different greedy tokens.
func sameLogits(t *testing.T, what string, got, want []float32, vocab int) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d logits, want %d", what, len(got), len(want))
	}
	var mag float64
	for _, v := range want {
		mag = max(mag, math.Abs(float64(v)))
	}
	for i := range got {
		if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-4*mag) {
			t.Fatalf("%s: logit %d = %g, want %g", what, i, got[i], want[i])
		}
	}
	for r := 0; r < len(got)/vocab; r++ {
		if g, w := argmax(got[r*vocab:(r+1)*vocab]), argmax(want[r*vocab:(r+1)*vocab]); g != w {
			t.Fatalf("%s: row %d greedy token %d, want %d", what, r, g, w)
		}
	}
}

var graphConfig = model.Config{Arch: "llama", Vocab: 256, Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 16, FF: 128,
	ContextLength: 64, NormEps: 1e-6, RoPE: kernels.RoPE{Dim: 16, Theta: 10000}}

// graphPair is the same model on a backend with graphs (of up to maxBS
// rows) and on one without.
func graphPair(t *testing.T, maxBS, seqs int) (on, off *graphRun) {
	c := graphConfig
	w, err := model.DummyWeights(&c, kernels.F16)
	if err != nil {
		t.Fatal(err)
	}
	bOn, bOff := fakeBackend(t), fakeBackend(t)
	// Scratch buffers that only grow, as in production: the check of a
	// fresh graph reruns its step directly, with tables of their own
	// sizes, which exact-size buffers would move.
	bOn.exactScratch = false
	bOn.SetGraphs(maxBS, nil)
	bOff.SetGraphs(0, nil)
	return newGraphRun(t, bOn, c, w, seqs), newGraphRun(t, bOff, c, w, seqs)
}

// TestFakeGraphReplay: decode steps run as graphs give the logits and
// greedy tokens of direct launches: a batch padded to its bucket (3 rows
// as 4), consecutive steps through one graph with new positions, slots
// and page tables (copied into the graph's fixed buffers, not captured),
// and a batch above --cuda-graph-max-bs, which launches directly.
func TestFakeGraphReplay(t *testing.T) {
	on, off := graphPair(t, 4, 5)
	vocab := graphConfig.Vocab
	for i, n := range []int{3, 3, 4, 1, 1, 5, 3} {
		before := on.b.g
		sameLogits(t, fmt.Sprintf("step %d of %d rows", i, n), on.step(n), off.step(n), vocab)
		g := on.b.g
		switch {
		case n > 4:
			if g.replays != before.replays || g.captured != before.captured {
				t.Errorf("step %d of %d rows (above max-bs 4) ran as a graph", i, n)
			}
		case i == 0:
			// The first step copies the logits buffer in: it runs directly.
		case g.replays != before.replays+1:
			t.Errorf("step %d of %d rows: %d graph launches, want 1", i, n, g.replays-before.replays)
		}
	}
	// 3 and 4 rows share the bucket of 4; 1 row has its own. Each fresh
	// graph's first run agreed with the direct launches it was checked
	// against.
	if g := on.b.g; g.captured != 2 || g.failures != 0 || g.wrong != 0 || g.nodes == 0 {
		t.Errorf("%d captures (%d nodes), %d failures, %d wrong; want the buckets of 4 and 1 captured once each", g.captured,
			g.nodes, g.failures, g.wrong)
	}
	if off.b.g.replays != 0 || off.b.g.captured != 0 {
		t.Errorf("graphs off: %d captures, %d launches", off.b.g.captured, off.b.g.replays)
	}
}

// TestFakeGraphInPlace: a step replayed through the graph captured at
// the step before, with every position and slot different and a longer
// page table, matches direct launches: its tables reach the kernels
// through the graph's fixed buffers, not as captured values.
func TestFakeGraphInPlace(t *testing.T) {
	on, off := graphPair(t, 8, 2)
	sameLogits(t, "warm-up step", on.step(2), off.step(2), graphConfig.Vocab)
	sameLogits(t, "captured step", on.step(2), off.step(2), graphConfig.Vocab)
	captured, replays := on.b.g.captured, on.b.g.replays
	if captured != 1 || replays != 1 {
		t.Fatalf("%d captures and %d graph launches after the second step, want 1 and 1", captured, replays)
	}
	// Sequence 1 (6 tokens, then 8) enters its third page here.
	sameLogits(t, "replayed step", on.step(2), off.step(2), graphConfig.Vocab)
	if on.b.g.captured != captured || on.b.g.replays != replays+1 {
		t.Errorf("the third step: %d captures, %d graph launches; want a replay of the second's graph",
			on.b.g.captured-captured, on.b.g.replays-replays)
	}
}

// TestFakeGraphSyncInCapture: a step that synchronises inside its
// capture (the driver refuses it, as it refuses any synchronising call
// while a stream captures) runs directly, with the same results, and its
// bucket is not captured again.
func TestFakeGraphSyncInCapture(t *testing.T) {
	on, off := graphPair(t, 8, 3)
	on.b.g.syncInCapture = true
	for i := range 3 {
		sameLogits(t, fmt.Sprintf("step %d", i), on.step(3), off.step(3), graphConfig.Vocab)
	}
	if g := on.b.g; g.failures != 1 || g.replays != 0 || g.captured != 0 {
		t.Errorf("%d failed captures, %d captures, %d graph launches; want 1, 0, 0", g.failures, g.captured, g.replays)
	}
}

// TestFakeGraphDisabled: --disable-cuda-graph (SetGraphs(0)) records and
// captures nothing.
func TestFakeGraphDisabled(t *testing.T) {
	on, off := graphPair(t, 0, 2)
	for i := range 2 {
		sameLogits(t, fmt.Sprintf("step %d", i), on.step(2), off.step(2), graphConfig.Vocab)
	}
	if g := on.b.g; g.captured != 0 || g.replays != 0 || g.direct != 0 {
		t.Errorf("graphs disabled: %d captures, %d graph launches, %d recorded steps", g.captured, g.replays, g.direct)
	}
}

// TestFakeGraphNoEntryPoints: a driver without the graph entry points
// runs every step directly.
func TestFakeGraphNoEntryPoints(t *testing.T) {
	b := bareBackend(t)
	if rows := b.GraphRows(1, 2); rows != 0 {
		t.Fatalf("a driver without graphs offers a bucket of %d rows", rows)
	}
}

// TestFakeGraphGreedyStories260K: the bundled model's greedy reference
// (llama.cpp) decoded through ForwardDevice, as the engine does, so that
// every decode step after the first runs as the graph of the 1-row bucket.
func TestFakeGraphGreedyStories260K(t *testing.T) {
	b := fakeBackend(t)
	b.exactScratch = false // see graphPair
	graphGreedy(t, b, true)
}

// TestGPUGraphGreedyStories260K is the same on the GPU: graphs the real
// driver captured and replays give the reference's tokens.
func TestGPUGraphGreedyStories260K(t *testing.T) {
	b := gpuBackend(t)
	b.SetGraphs(DefaultGraphMaxBS, nil)
	graphGreedy(t, b, false)
}

// graphGreedy decodes stories260K's greedy reference through ForwardDevice
// on b; exact says b's graph counters start at zero and must show one
// capture and a replay for every token after the first.
func graphGreedy(t *testing.T, b *Backend, exact bool) {
	want := loadGreedyRef(t)
	before := b.g
	l, err := model.Load(model.LoadOptions{}, b)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Model.Close()
	m, c := l.Model, l.Model.Config
	const page = 16
	n := (len(want.PromptIDs)+len(want.GeneratedIDs))/page + 2
	kv := toDevice(t, b, kernels.PagedKV{PageSize: page, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim,
		DType: kernels.BF16, Data: make([]float32, n*(kernels.PagedKV{PageSize: page, Layers: c.Layers,
			KVHeads: c.KVHeads, HeadDim: c.HeadDim}).PageFloats())})
	pages := make([]int32, n)
	for i := range pages {
		pages[i] = int32(n - 1 - i)
	}
	seq := append([]int32(nil), want.PromptIDs...)
	done := 0
	for i := range want.GeneratedIDs {
		bt := &model.Batch{Seqs: []kernels.AttnSeq{{Pages: pages, QLen: len(seq) - done, KVLen: len(seq)}}}
		for p := done; p < len(seq); p++ {
			bt.Tokens = append(bt.Tokens, seq[p])
			bt.Positions = append(bt.Positions, int32(p))
			bt.Slots = append(bt.Slots, pages[p/page]*page+int32(p%page))
		}
		logits, err := m.ForwardDevice(bt, kv)
		if err != nil {
			t.Fatal(err)
		}
		kernels.Host(b, logits)
		got := int32(argmax(logits[:c.Vocab]))
		if got != want.GeneratedIDs[i] {
			t.Fatalf("token %d = %d, want %d", i, got, want.GeneratedIDs[i])
		}
		done = len(seq)
		seq = append(seq, got)
	}
	replays := b.g.replays - before.replays
	switch {
	case exact && (replays != len(want.GeneratedIDs)-1 || b.g.captured != 1):
		t.Errorf("%d tokens: %d captures, %d graph launches", len(want.GeneratedIDs), b.g.captured, replays)
	case replays == 0:
		t.Errorf("%d tokens, none from a graph launch (%d capture failures)", len(want.GeneratedIDs), b.g.failures-before.failures)
	}
	t.Logf("%d tokens match the reference, %d of them from graph launches", len(want.GeneratedIDs), replays)
}

// TestGPUGraphReplay is TestFakeGraphReplay's steps on the GPU, against
// direct launches on a second backend: the real driver's graphs, padded
// buckets and in-place tables give the same logits and greedy tokens.
func TestGPUGraphReplay(t *testing.T) {
	bOn := gpuBackend(t)
	bOn.SetGraphs(4, nil)
	t.Cleanup(func() { bOn.SetGraphs(DefaultGraphMaxBS, nil) })
	bOff, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bOff.Close() })
	bOff.SetGraphs(0, nil)
	c := graphConfig
	w, err := model.DummyWeights(&c, kernels.F16)
	if err != nil {
		t.Fatal(err)
	}
	on, off := newGraphRun(t, bOn, c, w, 5), newGraphRun(t, bOff, c, w, 5)
	before := bOn.g
	for i, n := range []int{3, 3, 4, 1, 1, 5, 3} {
		sameLogits(t, fmt.Sprintf("step %d of %d rows", i, n), on.step(n), off.step(n), c.Vocab)
	}
	if g := bOn.g; g.replays == before.replays || g.failures != before.failures {
		t.Errorf("%d graph launches, %d capture failures", g.replays-before.replays, g.failures-before.failures)
	}
}
