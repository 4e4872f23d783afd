//go:build ucx

package ucx

import (
	"testing"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

// kvOf is the conformance sink's buffer.
func kvOf(t *testing.T, sink transfer.Sink) kernels.PagedKV {
	t.Helper()
	ks, ok := sink.(interface{ KV() kernels.PagedKV })
	if !ok {
		t.Fatalf("sink %T has no KV()", sink)
	}
	return ks.KV()
}

// TestConformance runs the suite with the pool in Go memory that the
// receiver registers (UCX_TLS from the environment: CI runs it with
// posix,cma,self and with tcp).
func TestConformance(t *testing.T) {
	transfertest.Run(t, func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender) {
		r, s := listenAndSend(t, sink, kvOf(t, sink))
		t.Logf("receiver transports: %v", r.Transports())
		return r, s
	})
}

// TestConformanceAllocKV runs the suite with the pool in memory UCX
// allocated (AllocKV), which on one host is shared memory the sender
// writes with its own stores.
func TestConformanceAllocKV(t *testing.T) {
	regions := map[*float32]*Region{}
	alloc := func(t *testing.T, floats int) []float32 {
		r, err := AllocKV(floats)
		if err != nil {
			t.Fatal(err)
		}
		f := r.Floats()
		regions[&f[0]] = r
		// Registered after the harness's cleanup (which closes the
		// receiver), so it runs before it: free once the receiver is gone.
		return f
	}
	transfertest.RunWith(t, transfertest.Options{Alloc: alloc}, func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender) {
		kv := kvOf(t, sink)
		reg := regions[&kv.Data[0]]
		r, s := listenAndSend(t, sink, kv, WithMemory(reg))
		return r, s
	})
	for _, r := range regions {
		if err := r.Free(); err != nil {
			t.Error(err)
		}
	}
}
