package cuda

import (
	"bytes"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
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

// graphPage is the test pool's page size; graphSeqPages is how many pages
// each sequence has, room for its prompt and 17 decode steps.
const graphPage, graphSeqPages = 4, 8

func newGraphRun(t *testing.T, b *Backend, c model.Config, w *model.Weights, seqs int) *graphRun {
	t.Helper()
	r := &graphRun{t: t, b: b, m: model.New(c, w, b)}
	// As the engine does before its first step: a step that grew the
	// model's buffers would run directly.
	r.m.Reserve(max(16, seqs), max(16, seqs))
	host := kernels.PagedKV{PageSize: graphPage, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: kernels.BF16}
	host.Data = make([]float32, graphSeqPages*seqs*host.PageFloats())
	r.kv = toDevice(t, b, host)
	for i := range seqs {
		// Pages interleaved across sequences, in no order.
		pages := []int32{int32(graphSeqPages*seqs - 1 - i)}
		for p := range graphSeqPages - 1 {
			pages = append(pages, int32(p*seqs+i))
		}
		r.pages = append(r.pages, pages)
		n := 3 + 3*(i%5)
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
	logits := r.queue(n)
	kernels.Host(r.b, logits)
	return append([]float32(nil), logits...)
}

// queue is step without the read back: the step may still be queued on
// the device when it returns, its logits there.
func (r *graphRun) queue(n int) []float32 {
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
	return logits
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
	bOn, bOff, c, w := gpuGraphPair(t, 4)
	on, off := newGraphRun(t, bOn, c, w, 5), newGraphRun(t, bOff, c, w, 5)
	before := bOn.g
	for i, n := range []int{3, 3, 4, 1, 1, 5, 3} {
		sameLogits(t, fmt.Sprintf("step %d of %d rows", i, n), on.step(n), off.step(n), c.Vocab)
	}
	if g := bOn.g; g.replays == before.replays || g.failures != before.failures {
		t.Errorf("%d graph launches, %d capture failures", g.replays-before.replays, g.failures-before.failures)
	}
}

// TestFakeGraphCUBLAS: decode steps of the buckets whose products go to
// cuBLAS (16 and 24 rows, above the gemv kernels' 8) run as graphs that
// hold the cuBLAS calls, captured on the backend's stream, and give the
// logits and greedy tokens of direct launches; each fresh graph's check
// against direct launches (the model's) passed.
func TestFakeGraphCUBLAS(t *testing.T) {
	on, off := graphPair(t, DefaultGraphMaxBS, 24)
	graphCUBLASSteps(t, on, off)
}

// TestGPUGraphCUBLAS is the same on the GPU, against direct launches on a
// second backend: the real cuBLAS's products captured into graphs, with
// the workspace it was given.
func TestGPUGraphCUBLAS(t *testing.T) {
	bOn, bOff, c, w := gpuGraphPair(t, DefaultGraphMaxBS)
	graphCUBLASSteps(t, newGraphRun(t, bOn, c, w, 24), newGraphRun(t, bOff, c, w, 24))
}

// gpuGraphPair is the GPU backend with graphs up to maxBS rows (back to
// the default after the test), a second backend on the same GPU without
// graphs, and the f16 dummy weights of graphConfig for both.
func gpuGraphPair(t *testing.T, maxBS int) (on, off *Backend, c model.Config, w *model.Weights) {
	on = gpuBackend(t)
	on.SetGraphs(maxBS, nil)
	t.Cleanup(func() { on.SetGraphs(DefaultGraphMaxBS, nil) })
	off, err := Open(0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { off.Close() })
	off.SetGraphs(0, nil)
	c = graphConfig
	if w, err = model.DummyWeights(&c, kernels.F16); err != nil {
		t.Fatal(err)
	}
	return on, off, c, w
}

// graphCUBLASSteps runs steps of 12 to 24 rows on on (graphs of up to 32
// rows) and off (none), and fails unless their logits agree, every step
// but a bucket's first (direct, so that cuBLAS meets its shapes outside a
// capture) was a graph launch, and the graphs hold cuBLAS products.
func graphCUBLASSteps(t *testing.T, on, off *graphRun) {
	if on.b.blas == nil || on.b.blasWork == 0 {
		t.Fatalf("cuBLAS loaded: %v, its workspace: %#x (%s)", on.b.blas != nil, on.b.blasWork, on.b.blasNoCapture)
	}
	start := on.b.g
	for i, step := range []struct {
		n      int
		direct bool
	}{{16, true}, {16, false}, {12, false}, {16, false}, {24, true}, {20, false}, {24, false}} {
		before := on.b.g
		sameLogits(t, fmt.Sprintf("step %d of %d rows", i, step.n), on.step(step.n), off.step(step.n), graphConfig.Vocab)
		g := on.b.g
		if launched := g.replays - before.replays; step.direct != (launched == 0) || launched > 1 {
			t.Errorf("step %d of %d rows: %d graph launches, %d direct; want direct %v", i, step.n, launched,
				g.direct-before.direct, step.direct)
		}
	}
	g := on.b.g
	if captured := g.captured - start.captured; captured != 2 || g.failures != start.failures || g.wrong != start.wrong {
		t.Errorf("%d captures, %d failures, %d wrong; want the buckets of 16 and 24 captured once each", captured,
			g.failures-start.failures, g.wrong-start.wrong)
	}
	for key, g := range on.b.g.graphs {
		products := 0
		for i := range g.ops {
			if g.ops[i].kind == opBLAS {
				products++
			}
		}
		if key.rows > on.b.gemvMax && products == 0 {
			t.Errorf("the graph of %d rows holds no cuBLAS product", key.rows)
		}
	}
}

// blasStep is a backend with graphs, a kept input x of n rows on the
// device and a kept output, for steps of products by hand.
type blasStep struct {
	b      *Backend
	x, out []float32
	n      int
}

func newBLASStep(t *testing.T, n, cols int, ws ...*kernels.Matrix) *blasStep {
	b := fakeBackend(t)
	b.SetGraphs(DefaultGraphMaxBS, nil)
	if err := b.Preload(ws...); err != nil {
		t.Fatal(err)
	}
	s := &blasStep{b: b, x: randVec(rand.New(rand.NewPCG(5, 6)), n*cols, 1), out: make([]float32, n*ws[0].Rows), n: n}
	b.Keep(s.x, s.out)
	// x goes to the device now: a step that copies a whole kept buffer
	// in runs directly.
	b.MatMul(s.out, s.x, n, ws[0])
	return s
}

// run is a graph step of n rows: out = x · wᵀ for each w in turn.
func (s *blasStep) run(ws ...*kernels.Matrix) {
	if rows := s.b.GraphRows(1, s.n); rows != s.n {
		panic(fmt.Sprintf("a step of %d rows runs as %d", s.n, rows))
	}
	s.b.BeginGraphStep(1, s.n)
	for _, w := range ws {
		s.b.MatMul(s.out, s.x, s.n, w)
	}
	s.b.EndGraphStep()
}

// TestFakeGraphBLASProgram: a step that differs from its bucket's graph
// only in a cuBLAS product's weight (its launches and copies alike) is
// captured anew, not replayed with the weight the graph was captured
// with: the program comparison covers every argument of a cuBLAS call.
func TestFakeGraphBLASProgram(t *testing.T) {
	const n, rows, cols = 16, 48, 64
	rng := rand.New(rand.NewPCG(3, 4))
	wA, wB := randMatrix(rng, kernels.F16, rows, cols), randMatrix(rng, kernels.F16, rows, cols)
	s := newBLASStep(t, n, cols, wA, wB)
	want := map[*kernels.Matrix][]float32{}
	for _, w := range []*kernels.Matrix{wA, wB} {
		want[w] = make([]float32, n*rows)
		s.b.MatMul(want[w], append([]float32(nil), s.x...), n, w) // direct
	}
	for i, step := range []struct {
		w                  *kernels.Matrix
		captured, replayed bool
	}{{wA, false, false}, {wA, true, true}, {wA, false, true}, {wB, true, true}, {wB, false, true}, {wA, true, true}} {
		before := s.b.g
		s.run(step.w)
		kernels.Host(s.b, s.out)
		for j := range s.out {
			if s.out[j] != want[step.w][j] {
				t.Fatalf("step %d: out[%d] = %g, want %g (the product by the other weight: %g)", i, j, s.out[j],
					want[step.w][j], want[map[*kernels.Matrix]*kernels.Matrix{wA: wB, wB: wA}[step.w]][j])
			}
		}
		g := s.b.g
		if captured, replayed := g.captured == before.captured+1, g.replays == before.replays+1; captured != step.captured ||
			replayed != step.replayed {
			t.Errorf("step %d: %d captures and %d graph launches, want captured %v, launched %v", i,
				g.captured-before.captured, g.replays-before.replays, step.captured, step.replayed)
		}
	}
}

// TestFakeGraphStepAllocs: recording and replaying a step of cuBLAS
// products allocates nothing beyond what its calls allocate run directly.
func TestFakeGraphStepAllocs(t *testing.T) {
	const n, rows, cols = 16, 32, 64
	rng := rand.New(rand.NewPCG(7, 8))
	var ws []*kernels.Matrix
	for range 8 {
		ws = append(ws, randMatrix(rng, kernels.F16, rows, cols))
	}
	s := newBLASStep(t, n, cols, ws...)
	// The first step runs direct (a bucket's first products do), the
	// second is captured, the rest replay it.
	s.run(ws...)
	s.run(ws...)
	before := s.b.g
	const runs = 20
	recorded := testing.AllocsPerRun(runs, func() { s.run(ws...) })
	if g := s.b.g; g.captured != before.captured || g.replays != before.replays+runs+1 {
		t.Fatalf("%d captures and %d graph launches in %d steps, want 0 and %d", g.captured-before.captured,
			g.replays-before.replays, runs+1, runs+1)
	}
	direct := testing.AllocsPerRun(runs, func() {
		for _, w := range ws {
			s.b.MatMul(s.out, s.x, n, w)
		}
	})
	t.Logf("a step of %d products: %.0f allocations recorded and replayed, %.0f run directly", len(ws), recorded, direct)
	if recorded > direct {
		t.Errorf("a step of %d products: %.0f allocations recorded and replayed, %.0f run directly", len(ws), recorded, direct)
	}
}

// TestFakeGraphNoBLASWorkspace: with a cuBLAS that lacks
// cublasSetWorkspace_v2 the buckets whose products go to cuBLAS run
// directly (said once in the log), and the smaller ones are still graphs.
func TestFakeGraphNoBLASWorkspace(t *testing.T) {
	l := fakeLibs(t)
	l.cublas = []string{filepath.Join(filepath.Dir(l.cublas[0]), "noworkspace", "libcublas.so.12")}
	b, err := open(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	var logged bytes.Buffer
	b.SetGraphs(DefaultGraphMaxBS, slog.New(slog.NewTextHandler(&logged, nil)))
	if b.blas == nil || b.blasWork != 0 || !strings.Contains(b.blasNoCapture, "cublasSetWorkspace_v2") {
		t.Fatalf("cuBLAS loaded: %v, workspace %#x, why none: %q", b.blas != nil, b.blasWork, b.blasNoCapture)
	}
	for _, c := range []struct{ n, rows int }{{16, 0}, {24, 0}, {32, 0}, {8, 8}, {3, 4}, {12, 0}} {
		if rows := b.GraphRows(1, c.n); rows != c.rows {
			t.Errorf("GraphRows(%d) = %d, want %d", c.n, rows, c.rows)
		}
	}
	if got := strings.Count(logged.String(), "cublasSetWorkspace_v2"); got != 1 {
		t.Errorf("the missing workspace logged %d times, want once:\n%s", got, logged.String())
	}
}
