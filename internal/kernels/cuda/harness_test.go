package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Two ways to run the kernel tests:
//
//   - TestFake*: the real Go backend (dlopen, launches, cuBLAS calls, KV
//     mirror) on a fake libcuda.so.1 and libcublas.so.12 built here from
//     testdata/fakecuda with g++, which run kernels/baton.cu on the CPU
//     (bk_emu.h). Runs in CI on any machine with g++.
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
		cxx, err := exec.LookPath("g++")
		if err != nil {
			fakeErr, fakeSkip = "g++ not found: the fake-driver tests need a C++ compiler", true
			return
		}
		dir, err := os.MkdirTemp("", "baton-fakecuda-")
		if err != nil {
			fakeErr = err.Error()
			return
		}
		fakeDir = dir
		if err := os.Mkdir(filepath.Join(dir, "noprimary"), 0o755); err != nil {
			fakeErr = err.Error()
			return
		}
		flags := []string{"-std=c++17", "-O2", "-fPIC", "-shared", "-fno-strict-aliasing", "-Wall", "-Wno-unknown-pragmas"}
		for _, c := range [][]string{
			append(flags, "-DBK_EMU", "-Itestdata/fakecuda", "-Ikernels", "-o", filepath.Join(dir, "libcuda.so.1"), "testdata/fakecuda/fakecuda.cc"),
			append(flags, "-o", filepath.Join(dir, "libcublas.so.12"), "testdata/fakecuda/fakecublas.cc"),
			append(flags, "-DBK_EMU", "-DFAKE_NO_PRIMARY", "-Itestdata/fakecuda", "-Ikernels", "-o",
				filepath.Join(dir, "noprimary", "libcuda.so.1"), "testdata/fakecuda/fakecuda.cc"),
		} {
			if out, err := exec.Command(cxx, c...).CombinedOutput(); err != nil {
				fakeErr = "building the fake driver: " + err.Error() + "\n" + string(out)
				return
			}
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
