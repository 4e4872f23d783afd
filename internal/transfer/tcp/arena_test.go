package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// A session that sends staged pages to a receiver that takes none hears
// why at its flush: the refusal names the transport, and nothing landed.
func TestStagedPagesRefusedWithoutImporter(t *testing.T) {
	sink := &recSink{}
	r, err := Listen("127.0.0.1:0", sink)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	key := transfer.Key{Room: 1, Epoch: 2, Cap: transfer.NewCapability()}
	h, text := stagedSession(t, r.Addr(), key)
	if h.typ != frameAck || h.b != 0 || !strings.Contains(string(text), "not cuda-ipc") {
		t.Fatalf("ack type %d, %d bytes landed, text %q; want a refusal naming cuda-ipc and nothing landed", h.typ, h.b, text)
	}
	if writes, _ := sink.counts(key); writes != 0 {
		t.Fatalf("%d writes reached the Sink", writes)
	}
}

// A session sends only the pages it staged itself.
func TestForeignStagedRefused(t *testing.T) {
	sink := &recSink{}
	r, err := Listen("127.0.0.1:0", sink)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snd := NewSender()
	k := transfer.Key{Room: 1, Epoch: 1, Cap: transfer.NewCapability()}
	s1, err := snd.Open(t.Context(), r.Addr(), k)
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	other := &Session{}
	if err := s1.Write(transfer.PageWrite{Index: 0, Page: 0, Tokens: 1, Src: stagedRef{s: other}}); err == nil {
		t.Fatal("a page staged by another session was taken")
	}
}

// countingImporter counts the arenas a receiver tries to map; it maps
// none (a refused session must not get that far).
type countingImporter struct{ opens atomic.Int32 }

func (c *countingImporter) OpenPeer([]byte) (kernels.PeerMemory, error) {
	c.opens.Add(1)
	return nil, errors.New("no arena here")
}

// refusingSink admits no session.
type refusingSink struct{ recSink }

func (*refusingSink) Admit(transfer.Key) ([]int32, error) {
	return nil, errors.New("no such reservation")
}

// A session decode did not admit (a wrong capability, a stale epoch) never
// makes the receiver map the arena it names: the handle is not even
// opened, and its pages are refused with the session.
func TestRefusedSessionMapsNoArena(t *testing.T) {
	imp := &countingImporter{}
	sink := &refusingSink{}
	r, err := Listen("127.0.0.1:0", sink, WithPeerImporter(imp))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	key := transfer.Key{Room: 1, Epoch: 2, Cap: transfer.NewCapability()}
	h, text := stagedSession(t, r.Addr(), key)
	if h.typ != frameAck || !strings.Contains(string(text), "session refused") {
		t.Fatalf("ack type %d, text %q; want the session's refusal", h.typ, text)
	}
	if n := imp.opens.Load(); n != 0 {
		t.Fatalf("a refused session made the receiver open %d arenas", n)
	}
	if writes, _ := sink.counts(key); writes != 0 {
		t.Fatalf("%d writes reached the Sink", writes)
	}
}

// stagedSession speaks one session to the receiver at addr in raw frames:
// HELLO for key, an arena, a staged page and a flush; it returns the ack.
func stagedSession(t *testing.T, addr string, key transfer.Key) (header, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, _, err := (transfer.Plain{}).Open(conn, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(join(frame(frameHello, capSize, key.Room, key.Epoch, 0, key.Cap[:]),
		frame(frameArena, 64, 0, 0, 0, make([]byte, 64)),
		frame(frameRef, refSize, 0, 3, 1, make([]byte, refSize)),
		frame(frameFlush, 0, 1, 0, 0, nil))); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [hdrSize]byte
	h, text, _, err := readFrame(bufio.NewReader(conn), &hdr, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return h, text
}

// countingMemory stands in for a mapped arena (GPU memory is absent
// here): it counts the copies asked of it.
type countingMemory struct{ copies atomic.Int32 }

func (*countingMemory) Size() int { return 1 << 20 }
func (m *countingMemory) CopyPage(int32, int, int) error {
	m.copies.Add(1)
	return nil
}
func (m *countingMemory) QueuePage(int32, int, int) error {
	m.copies.Add(1)
	return nil
}
func (*countingMemory) Drain() error { return nil }
func (*countingMemory) Close() error { return nil }

// A staged page lands only in the pool that mapped its arena: handed
// another pool (or host memory) it copies nothing and says why.
func TestStagedPageLandsOnlyInItsPool(t *testing.T) {
	mem := &countingMemory{}
	p := peerPage{into: &countingImporter{}, mem: mem, landed: new(int)}
	kv := kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8, Data: make([]float32, 64)}
	if _, err := p.Land(kv, 0, 1); err == nil || mem.copies.Load() != 0 {
		t.Fatalf("a staged page landed in host memory (err %v, %d copies)", err, mem.copies.Load())
	}
}

// mappingImporter maps every handle to one countingMemory.
type mappingImporter struct{ mem countingMemory }

func (m *mappingImporter) OpenPeer([]byte) (kernels.PeerMemory, error) { return &m.mem, nil }

// A session names one arena: a second ARENA frame is a protocol error that
// ends the connection, and the session's later pages copy nothing.
func TestSecondArenaEndsTheSession(t *testing.T) {
	imp := &mappingImporter{}
	sink := &recSink{}
	r, err := Listen("127.0.0.1:0", sink, WithPeerImporter(imp))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	conn, err := net.Dial("tcp", r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, _, err := (transfer.Plain{}).Open(conn, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	key := transfer.Key{Room: 1, Epoch: 2, Cap: transfer.NewCapability()}
	arena := frame(frameArena, 64, 0, 0, 0, make([]byte, 64))
	if _, err := conn.Write(join(frame(frameHello, capSize, key.Room, key.Epoch, 0, key.Cap[:]), arena, arena,
		frame(frameRef, refSize, 0, 3, 1, make([]byte, refSize)))); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the receiver did not end the connection: %v", err)
	}
	if writes, _ := sink.counts(key); writes != 0 || imp.mem.copies.Load() != 0 {
		t.Fatalf("%d writes, %d copies after a second ARENA", writes, imp.mem.copies.Load())
	}
}
