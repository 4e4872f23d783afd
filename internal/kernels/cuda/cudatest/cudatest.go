// Package cudatest opens the emulated CUDA driver (fakecuda) for the tests
// of packages that use the cuda backend: the transports' pools in "GPU"
// memory, on the CPU.
package cudatest

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
)

var (
	once     sync.Once
	dir      string
	buildErr error

	mu       sync.Mutex
	backends = map[string]*cuda.Backend{}
)

// Synchronous is a backend on the emulated driver whose streams run work
// as it is queued, shared by the test binary.
func Synchronous(t testing.TB) *cuda.Backend { return open(t, "") }

// Deferred is a backend on the emulated driver whose streams run their
// work only when something waits for it (fakecuda's deferred build), so
// a wait the code forgot shows as wrong data; shared by the test binary.
func Deferred(t testing.TB) *cuda.Backend { return open(t, "deferred") }

func open(t testing.TB, variant string) *cuda.Backend {
	t.Helper()
	once.Do(func() {
		if dir, buildErr = os.MkdirTemp("", "baton-cudatest-"); buildErr == nil {
			buildErr = fakecuda.Build(dir)
		}
	})
	if errors.Is(buildErr, fakecuda.ErrNoCompiler) {
		t.Skip(buildErr)
	}
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	mu.Lock()
	defer mu.Unlock()
	if b := backends[variant]; b != nil {
		return b
	}
	b, err := cuda.OpenAt(filepath.Join(dir, variant), 0)
	if err != nil {
		t.Fatal(err)
	}
	backends[variant] = b
	return b
}
