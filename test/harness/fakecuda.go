package harness

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
)

var (
	fakeCUDADir string
	fakeCUDAErr error
)

// FakeCUDAEnv is the environment that makes a worker load the emulated
// CUDA driver and cuBLAS (internal/kernels/cuda/fakecuda, built once per
// test binary and found through LD_LIBRARY_PATH as a real installation
// would be), or nothing under BATON_REQUIRE_GPU=1 (test/gpu/run.sh), where
// the real driver is. Without g++ the test is skipped, saying so.
func FakeCUDAEnv(t testing.TB) []string {
	t.Helper()
	if os.Getenv("BATON_REQUIRE_GPU") == "1" {
		return nil
	}
	buildMu.Lock()
	defer buildMu.Unlock()
	if fakeCUDADir == "" && fakeCUDAErr == nil {
		if buildDir == "" {
			if buildDir, fakeCUDAErr = os.MkdirTemp("", "baton-test-"); fakeCUDAErr != nil {
				t.Fatal(fakeCUDAErr)
			}
		}
		dir := filepath.Join(buildDir, "fakecuda")
		if fakeCUDAErr = fakecuda.Build(dir); fakeCUDAErr == nil {
			fakeCUDADir = dir
		}
	}
	if errors.Is(fakeCUDAErr, fakecuda.ErrNoCompiler) {
		t.Skip(fakeCUDAErr)
	}
	if fakeCUDAErr != nil {
		t.Fatal(fakeCUDAErr)
	}
	return []string{"LD_LIBRARY_PATH=" + fakeCUDADir}
}
