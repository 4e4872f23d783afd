//go:build !ucx

package ucx

import (
	"context"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// Enabled reports whether this binary has the UCX transport (-tags ucx).
const Enabled = false

// Region is memory from AllocKV. Without UCX there is none.
type Region struct{}

// AllocKV needs UCX; see the ucx build.
func AllocKV(floats int, opts ...Option) (*Region, error) { return nil, ErrNotBuilt }

// Floats is the region's memory.
func (r *Region) Floats() []float32 { return nil }

// Free releases the region.
func (r *Region) Free() error { return nil }

// Receiver is the decode side; without UCX it cannot be made.
type Receiver struct{}

var _ transfer.Receiver = (*Receiver)(nil)

// Listen needs UCX; see the ucx build.
func Listen(addr string, sink transfer.Sink, kv kernels.PagedKV, opts ...Option) (*Receiver, error) {
	return nil, ErrNotBuilt
}

// Addr is where senders connect.
func (r *Receiver) Addr() string { return "" }

// Close stops the receiver.
func (r *Receiver) Close() error { return nil }

// OneSided implements transfer.OneSided.
func (r *Receiver) OneSided() bool { return true }

// Sender is the prefill side; without UCX it cannot be made.
type Sender struct{}

var _ transfer.Sender = (*Sender)(nil)

// NewSender needs UCX; see the ucx build.
func NewSender(opts ...Option) (*Sender, error) { return nil, ErrNotBuilt }

// Open needs UCX.
func (s *Sender) Open(context.Context, string, transfer.Key) (transfer.Session, error) {
	return nil, ErrNotBuilt
}

// Close stops the sender.
func (s *Sender) Close() error { return nil }

// Transports needs UCX; see the ucx build.
func Transports(opts ...Option) ([]Resource, error) { return nil, ErrNotBuilt }

// CUDAMemory needs UCX; see the ucx build.
func CUDAMemory(opts ...Option) (bool, error) { return false, ErrNotBuilt }
