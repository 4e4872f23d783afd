package cuda

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
	"github.com/batonlm/baton/internal/kernels/ref"
	"github.com/batonlm/baton/internal/model"
)

// Two ways to run the kernel tests:
//
//   - TestFake*: the real Go backend (dlopen, launches, cuBLAS calls, KV
//     pools and their page copies) on a fake libcuda.so.1 and
//     libcublas.so.12 built by fakecuda.Build from testdata/fakecuda with
//     g++, which run kernels/baton.cu on the CPU (bk_emu.h). Runs in CI on
//     any machine with g++. The fake runs every call synchronously, so
//     ordering between streams is only exercised on a GPU.
//   - TestGPU*: the same checks on a real GPU through libcuda.so.1; they
//     skip, saying so, where Open(0) fails. test/gpu/run.sh runs them.

var (
	fakeOnce sync.Once
	fakeDir  string
	fakeErr  string
	fakeSkip bool

	gpuOnce sync.Once
	gpuBe   *Backend
	gpuErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if gpuBe != nil {
		gpuBe.Close()
	}
	if fakeDir != "" {
		os.RemoveAll(fakeDir)
	}
	os.Exit(code)
}

// fakeLibs builds the fake driver and cuBLAS once per test binary.
func fakeLibs(t testing.TB) libs {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-fakecuda-")
		if err != nil {
			fakeErr = err.Error()
			return
		}
		fakeDir = dir
		if err := fakecuda.Build(dir); err != nil {
			fakeErr, fakeSkip = err.Error(), errors.Is(err, fakecuda.ErrNoCompiler)
		}
	})
	if fakeErr != "" {
		if fakeSkip {
			t.Skip(fakeErr)
		}
		t.Fatal(fakeErr)
	}
	return libs{driver: []string{filepath.Join(fakeDir, "libcuda.so.1")}, cublas: []string{filepath.Join(fakeDir, "libcublas.so.12")}}
}

// fakeBackend opens a backend on the fake driver, with exact-size scratch
// buffers so the fake's guard pages catch reads past what a kernel was given.
func fakeBackend(t testing.TB) *Backend {
	t.Helper()
	b, err := open(fakeLibs(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	b.exactScratch = true
	t.Cleanup(func() { b.Close() })
	return b
}

// bareLibs is fakeLibs with the driver that lacks the optional entry
// points: the primary-context calls, CUDA IPC and CUDA graphs.
func bareLibs(t testing.TB) libs {
	t.Helper()
	l := fakeLibs(t)
	l.driver = []string{filepath.Join(filepath.Dir(l.driver[0]), "noprimary", "libcuda.so.1")}
	return l
}

// bareBackend is a backend on bareLibs' driver, closed with the test.
func bareBackend(t testing.TB) *Backend {
	t.Helper()
	b, err := open(bareLibs(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// gpuBackend is the real GPU 0, or a skip (a failure when
// BATON_REQUIRE_GPU=1, as test/gpu/run.sh sets).
func gpuBackend(t testing.TB) *Backend {
	t.Helper()
	gpuOnce.Do(func() { gpuBe, gpuErr = Open(0) })
	if gpuErr != nil {
		if requireGPU() {
			t.Fatalf("BATON_REQUIRE_GPU=1 and the GPU does not open: %v", gpuErr)
		}
		t.Skipf("no usable CUDA GPU here (%v); GPU tests run on a GPU machine (test/gpu/run.sh)", gpuErr)
	}
	return gpuBe
}

func requireGPU() bool { return os.Getenv("BATON_REQUIRE_GPU") == "1" }

// toDevice copies a host pool into a new GPU pool of b (freed with the
// test) and returns it as a PagedKV.
func toDevice(t testing.TB, b *Backend, host kernels.PagedKV) kernels.PagedKV {
	t.Helper()
	dk, err := b.AllocKV(host, host.Pages())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dk.Close() })
	for p := range host.Pages() {
		if err := dk.WritePage(int32(p), host.PageSize, kernels.PackPage(host, int32(p), host.PageSize, nil)); err != nil {
			t.Fatal(err)
		}
	}
	dev := host
	dev.Data, dev.Device = nil, dk
	return dev
}

// fromDevice reads a GPU pool back into host memory.
func fromDevice(t testing.TB, dev kernels.PagedKV) []float32 {
	t.Helper()
	host := dev
	host.Device = nil
	host.Data = make([]float32, dev.Pages()*dev.PageFloats())
	for p := range dev.Pages() {
		page, err := dev.Device.ReadPage(int32(p), dev.PageSize, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := kernels.UnpackPage(host, int32(p), dev.PageSize, page); err != nil {
			t.Fatal(err)
		}
	}
	return host.Data
}

// seqStep is one step of a single sequence: positions [start, start+n) of
// a prompt whose token at p is (p*mul+add) % vocab, stored through pages
// of 4 slots.
func seqStep(start, n, vocab, mul, add int, pages []int32) *model.Batch {
	bt := &model.Batch{}
	for p := start; p < start+n; p++ {
		bt.Tokens = append(bt.Tokens, int32((p*mul+add)%vocab))
		bt.Positions = append(bt.Positions, int32(p))
		bt.Slots = append(bt.Slots, pages[p/4]*4+int32(p%4))
	}
	bt.Seqs = []kernels.AttnSeq{{Pages: pages, QLen: n, KVLen: start + n}}
	return bt
}

// compareLogits runs w through ref and b, a prefill of prompt tokens then
// two decode steps, and fails where a step's logits differ from ref's by
// more than tol of the largest; it returns the worst such ratio.
func compareLogits(t *testing.T, b *Backend, c model.Config, w *model.Weights, what string, prompt int, tol float64) float64 {
	t.Helper()
	mr, mc := model.New(c, w, ref.New()), model.New(c, w, b)
	kvr := kernels.PagedKV{PageSize: 4, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	kvr.Data = make([]float32, 8*kvr.PageFloats())
	kvc := toDevice(t, b, kvr)
	pages := []int32{7, 2, 5, 0, 1}
	var worst float64
	for step, n := range []int{prompt, 1, 1} {
		start := []int{0, prompt, prompt + 1}[step]
		bt := seqStep(start, n, c.Vocab, 37, 11, pages)
		lr, err := mr.Forward(bt, kvr)
		if err != nil {
			t.Fatal(err)
		}
		lc, err := mc.Forward(bt, kvc)
		if err != nil {
			t.Fatal(err)
		}
		var mag, diff float64
		for i := range lr {
			mag = max(mag, math.Abs(float64(lr[i])))
			diff = max(diff, math.Abs(float64(lc[i]-lr[i])))
		}
		worst = max(worst, diff/mag)
		if !(diff <= tol*mag) { // NaN fails too
			t.Errorf("%s step %d (%d tokens): logits differ by %g (largest %g)", what, step, n, diff, mag)
		}
	}
	return worst
}
