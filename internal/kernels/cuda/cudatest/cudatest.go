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

	"github.com/batonlm/baton/internal/kernels"
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

// Pools is transfertest.Options.Device on b: the decode side's pool of
// pages pages and a one-page prefill pool to stage from, both in b's
// "GPU" memory, closed with the test after whatever the test registered
// later (a receiver that registered the pool closes first).
func Pools(b *cuda.Backend) func(t *testing.T, layout kernels.PagedKV, pages int) (dst, src kernels.PagedKV) {
	return func(t *testing.T, layout kernels.PagedKV, pages int) (dst, src kernels.PagedKV) {
		t.Helper()
		dst, src = layout, layout
		var err error
		if dst.Device, err = b.AllocKV(layout, pages); err != nil {
			t.Fatal(err)
		}
		if src.Device, err = b.AllocKV(layout, 1); err != nil {
			_ = dst.Device.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = dst.Device.Close()
			_ = src.Device.Close()
		})
		return dst, src
	}
}
