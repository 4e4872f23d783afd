package kernelstest

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/batonlm/baton/internal/kernels"
)

// Device turns a backend that reads host memory into one that holds the KV
// pool in memory of its own, as the GPU backend does: the PagedKV values
// its kernels get must carry a pool from its AllocKV, and everything else
// reaches that pool only a page at a time through kernels.DeviceKV. It lets
// the code around a GPU backend (the pool, transfers, decode's checks) run
// in tests on machines without one.
type Device struct {
	kernels.Backend
}

var _ kernels.KVAllocator = Device{}

// Name implements kernels.Backend.
func (d Device) Name() string { return "device(" + d.Backend.Name() + ")" }

// AllocKV implements kernels.KVAllocator.
func (d Device) AllocKV(layout kernels.PagedKV, pages int) (kernels.DeviceKV, error) {
	if pages <= 0 || layout.PageFloats() <= 0 {
		return nil, fmt.Errorf("kernelstest: KV pool of %d pages of %+v", pages, layout)
	}
	layout.Device = nil
	layout.Data = make([]float32, pages*layout.PageFloats())
	return &Memory{host: layout}, nil
}

// StoreKV implements kernels.Backend.
func (d Device) StoreKV(kv kernels.PagedKV, layer int, slots []int32, k, v []float32) {
	d.Backend.StoreKV(own(kv), layer, slots, k, v)
}

// Attention implements kernels.Backend.
func (d Device) Attention(out, q []float32, kv kernels.PagedKV, layer int, seqs []kernels.AttnSeq, heads int, scale float32) {
	d.Backend.Attention(out, q, own(kv), layer, seqs, heads, scale)
}

func own(kv kernels.PagedKV) kernels.PagedKV {
	m, ok := kv.Device.(*Memory)
	if !ok || kv.Data != nil {
		panic("kernelstest: Device kernels need a pool from its AllocKV")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		panic("kernelstest: KV pool used after Close")
	}
	return m.host
}

// Memory is a Device's KV pool. The counters say how often each page
// operation ran; FailReads makes ReadPage fail, as a device that has
// failed would.
type Memory struct {
	mu     sync.Mutex
	host   kernels.PagedKV
	closed bool

	Reads, Writes, Fills atomic.Int64
	FailReads            atomic.Bool
}

func (m *Memory) check(page int32, tokens int) error {
	if m.closed {
		return errors.New("kernelstest: KV pool used after Close")
	}
	if page < 0 || int(page) >= m.host.Pages() || tokens < 0 || tokens > m.host.PageSize {
		return fmt.Errorf("kernelstest: %d tokens of page %d of a pool of %d", tokens, page, m.host.Pages())
	}
	return nil
}

// Pages implements kernels.DeviceKV.
func (m *Memory) Pages() int { return m.host.Pages() }

// ReadPage implements kernels.DeviceKV.
func (m *Memory) ReadPage(page int32, tokens int, dst []byte) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(page, tokens); err != nil {
		return dst, err
	}
	if m.FailReads.Load() {
		return dst, errors.New("kernelstest: device read failed")
	}
	m.Reads.Add(1)
	return kernels.PackPage(m.host, page, tokens, dst), nil
}

// WritePage implements kernels.DeviceKV.
func (m *Memory) WritePage(page int32, tokens int, src []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(page, tokens); err != nil {
		return err
	}
	m.Writes.Add(1)
	return kernels.UnpackPage(m.host, page, tokens, src)
}

// Fill implements kernels.DeviceKV.
func (m *Memory) Fill(pages []int32, v float32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range pages {
		if err := m.check(p, 0); err != nil {
			return err
		}
	}
	m.Fills.Add(1)
	pf := m.host.PageFloats()
	fill := func(s []float32) {
		for i := range s {
			s[i] = v
		}
	}
	if pages == nil {
		fill(m.host.Data)
	}
	for _, p := range pages {
		fill(m.host.Data[int(p)*pf : int(p+1)*pf])
	}
	return nil
}

// Close implements kernels.DeviceKV.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// Snapshot is a copy of the whole pool, for tests that inspect it.
func (m *Memory) Snapshot() []float32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]float32(nil), m.host.Data...)
}
