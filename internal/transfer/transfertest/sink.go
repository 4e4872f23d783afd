package transfertest

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// sink is a decode side in miniature: a real paged KV buffer, poisoned
// with NaN like a pool run with --kv-poison, and a table of live
// reservations that every write is checked against before a byte of it
// reaches a page. It also records what the suite asserts on: accepted
// writes, Closed calls and their order.
type sink struct {
	kv    kernels.PagedKV
	delay time.Duration
	// src is the prefill side's pool writes are staged from, when both
	// are in device memory (Options.Device).
	src kernels.PagedKV

	// entered counts payload bytes handed to Write, before the delay: what
	// the transport has let go of.
	entered atomic.Int64

	mu         sync.Mutex
	res        map[transfer.Key][]int32
	accepted   map[transfer.Key]int
	bytes      map[transfer.Key]int64
	closed     map[transfer.Key][]string
	violations []string
	// unpack is false for the backpressure test, whose pages are large
	// and only counted.
	unpack bool
}

func newSink(kv kernels.PagedKV) *sink {
	poisonKV(kv)
	return &sink{
		kv:       kv,
		res:      make(map[transfer.Key][]int32),
		accepted: make(map[transfer.Key]int),
		bytes:    make(map[transfer.Key]int64),
		closed:   make(map[transfer.Key][]string),
		unpack:   true,
	}
}

// KV is the buffer pages land in, for transports that register the decode
// side's memory rather than copy through Write.
func (s *sink) KV() kernels.PagedKV { return s.kv }

// Source is the pool writes are staged from (Options.Device).
func (s *sink) Source() kernels.PagedKV { return s.src }

// poison fills the whole buffer with NaN again.
func (s *sink) poison() {
	s.mu.Lock()
	defer s.mu.Unlock()
	poisonKV(s.kv)
}

// poisonKV makes every element of kv a NaN, in any dtype (kernels.KVNaN).
func poisonKV(kv kernels.PagedKV) {
	if kv.Device != nil {
		if err := kv.Device.Fill(nil, kernels.KVNaN); err != nil {
			panic("transfertest: poisoning the device pool: " + err.Error())
		}
		return
	}
	for i := range kv.Data {
		kv.Data[i] = kernels.KVNaN
	}
}

// Admit implements transfer.Sink: a receiver asks it before the session's
// first write (a one-sided one before its sender gets the means to write).
// The reservation's key includes its capability, so a session that names
// the room and epoch with another capability is refused here.
func (s *sink) Admit(k transfer.Key) ([]int32, error) {
	k = k.Reservation()
	s.mu.Lock()
	defer s.mu.Unlock()
	pages, ok := s.res[k]
	if !ok {
		return nil, fmt.Errorf("no live reservation for %v", k)
	}
	return append([]int32(nil), pages...), nil
}

func (s *sink) reserve(k transfer.Key, pages []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.res[k] = append([]int32(nil), pages...)
}

func (s *sink) Write(k transfer.Key, w transfer.PageWrite) error {
	k = k.Reservation()
	size := len(w.Data)
	if w.Src != nil {
		size = transfer.PackedSize(s.kv, w.Tokens)
	}
	s.entered.Add(int64(size))
	if s.delay > 0 {
		time.Sleep(s.delay)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.closed[k]) > 0 {
		s.violations = append(s.violations, fmt.Sprintf("Write for %v (page %d) after its session was Closed", k, w.Page))
	}
	pages, ok := s.res[k]
	switch {
	case !ok:
		return fmt.Errorf("no live reservation for %v", k)
	case w.Index < 0 || w.Index >= len(pages):
		return fmt.Errorf("index %d outside the %d-page reservation %v", w.Index, len(pages), k)
	case pages[w.Index] != w.Page:
		return fmt.Errorf("page %d is not index %d of %v (that is page %d)", w.Page, w.Index, k, pages[w.Index])
	case w.Tokens < 1 || w.Tokens > s.kv.PageSize:
		return fmt.Errorf("%d tokens for a page of %d", w.Tokens, s.kv.PageSize)
	}
	if s.unpack {
		n, err := transfer.Land(s.kv, w)
		if err != nil {
			return err
		}
		size = n
	} else if w.Src == nil && len(w.Data) != transfer.PackedSize(s.kv, w.Tokens) {
		return fmt.Errorf("payload of %d bytes for %d tokens", len(w.Data), w.Tokens)
	}
	s.accepted[k]++
	s.bytes[k] += int64(size)
	return nil
}

func (s *sink) Closed(k transfer.Key, proof string) {
	k = k.Reservation()
	s.mu.Lock()
	defer s.mu.Unlock()
	if proof == "" {
		s.violations = append(s.violations, fmt.Sprintf("Closed for %v with an empty proof", k))
	}
	s.closed[k] = append(s.closed[k], proof)
}

func (s *sink) acceptedOf(k transfer.Key) (int, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.accepted[k], s.bytes[k]
}

func (s *sink) closedOf(k transfer.Key) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.closed[k]...)
}

func (s *sink) takeViolations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.violations
	s.violations = nil
	return v
}

// snapshot copies the KV buffer under the lock, so it is consistent with
// the writes counted so far.
func (s *sink) snapshot() []float32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kv.Device == nil {
		return append([]float32(nil), s.kv.Data...)
	}
	// A device pool, read back page by page into the host layout.
	host := s.kv
	host.Device = nil
	host.Data = make([]float32, s.kv.Device.Pages()*s.kv.PageFloats())
	var buf []byte
	for p := range int32(s.kv.Device.Pages()) {
		var err error
		if buf, err = transfer.ReadPage(s.kv, p, s.kv.PageSize, buf); err == nil {
			err = transfer.Unpack(host, p, s.kv.PageSize, buf)
		}
		if err != nil {
			panic(fmt.Sprintf("transfertest: reading device page %d back: %v", p, err))
		}
	}
	return host.Data
}
