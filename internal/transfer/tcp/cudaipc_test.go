package tcp

import (
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

// The cuda-ipc transport (tcp with an arena and an importer) runs the
// conformance suite on the emulated CUDA driver: both pools in "GPU"
// memory, every page staged from the prefill pool into the arena and
// copied by the receiver out of the arena it mapped by handle, through
// the Sink's gate. The emulated driver maps the arena through shared
// memory, as another process would.

var (
	fakeOnce sync.Once
	fakeBe   *cuda.Backend
	fakeErr  error
)

func fakeCUDA(t *testing.T) *cuda.Backend {
	t.Helper()
	fakeOnce.Do(func() {
		dir, err := os.MkdirTemp("", "baton-tcp-fakecuda-")
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

func TestConformanceCUDAIPC(t *testing.T) {
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
		t.Cleanup(func() {
			_ = dst.Device.Close()
			_ = src.Device.Close()
		})
		return dst, src
	}
	transfertest.RunWith(t, transfertest.Options{Device: device}, func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender) {
		pools := sink.(interface {
			KV() kernels.PagedKV
			Source() kernels.PagedKV
		})
		imp, ok := pools.KV().Device.(kernels.PeerImporter)
		if !ok {
			t.Fatal("the cuda pool does not copy from a peer's arena")
		}
		exp, ok := pools.Source().Device.(kernels.PeerExporter)
		if !ok {
			t.Fatal("the cuda pool exports no arena")
		}
		arena, err := exp.NewArena(4 << 20)
		if err != nil {
			t.Fatal(err)
		}
		r, err := Listen("127.0.0.1:0", sink, WithPeerImporter(imp))
		if err != nil {
			t.Fatal(err)
		}
		// Closed after the receiver (Run closes it first), so no copy out
		// of the arena is left.
		t.Cleanup(func() { _ = arena.Close() })
		return r, NewSender(WithArena(arena), WithArenaQuarantine(50*time.Millisecond))
	})
}
