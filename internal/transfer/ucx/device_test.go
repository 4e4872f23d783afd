//go:build ucx

package ucx

import (
	"errors"
	"os"
	"sync"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

// The pool in GPU memory, registered with UCX in place (WithDeviceMemory):
// the conformance suite on the emulated CUDA driver, whose device memory
// is host memory, registered as such; on a GPU with a UCX built with CUDA
// the same path registers it as CUDA memory. Senders put straight into
// the decode pool, and what landed is read back from the device.

var (
	fakeOnce sync.Once
	fakeBe   *cuda.Backend
	fakeErr  error
)

func fakeCUDA(t *testing.T) *cuda.Backend {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-ucx-fakecuda-")
		if err != nil {
			fakeErr = err
			return
		}
		if fakeErr = fakecuda.Build(dir); fakeErr == nil {
			fakeBe, fakeErr = cuda.OpenAt(dir, 0)
		}
	})
	if errors.Is(fakeErr, fakecuda.ErrNoCompiler) {
		t.Skip(fakeErr)
	}
	if fakeErr != nil {
		t.Fatal(fakeErr)
	}
	return fakeBe
}

func TestConformanceDeviceMemory(t *testing.T) {
	be := fakeCUDA(t)
	device := func(t *testing.T, layout kernels.PagedKV, pages int) (dst, src kernels.PagedKV) {
		dst, src = layout, layout
		var err error
		if dst.Device, err = be.AllocKV(layout, pages); err != nil {
			t.Fatal(err)
		}
		if src.Device, err = be.AllocKV(layout, 1); err != nil {
			t.Fatal(err)
		}
		// After the receiver's Close (the harness's cleanup, registered
		// later, runs first), which unregisters the pool.
		t.Cleanup(func() {
			_ = dst.Device.Close()
			_ = src.Device.Close()
		})
		return dst, src
	}
	transfertest.RunWith(t, transfertest.Options{Device: device, Unstaged: true}, func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender) {
		kv := kvOf(t, sink)
		dr, ok := kv.Device.(kernels.DeviceRange)
		if !ok {
			t.Fatal("the cuda pool gives no device range")
		}
		addr, n, hostVisible := dr.Range()
		if !hostVisible {
			t.Fatal("the emulated driver's device memory is not host-visible")
		}
		if want := kv.Device.Pages() * kv.PageFloats() * 4; n != want {
			t.Fatalf("device range of %d bytes, want %d", n, want)
		}
		r, err := Listen("127.0.0.1:0", sink, kv, WithDeviceMemory(addr, n, false))
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSender()
		if err != nil {
			_ = r.Close()
			t.Fatal(err)
		}
		return r, s
	})
}

// A device range that is not whole pages, or comes with a Region too, is
// refused before anything is registered.
func TestDeviceMemoryRefused(t *testing.T) {
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: kernels.BF16}
	page := layout.PageFloats() * 4
	buf := make([]byte, 3*page)
	addr := uintptr(unsafe.Pointer(&buf[0]))
	for _, c := range []struct {
		name string
		opts []Option
	}{
		{"partial page", []Option{WithDeviceMemory(addr, 2*page+2, false)}},
		{"empty", []Option{WithDeviceMemory(addr, 0, false)}},
		{"nil address", []Option{WithDeviceMemory(0, page, false)}},
		{"with a region", []Option{WithDeviceMemory(addr, page, false), WithMemory(&Region{})}},
	} {
		if r, err := Listen("127.0.0.1:0", &nopSink{}, layout, c.opts...); err == nil {
			_ = r.Close()
			t.Errorf("%s: Listen accepted it", c.name)
		}
	}
}

// CUDAMemory answers from the UCX build; Debian's has no CUDA support,
// and the answer must not be an assumption either way.
func TestCUDAMemoryAsksUCX(t *testing.T) {
	got, err := CUDAMemory()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Transports()
	if err != nil {
		t.Fatal(err)
	}
	if cudaTLs := CUDATransports(rs); got != (len(cudaTLs) > 0) {
		t.Errorf("CUDAMemory() = %v, but the CUDA transports are %v", got, cudaTLs)
	}
	t.Logf("CUDA memory: %v", got)
}
