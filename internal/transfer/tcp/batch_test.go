package tcp

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/arenaspace"
)

// The receiver lands the staged pages (REF frames) it has buffered as one
// batch: each through the Sink's gate, the copies queued without a wait,
// and one drain for them all before it reads on from the socket,
// acknowledges a flush or ends the session.

// landSink is a decode side in miniature for staged pages: one
// reservation, pages[i] at index i, every write checked against it before
// it lands in kv. It logs, into log, what it lands and its Closed call.
type landSink struct {
	kv     kernels.PagedKV
	pages  []int32
	log    *callLog
	proofs []string
	// onWrite, if set, sees each write before it lands.
	onWrite func(transfer.PageWrite)
}

func (s *landSink) Admit(transfer.Key) ([]int32, error) { return slices.Clone(s.pages), nil }

func (s *landSink) Write(_ transfer.Key, w transfer.PageWrite) error {
	if w.Index < 0 || w.Index >= len(s.pages) || s.pages[w.Index] != w.Page {
		return fmt.Errorf("page %d is not index %d of the reservation", w.Page, w.Index)
	}
	if s.onWrite != nil {
		s.onWrite(w)
	}
	_, err := transfer.Land(s.kv, w)
	return err
}

func (s *landSink) Closed(_ transfer.Key, proof string) {
	s.log.add("closed")
	s.proofs = append(s.proofs, proof) // Closed comes once, after the connection's goroutine is done
}

// callLog records calls in order, from several goroutines.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) add(c string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls = append(l.calls, c)
}

func (l *callLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.calls, " ")
}

// logPool stands in for a GPU pool that maps arenas (there is no GPU
// here): its mapped arena logs each copy queued and each drain, and a
// drain takes a while, so anything the receiver does before a drain it
// skipped shows up ahead of the drain in the log.
type logPool struct {
	kernels.DeviceKV // only its identity is used: peerPage lands in the pool that mapped
	log              *callLog
	// drainErr fails every drain.
	drainErr error
}

func (p *logPool) OpenPeer([]byte) (kernels.PeerMemory, error) {
	return logMemory{p.log, p.drainErr}, nil
}

type logMemory struct {
	log      *callLog
	drainErr error
}

func (logMemory) Size() int { return 1 << 20 }
func (m logMemory) QueuePage(page int32, _, _ int) error {
	m.log.add(fmt.Sprintf("queue%d", page))
	return nil
}
func (m logMemory) Drain() error {
	time.Sleep(100 * time.Millisecond)
	m.log.add("drain")
	return m.drainErr
}
func (m logMemory) CopyPage(int32, int, int) error {
	m.log.add("copy")
	return nil
}
func (logMemory) Close() error { return nil }

// rawSession opens a connection to addr and sends frames in one write, so
// the receiver finds them buffered together.
func rawSession(t *testing.T, addr string, frames ...[]byte) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, _, err := (transfer.Plain{}).Open(conn, time.Now().Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(join(frames...)); err != nil {
		t.Fatal(err)
	}
	return conn
}

func refFrame(index int, page int32, tokens, off int) []byte {
	var p [refSize]byte
	binary.LittleEndian.PutUint64(p[:], uint64(off))
	return frame(frameRef, refSize, uint64(index), uint64(int64(page)), uint64(tokens), p[:])
}

func readAck(t *testing.T, conn net.Conn) (header, string) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hdr [hdrSize]byte
	h, text, _, err := readFrame(bufio.NewReader(conn), &hdr, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	return h, string(text)
}

// The copies of a batch are drained before the flush is acknowledged,
// before the receiver waits on the socket for more, and before the session
// is reported Closed, also when the session ends on a protocol error in
// the middle of a batch. (Deleting any one of those drains fails a case.)
func TestStagedBatchDrainedBeforeItCounts(t *testing.T) {
	layout := kernels.PagedKV{PageSize: 4, Layers: 1, KVHeads: 1, HeadDim: 8}
	key := transfer.Key{Room: 1, Epoch: 2, Cap: transfer.NewCapability()}
	hello := frame(frameHello, capSize, key.Room, key.Epoch, 0, key.Cap[:])
	arena := frame(frameArena, 64, 0, 0, 0, make([]byte, 64))
	refs := join(refFrame(0, 5, 4, 0), refFrame(1, 6, 4, 256), refFrame(2, 7, 2, 512))
	setup := func(t *testing.T, drainErr ...error) (*Receiver, *callLog) {
		log := &callLog{}
		pool := &logPool{log: log}
		if len(drainErr) > 0 {
			pool.drainErr = drainErr[0]
		}
		kv := layout
		kv.Device = pool
		r, err := Listen("127.0.0.1:0", &landSink{kv: kv, pages: []int32{5, 6, 7}, log: log}, WithPeerImporter(pool))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r, log
	}
	const batch = "queue5 queue6 queue7 drain"

	t.Run("flush", func(t *testing.T) {
		r, log := setup(t)
		conn := rawSession(t, r.Addr(), hello, arena, refs, frame(frameFlush, 0, 1, 0, 0, nil))
		h, text := readAck(t, conn)
		if got := log.String(); got != batch || text != "" || h.b != uint64(2*layout.PackedBytes(4)+layout.PackedBytes(2)) {
			t.Fatalf("at the ack (%q, %d bytes): %q; want %q", text, h.b, got, batch)
		}
	})
	t.Run("idle", func(t *testing.T) {
		r, log := setup(t)
		rawSession(t, r.Addr(), hello, arena, refs)
		deadline := time.Now().Add(5 * time.Second)
		for log.String() != batch && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if got := log.String(); got != batch {
			t.Fatalf("a receiver waiting for more frames left its batch undrained: %q", got)
		}
	})
	t.Run("error", func(t *testing.T) {
		r, log := setup(t)
		conn := rawSession(t, r.Addr(), hello, arena, refs, arena) // a second ARENA ends the session
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(io.Discard, conn)
		_ = r.Close() // joins the connection's goroutine, Closed and all
		if got, want := log.String(), batch+" closed"; got != want {
			t.Fatalf("a session that ended mid-batch: %q; want %q", got, want)
		}
	})
	t.Run("failed", func(t *testing.T) {
		// A drain that fails fails the session: the flush hears why, the
		// connection ends, and Closed's proof says so.
		r, log := setup(t, errors.New("device lost"))
		conn := rawSession(t, r.Addr(), hello, arena, refs, frame(frameFlush, 0, 1, 0, 0, nil))
		if _, text := readAck(t, conn); !strings.Contains(text, "device lost") {
			t.Fatalf("ack %q; want the failed copies", text)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, bufio.NewReader(conn)); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the receiver did not end the session: %v", err)
		}
		_ = r.Close()
		sink := r.sink.(*landSink)
		if got := log.String(); got != batch+" closed" || len(sink.proofs) != 1 || !strings.Contains(sink.proofs[0], "device lost") {
			t.Fatalf("%q, proofs %q; want the session closed on the failed copies", got, sink.proofs)
		}
	})
	t.Run("eof", func(t *testing.T) {
		r, log := setup(t)
		conn := rawSession(t, r.Addr(), hello, arena, refs)
		_ = conn.(*net.TCPConn).CloseWrite()
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(io.Discard, conn) // the receiver's end of session
		if got := log.String(); !strings.HasPrefix(got, batch) {
			t.Fatalf("the receiver confirmed the end of a session with copies in flight: %q", got)
		}
		_ = r.Close()
		if got, want := log.String(), batch+" closed"; got != want {
			t.Fatalf("%q; want %q", got, want)
		}
	})
}

// stagedPools is a prefill pool with pages full of distinct rows, an
// arena they are staged in at offsets offs, and a decode pool, poisoned,
// that maps the arena through a receiver whose sink takes pages into
// reservation order pages.
type stagedPools struct {
	src, dst kernels.PagedKV
	offs     []int
	r        *Receiver
	handle   []byte
}

func newStagedPools(t *testing.T, n int, pages []int32) *stagedPools {
	be := fakeCUDA(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: kernels.BF16}
	sp := &stagedPools{src: layout, dst: layout}
	var err error
	if sp.src.Device, err = be.AllocKV(layout, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.src.Device.Close() })
	if sp.dst.Device, err = be.AllocKV(layout, 2*n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.dst.Device.Close() })
	if err := sp.dst.Device.Fill(nil, kernels.KVNaN); err != nil {
		t.Fatal(err)
	}
	size := layout.PackedBytes(4)
	stride := (size + arenaspace.Align - 1) / arenaspace.Align * arenaspace.Align
	row := make([]byte, size)
	src := make([]int32, n)
	tokens := make([]int, n)
	for p := range n {
		for i := range row {
			row[i] = byte(i*7 + p*13)
		}
		if err := sp.src.Device.WritePage(int32(p), 4, row); err != nil {
			t.Fatal(err)
		}
		src[p], tokens[p] = int32(p), 4
		sp.offs = append(sp.offs, p*stride)
	}
	ar, err := sp.src.Device.(kernels.PeerExporter).NewArena(n * stride)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ar.Close() })
	if st, err := ar.Stage(src, tokens, sp.offs); err != nil {
		t.Fatal(err)
	} else if _, err := st.Wait(); err != nil {
		t.Fatal(err)
	}
	sp.handle = ar.Handle()
	sp.r, err = Listen("127.0.0.1:0", &landSink{kv: sp.dst, pages: pages, log: &callLog{}},
		WithPeerImporter(sp.dst.Device.(kernels.PeerImporter)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sp.r.Close() })
	return sp
}

// session sends HELLO, the arena, one REF per page (page i of the
// prefill pool into decode page into[i] at index i) and a flush, in one
// write, and returns the ack's text.
func (sp *stagedPools) session(t *testing.T, into []int32) string {
	key := transfer.Key{Room: 1, Epoch: 2, Cap: transfer.NewCapability()}
	frames := [][]byte{frame(frameHello, capSize, key.Room, key.Epoch, 0, key.Cap[:]),
		frame(frameArena, len(sp.handle), 0, 0, 0, sp.handle)}
	for i, p := range into {
		frames = append(frames, refFrame(i, p, 4, sp.offs[i]))
	}
	frames = append(frames, frame(frameFlush, 0, 1, 0, 0, nil))
	_, text := readAck(t, rawSession(t, sp.r.Addr(), frames...))
	return text
}

// page reads page p of kv back.
func page(t *testing.T, kv kernels.PagedKV, p int32) []byte {
	t.Helper()
	b, err := kv.Device.ReadPage(p, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A batch of staged pages costs the decode pool one synchronise, not one
// a page.
func TestStagedBatchOneSynchronise(t *testing.T) {
	const n = 8
	into := make([]int32, n)
	for i := range into {
		into[i] = int32(n + i)
	}
	sp := newStagedPools(t, n, into)
	before, _ := syncsOf(sp.dst)
	if text := sp.session(t, into); text != "" {
		t.Fatalf("refused: %s", text)
	}
	if after, _ := syncsOf(sp.dst); after-before != 1 {
		got := after - before
		t.Fatalf("%d pages landed with %d synchronises of the decode pool's stream; want 1", n, got)
	}
	for i, p := range into {
		if !bytes.Equal(page(t, sp.dst, p), page(t, sp.src, int32(i))) {
			t.Fatalf("page %d did not land in decode page %d", i, p)
		}
	}
}

// A page the gate refuses in the middle of a batch writes nothing; the
// pages around it land, and the flush reports the refusal.
func TestStagedBatchRefusedPageInTheMiddle(t *testing.T) {
	const n = 5
	pages := []int32{5, 6, 7, 8, 9}
	sp := newStagedPools(t, n, pages)
	into := slices.Clone(pages)
	into[2] = 3 // not the reservation's page at index 2
	text := sp.session(t, into)
	if !strings.Contains(text, "index 2") {
		t.Fatalf("ack %q; want the refusal of index 2", text)
	}
	// What a poisoned page packs to: kernels.KVNaN's bits in every word
	// (its two halves are alike, so any bf16 row reads them).
	poison := make([]byte, sp.dst.PackedBytes(4))
	for i := 0; i < len(poison); i += 4 {
		binary.LittleEndian.PutUint32(poison[i:], math.Float32bits(kernels.KVNaN))
	}
	for i, p := range into {
		got := page(t, sp.dst, p)
		switch {
		case i == 2 && !bytes.Equal(got, poison):
			t.Fatalf("the refused page wrote into decode page %d", p)
		case i != 2 && !bytes.Equal(got, page(t, sp.src, int32(i))):
			t.Fatalf("page %d, beside the refused one, did not land in decode page %d", i, p)
		}
	}
	if got := page(t, sp.dst, pages[2]); !bytes.Equal(got, poison) {
		t.Fatalf("decode page %d, whose write was refused, holds something", pages[2])
	}
}

// syncsOf is a GPU pool's count of stream synchronises and event waits.
func syncsOf(kv kernels.PagedKV) (stream, event int) {
	return kv.Device.(interface{ Synchronizes() (int, int) }).Synchronizes()
}

// Staging on the prefill side does not wait for the device: StagePages
// returns with the packs only queued (no synchronise, no event wait), and
// a page's REF reaches the receiver only after the sender waited for the
// packing's event (Session.Write waits; deleting that wait fails this).
func TestStagedPagesSentAfterTheirPack(t *testing.T) {
	be := fakeCUDA(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: kernels.BF16}
	src, dst := layout, layout
	var err error
	if src.Device, err = be.AllocKV(layout, 4); err != nil {
		t.Fatal(err)
	}
	defer src.Device.Close()
	row := make([]byte, layout.PackedBytes(4))
	for p := range int32(4) {
		for i := range row {
			row[i] = byte(i*5 + int(p)*11)
		}
		if err := src.Device.WritePage(p, 4, row); err != nil {
			t.Fatal(err)
		}
	}
	if dst.Device, err = be.AllocKV(layout, 4); err != nil {
		t.Fatal(err)
	}
	defer dst.Device.Close()
	arena, err := src.Device.(kernels.PeerExporter).NewArena(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	var mu sync.Mutex
	var seen []int // the prefill pool's event waits as each REF arrived
	sink := &landSink{kv: dst, pages: []int32{0, 1, 2}, log: &callLog{}, onWrite: func(transfer.PageWrite) {
		_, e := syncsOf(src)
		mu.Lock()
		seen = append(seen, e)
		mu.Unlock()
	}}
	r, err := Listen("127.0.0.1:0", sink, WithPeerImporter(dst.Device.(kernels.PeerImporter)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	sess, err := NewSender(WithArena(arena)).Open(t.Context(), r.Addr(), transfer.Key{Room: 1, Epoch: 1, Cap: transfer.NewCapability()})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()

	s0, e0 := syncsOf(src)
	tokens := []int{4, 4, 3}
	st, err := transfer.StagePages(sess, src, []int32{3, 2, 1}, tokens)
	if err != nil || st.Srcs == nil || st.Pending == nil {
		t.Fatalf("staging: %v (staged %v, pending %v)", err, st.Srcs != nil, st.Pending != nil)
	}
	if s, e := syncsOf(src); s != s0 || e != e0 {
		t.Fatalf("StagePages waited for the device: %d stream synchronises, %d event waits", s-s0, e-e0)
	}
	for j := range tokens {
		if err := sess.Write(st.Write(j, j, int32(j), tokens[j])); err != nil {
			t.Fatal(err)
		}
	}
	if err := sess.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 || slices.Min(seen) != e0+1 {
		t.Fatalf("event waits of the prefill pool as the REFs arrived: %v; want 3 REFs, each after the one wait (%d)", seen, e0+1)
	}
	if s, _ := syncsOf(src); s != s0 {
		t.Fatalf("sending staged pages synchronised the prefill pool's stream %d times", s-s0)
	}
	sums, err := st.Wait()
	if err != nil {
		t.Fatal(err)
	}
	for j, p := range []int32{3, 2, 1} {
		rows, err := src.Device.ReadPage(p, tokens[j], nil)
		if err != nil {
			t.Fatal(err)
		}
		if sums[j] != kernels.PageSum(rows) {
			t.Fatalf("page %d summed %#x, PageSum of its rows %#x", p, sums[j], kernels.PageSum(rows))
		}
		if got, err := dst.Device.ReadPage(int32(j), tokens[j], nil); err != nil || !bytes.Equal(got, rows) {
			t.Fatalf("page %d did not land in decode page %d", p, j)
		}
	}
}
