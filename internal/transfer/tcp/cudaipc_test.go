package tcp

import (
	"testing"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/cuda/cudatest"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/arenaspace"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

// The cuda-ipc transport (tcp with an arena and an importer) runs the
// conformance suite on the emulated CUDA driver: both pools in "GPU"
// memory, every page staged from the prefill pool into the arena and
// copied by the receiver out of the arena it mapped by handle, through
// the Sink's gate. The emulated driver maps the arena through shared
// memory, as another process would.

// fakeCUDA is the shared backend on the emulated driver.
func fakeCUDA(t *testing.T) *cuda.Backend { return cudatest.Synchronous(t) }

func TestConformanceCUDAIPC(t *testing.T) {
	device := cudatest.Pools(fakeCUDA(t))
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

// A prompt that finds no room in the arena goes through the socket: its
// pages are read into host memory and summed there with the same
// function the device uses (kernels.PageSum), so the decode side's check
// is the same either way; the sender counts the fallback.
func TestArenaFullFallsBack(t *testing.T) {
	be := fakeCUDA(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: kernels.BF16}
	dk, err := be.AllocKV(layout, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer dk.Close()
	kv := layout
	kv.Device = dk
	row := make([]byte, kv.PackedBytes(4))
	for i := range row {
		row[i] = byte(i * 7)
	}
	for p := range int32(4) {
		if err := dk.WritePage(p, 4, row); err != nil {
			t.Fatal(err)
		}
	}
	arena, err := dk.(kernels.PeerExporter).NewArena(arenaspace.Align) // room for one page's span, not four
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	r, err := Listen("127.0.0.1:0", &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	snd := NewSender(WithArena(arena))
	sess, err := snd.Open(t.Context(), r.Addr(), transfer.Key{Room: 1, Epoch: 1, Cap: transfer.NewCapability()})
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	st, err := transfer.StagePages(sess, kv, []int32{0, 1, 2, 3}, []int{4, 4, 4, 2})
	if err != nil {
		t.Fatal(err)
	}
	if st.Srcs != nil {
		t.Fatal("four pages were staged in an arena with room for one")
	}
	for i, d := range st.Data {
		if st.Sums[i] != kernels.PageSum(d) {
			t.Fatalf("page %d went as bytes summed %#x, PageSum of them %#x", i, st.Sums[i], kernels.PageSum(d))
		}
	}
	if s := snd.ArenaStats(); s.FellBack != 1 || s.Staged != 0 {
		t.Fatalf("arena stats %+v; want one fallback and nothing staged", s)
	}
}

// A session whose connection ended before it closed (the receiver evicted
// it, or went away) gets no confirmation that the receiver's copies out of
// its arena bytes are over: they are quarantined, not reused at once, and
// come back after the quarantine. A session closed the ordinary way gives
// its bytes back at once.
func TestArenaQuarantineAfterLostSession(t *testing.T) {
	be := fakeCUDA(t)
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: kernels.BF16}
	dk, err := be.AllocKV(layout, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer dk.Close()
	kv := layout
	kv.Device = dk
	arena, err := dk.(kernels.PeerExporter).NewArena(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	// Long enough that a loaded machine still sees the bytes held between
	// the session's loss and the check below.
	snd := NewSender(WithArena(arena), WithArenaQuarantine(2*time.Second))
	all := snd.ArenaStats().FreeBytes
	stage := func(r *Receiver) transfer.Session {
		sess, err := snd.Open(t.Context(), r.Addr(), transfer.Key{Room: 1, Epoch: 1, Cap: transfer.NewCapability()})
		if err != nil {
			t.Fatal(err)
		}
		if st, err := transfer.StagePages(sess, kv, []int32{0, 1}, []int{4, 3}); err != nil || st.Srcs == nil {
			t.Fatalf("staging: %v (staged %v)", err, st.Srcs != nil)
		}
		return sess
	}

	r1, err := Listen("127.0.0.1:0", &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	sess := stage(r1)
	if err := sess.Close(); err != nil {
		t.Fatal(err)
	}
	if s := snd.ArenaStats(); s.FreeBytes != all || s.Quarantined != 0 {
		t.Fatalf("after a confirmed end: %+v, want every byte free (%d)", s, all)
	}

	r2, err := Listen("127.0.0.1:0", &recSink{})
	if err != nil {
		t.Fatal(err)
	}
	sess = stage(r2)
	_ = r2.Close() // the receiver goes first
	deadline := time.Now().Add(5 * time.Second)
	for sess.Flush(t.Context()) == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // until the sender sees the connection gone
	}
	_ = sess.Close()
	if s := snd.ArenaStats(); s.FreeBytes == all || s.Quarantined != 1 {
		t.Fatalf("after a lost session: %+v, want its bytes quarantined", s)
	}
	deadline = time.Now().Add(10 * time.Second)
	for snd.ArenaStats().FreeBytes != all && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if s := snd.ArenaStats(); s.FreeBytes != all {
		t.Fatalf("after the quarantine: %+v, want every byte free (%d)", s, all)
	}
}
