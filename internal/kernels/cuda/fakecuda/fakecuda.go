// Package fakecuda builds the emulated CUDA driver and cuBLAS
// (../testdata/fakecuda): shared libraries with the driver's and cuBLAS's
// entry points that run the backend's own kernel sources on the CPU. Tests
// of the GPU backend, and of the processes above it, load them through
// dlopen exactly as they would load the real ones, on machines without a
// GPU. Only tests use it; it needs g++ and the source tree.
package fakecuda

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
)

// ErrNoCompiler: g++ is not installed.
var ErrNoCompiler = errors.New("fakecuda: g++ not found (the fake driver is built from C++)")

// Build compiles libcuda.so.1 and libcublas.so.12 into dir, into
// dir/noprimary a driver that lacks the primary-context calls, CUDA IPC
// and CUDA graphs, into dir/noworkspace a cuBLAS that lacks
// cublasSetWorkspace_v2, and into dir/deferred a driver whose streams run
// their work only when something waits for it (FAKE_DEFERRED in
// testdata/fakecuda/fakecuda.cc). A process started with
// LD_LIBRARY_PATH=dir uses them as its CUDA installation.
func Build(dir string) error {
	cxx, err := exec.LookPath("g++")
	if err != nil {
		return ErrNoCompiler
	}
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		return errors.New("fakecuda: cannot locate the sources")
	}
	cuda := filepath.Dir(filepath.Dir(self))
	src, kernels := filepath.Join(cuda, "testdata", "fakecuda"), filepath.Join(cuda, "kernels")
	for _, sub := range []string{"noprimary", "noworkspace", "deferred"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			return err
		}
	}
	flags := []string{"-std=c++17", "-O2", "-fPIC", "-shared", "-fno-strict-aliasing", "-Wall", "-Wno-unknown-pragmas"}
	driver := slices.Concat(flags, []string{"-DBK_EMU", "-I" + src, "-I" + kernels})
	for _, c := range [][]string{
		slices.Concat(driver, []string{"-o", filepath.Join(dir, "libcuda.so.1"), filepath.Join(src, "fakecuda.cc")}),
		slices.Concat(flags, []string{"-o", filepath.Join(dir, "libcublas.so.12"), filepath.Join(src, "fakecublas.cc")}),
		slices.Concat(driver, []string{"-DFAKE_NO_PRIMARY", "-DFAKE_NO_IPC", "-DFAKE_NO_GRAPHS", "-o", filepath.Join(dir, "noprimary", "libcuda.so.1"), filepath.Join(src, "fakecuda.cc")}),
		slices.Concat(flags, []string{"-DFAKE_NO_WORKSPACE", "-o", filepath.Join(dir, "noworkspace", "libcublas.so.12"), filepath.Join(src, "fakecublas.cc")}),
		slices.Concat(driver, []string{"-DFAKE_DEFERRED", "-o", filepath.Join(dir, "deferred", "libcuda.so.1"), filepath.Join(src, "fakecuda.cc")}),
	} {
		if out, err := exec.Command(cxx, c...).CombinedOutput(); err != nil {
			return fmt.Errorf("fakecuda: building the fake driver: %w\n%s", err, out)
		}
	}
	return nil
}
