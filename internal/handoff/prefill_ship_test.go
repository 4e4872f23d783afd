package handoff

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// stagingSession stages on a "device" whose packs finish when done is
// closed, and records the pages written to it.
type stagingSession struct {
	fakeSession
	done chan struct{}
	err  error

	mu      sync.Mutex
	written []int
	waited  bool // a Wait had returned when a page was written
}

func (s *stagingSession) StagePages(_ kernels.PagedKV, pages []int32, _ []int) (transfer.Staged, error) {
	sums := make([]uint64, len(pages))
	for i, p := range pages {
		sums[i] = 1000 + uint64(p)
	}
	return transfer.Staged{Data: make([][]byte, len(pages)), Srcs: make([]transfer.PageSource, len(pages)),
		Pending: &gatedStaging{s: s, sums: sums}}, nil
}

func (s *stagingSession) Write(w transfer.PageWrite) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.waited {
		return errors.New("a staged page written before its staging was done")
	}
	s.written = append(s.written, w.Index)
	return nil
}

type gatedStaging struct {
	s    *stagingSession
	sums []uint64
}

func (g *gatedStaging) Wait() ([]uint64, error) {
	<-g.s.done
	g.s.mu.Lock()
	g.s.waited = true
	g.s.mu.Unlock()
	return g.sums, g.s.err
}

// The engine loop only queues a chunk's staging: onChunk returns while the
// device is still packing, and the shipper's goroutine waits for it before
// it writes the pages and records their checksums (read after finish).
func TestShipperWaitsOffTheEngineLoop(t *testing.T) {
	sess := &stagingSession{done: make(chan struct{})}
	s := newShipper(Ticket{Pages: []int32{20, 21, 22}}, 4, 10, sess, nil)
	local := []int32{5, 6, 7}
	returned := make(chan struct{})
	go func() {
		s.onChunk(kernels.PagedKV{}, local, 0, 8)
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("onChunk waited for the device's packs")
	}
	sess.mu.Lock()
	early := len(sess.written)
	sess.mu.Unlock()
	if early != 0 {
		t.Fatalf("%d pages written before their staging was done", early)
	}
	close(sess.done)
	s.onChunk(kernels.PagedKV{}, local, 8, 10)
	if err := s.finish(); err != nil {
		t.Fatal(err)
	}
	if want := []uint64{1005, 1006, 1007}; !slices.Equal(s.checksums, want) {
		t.Fatalf("checksums %v, want %v", s.checksums, want)
	}
	if !slices.Equal(sess.written, []int{0, 1, 2}) {
		t.Fatalf("pages written %v, want 0, 1, 2", sess.written)
	}
}

// A staging that failed on the device fails the shipment, and its pages
// are not written.
func TestShipperStagingFails(t *testing.T) {
	sess := &stagingSession{done: make(chan struct{}), err: errors.New("device lost")}
	close(sess.done)
	s := newShipper(Ticket{Pages: []int32{20, 21}}, 4, 8, sess, nil)
	s.onChunk(kernels.PagedKV{}, []int32{5, 6}, 0, 8)
	if err := s.finish(); err == nil || !strings.Contains(err.Error(), "device lost") {
		t.Fatalf("finish: %v; want the staging's failure", err)
	}
	if len(sess.written) != 0 {
		t.Fatalf("pages %v of a failed staging written", sess.written)
	}
}
