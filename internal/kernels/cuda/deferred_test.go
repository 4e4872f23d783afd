package cuda

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/model"
)

// Tests on the emulated driver whose streams are asynchronous
// (fakecuda's deferred/ build): work queued on a stream runs only when
// something waits for it, so an ordering the backend forgot to ask the
// device for shows as wrong data instead of being hidden by synchronous
// streams.

// deferredBackend is a backend on the deferred driver, closed with the
// test.
func deferredBackend(t *testing.T) *Backend {
	t.Helper()
	l := fakeLibs(t)
	l.driver = []string{filepath.Join(filepath.Dir(l.driver[0]), "deferred", "libcuda.so.1")}
	b, err := open(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestDeferredKernels: the kernel parity suite holds with asynchronous
// streams: every result the backend hands back was waited for.
func TestDeferredKernels(t *testing.T) { runSuite(t, deferredBackend(t)) }

// TestDeferredStageBeforeReuse: Stage packs a page on the pool's stream
// and returns without waiting; a store into the same page queued on the
// compute stream after it (another request reusing the page once it was
// released) must not land before the pack read it. The staging's sums and
// the arena's rows are the page as it was when staged.
func TestDeferredStageBeforeReuse(t *testing.T) {
	b := deferredBackend(t)
	src, host := ipcSource(t, b, kernels.BF16, 95)
	kv := host
	kv.Data, kv.Device = nil, src
	const page = 1
	tokens := host.PageSize
	ar, err := src.NewArena(host.PackedBytes(tokens))
	if err != nil {
		t.Fatal(err)
	}
	defer ar.Close()
	st, err := ar.Stage([]int32{page}, []int{tokens}, []int{0})
	if err != nil {
		t.Fatal(err)
	}
	// The reuse: new rows into every slot of the page, on the compute
	// stream, which then runs (a synchronise of it).
	rng := rand.New(rand.NewPCG(96, 97))
	slots := make([]int32, tokens)
	for i := range slots {
		slots[i] = int32(page*host.PageSize + i)
	}
	rows := randVec(rng, tokens*host.RowFloats(), 1)
	for l := range host.Layers {
		b.StoreKV(kv, l, slots, rows, rows)
	}
	b.lock()
	b.sync()
	b.unlock()
	sums, err := st.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if want := kernels.PageSum(kernels.PackPage(host, page, tokens, nil)); sums[0] != want {
		t.Fatalf("the staged page summed %#x, the page as staged %#x: the reuse landed before the pack", sums[0], want)
	}
	dst := ipcPool(t, b, kernels.BF16)
	pm, err := kernels.PeerImporter(dst).OpenPeer(ar.Handle())
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	if err := pm.CopyPage(0, tokens, 0); err != nil {
		t.Fatal(err)
	}
	got := host
	got.Data = poolData(t, dst)
	if a, w := kernels.PackPage(got, 0, tokens, nil), kernels.PackPage(host, page, tokens, nil); string(a) != string(w) {
		t.Fatal("the arena does not hold the page as it was staged")
	}
}

// TestDeferredIPCPageRuns: pages staged and landed in runs, every copy
// queued and waited for only where the backend says: the importer's
// pool holds them after Drain.
func TestDeferredIPCPageRuns(t *testing.T) {
	testIPCPageRuns(t, deferredBackend(t), deferredBackend(t))
}

// TestDeferredGraphCUBLAS: decode steps captured and replayed as graphs,
// their cuBLAS products inside, with asynchronous streams (a graph launch
// queued on the stream like any launch): the logits equal direct
// launches' on synchronous streams.
func TestDeferredGraphCUBLAS(t *testing.T) {
	on, off := deferredGraphRuns(t, DefaultGraphMaxBS, 24)
	graphCUBLASSteps(t, on, off)
}

// deferredGraphRuns are graphConfig's dummy f16 model, seqs sequences, on
// the deferred backend with graphs of up to maxBS rows and on the
// synchronous one launching directly.
func deferredGraphRuns(t *testing.T, maxBS, seqs int) (on, off *graphRun) {
	c := graphConfig
	w, err := model.DummyWeights(&c, kernels.F16)
	if err != nil {
		t.Fatal(err)
	}
	bOn, bOff := deferredBackend(t), fakeBackend(t)
	bOn.SetGraphs(maxBS, nil)
	bOff.SetGraphs(0, nil)
	return newGraphRun(t, bOn, c, w, seqs), newGraphRun(t, bOff, c, w, seqs)
}

// TestDeferredGraphReplayInFlight: two decode steps replayed through one
// graph back to back, nothing read back between them. The first launch is
// still queued when the second step's tables go into the graph's pinned
// buffer, and its copy nodes read that buffer only when they run (as a
// GPU's do), so unless the replay waits for it the first launch runs with
// the second step's tokens, positions and slots, and the first step's K/V
// rows are never stored. The second step reads those rows, and a third,
// read back, both steps' rows: their logits equal direct launches'.
func TestDeferredGraphReplayInFlight(t *testing.T) {
	on, off := deferredGraphRuns(t, 4, 3)
	bOn, vocab := on.b, graphConfig.Vocab
	// The bucket's first step runs directly, the second is captured.
	for i := range 2 {
		sameLogits(t, fmt.Sprintf("step %d", i), on.step(3), off.step(3), vocab)
	}
	before := bOn.g
	on.queue(3)
	off.step(3)
	got := on.queue(3)
	kernels.Host(bOn, got)
	sameLogits(t, "the second of two queued replays", got, off.step(3), vocab)
	sameLogits(t, "the step after them", on.step(3), off.step(3), vocab)
	if g := bOn.g; g.replays != before.replays+3 || g.captured != before.captured {
		t.Errorf("%d graph launches and %d captures in the last 3 steps, want 3 and 0", g.replays-before.replays,
			g.captured-before.captured)
	}
}
