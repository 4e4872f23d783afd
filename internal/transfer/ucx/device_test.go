//go:build ucx

package ucx

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/cuda/cudatest"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/transfertest"
)

// The pool in GPU memory, registered with UCX in place (WithDeviceMemory):
// the conformance suite on the emulated CUDA driver, whose device memory
// is host memory, registered as such; on a GPU with a UCX built with CUDA
// the same path registers it as CUDA memory. Senders put straight into
// the decode pool, and what landed is read back from the device.

// fakeCUDA is the shared backend on the emulated driver.
func fakeCUDA(t *testing.T) *cuda.Backend { return cudatest.Synchronous(t) }

func TestConformanceDeviceMemory(t *testing.T) {
	device := cudatest.Pools(fakeCUDA(t))
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
		r, s := listenAndSend(t, sink, kv, WithDeviceMemory(addr, n, false))
		return r, s
	})
}

// Both pools in GPU memory and the sender staging into an arena
// (WithArena): pages are packed and summed on the device, put from the
// arena straight into the registered decode pool, and nothing is read
// back into host memory on either side (the arena is host-visible on the
// emulated driver and registered as such). The arena holds a few pages,
// so sessions that find it full fall back to host memory and PageSum.
func TestConformanceDeviceArena(t *testing.T) {
	device := cudatest.Pools(fakeCUDA(t))
	var senders []*Sender
	transfertest.RunWith(t, transfertest.Options{Device: device}, func(t *testing.T, sink transfer.Sink) (transfer.Receiver, transfer.Sender) {
		kv := kvOf(t, sink)
		addr, n, _ := kv.Device.(kernels.DeviceRange).Range()
		r, err := Listen("127.0.0.1:0", sink, kv, WithDeviceMemory(addr, n, false))
		if err != nil {
			t.Fatal(err)
		}
		src := sink.(interface{ Source() kernels.PagedKV }).Source()
		arena, err := src.Device.(kernels.PeerExporter).NewArena(8 * kv.PackedBytes(kv.PageSize))
		if err != nil {
			_ = r.Close()
			t.Fatal(err)
		}
		if _, _, hostVisible := arena.(kernels.DeviceRange).Range(); !hostVisible {
			t.Fatal("the emulated driver's arena is not host-visible")
		}
		s, err := NewSender(WithArena(arena))
		if err != nil {
			_ = r.Close()
			_ = arena.Close()
			t.Fatal(err)
		}
		senders = append(senders, s)
		// The sender unregisters the arena before it is freed.
		t.Cleanup(func() {
			_ = s.Close()
			_ = arena.Close()
		})
		return r, s
	})
	staged := 0
	for _, s := range senders {
		staged += s.ArenaStats().Staged
	}
	if staged == 0 {
		t.Fatal("no page was staged in an arena")
	}
}

// An arena that cannot tell its device address is refused by NewSender.
func TestArenaWithoutRange(t *testing.T) {
	if s, err := NewSender(WithArena(rangelessArena{})); err == nil {
		_ = s.Close()
		t.Fatal("NewSender took an arena without a device range")
	}
}

type rangelessArena struct{ kernels.Arena }

func (rangelessArena) Size() int { return 1 << 12 }

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

// A session stages into the arena only for a receiver that verifies with
// PageSum (a pool in device memory); Write waits for the staging itself
// and puts a full page and a partial one from the arena; Close, having
// flushed, gives the arena's bytes back at once. For a receiver in host
// memory (xxh3) the same pages go from host memory, summed with
// transfer.Checksum.
func TestArenaStagedSession(t *testing.T) { testArenaStagedSession(t, fakeCUDA(t)) }

// TestArenaStagedSessionDeferred is TestArenaStagedSession with streams
// that run their work only when it is waited for: a put that did not wait
// for its page's staging would read the arena before the pack ran.
func TestArenaStagedSessionDeferred(t *testing.T) { testArenaStagedSession(t, cudatest.Deferred(t)) }

func testArenaStagedSession(t *testing.T, be *cuda.Backend) {
	layout := kernels.PagedKV{PageSize: 4, Layers: 2, KVHeads: 2, HeadDim: 8, DType: kernels.BF16}
	src := layout
	var err error
	if src.Device, err = be.AllocKV(layout, 2); err != nil {
		t.Fatal(err)
	}
	defer src.Device.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	for p := range int32(2) {
		b := make([]byte, layout.PackedBytes(layout.PageSize))
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if err := src.Device.WritePage(p, layout.PageSize, b); err != nil {
			t.Fatal(err)
		}
	}
	arena, err := src.Device.(kernels.PeerExporter).NewArena(4 * layout.PackedBytes(layout.PageSize))
	if err != nil {
		t.Fatal(err)
	}
	defer arena.Close()
	snd, err := NewSender(WithArena(arena))
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	free := snd.ArenaStats().FreeBytes

	dev := layout
	if dev.Device, err = be.AllocKV(layout, 4); err != nil {
		t.Fatal(err)
	}
	defer dev.Device.Close()
	host := layout
	host.Data = make([]float32, 4*layout.PageFloats())

	pages, tokens := []int32{0, 1}, []int{4, 3} // a full page and a partial one
	into := []int32{2, 1}
	for _, c := range []struct {
		name   string
		kv     kernels.PagedKV
		opts   []Option
		staged bool
	}{
		{"device pool", dev, []Option{WithDeviceMemory(func() uintptr { a, _, _ := dev.Device.(kernels.DeviceRange).Range(); return a }(), 4*layout.PageFloats()*4, false)}, true},
		{"host pool", host, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := Listen("127.0.0.1:0", &nopSink{pages: into}, c.kv, c.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			sess, err := snd.Open(t.Context(), r.Addr(), transfer.Key{Room: 1, Epoch: 1, Cap: transfer.NewCapability()})
			if err != nil {
				t.Fatal(err)
			}
			staged, err := transfer.StagePages(sess, src, pages, tokens)
			if err != nil {
				t.Fatal(err)
			}
			if got := staged.Srcs != nil; got != c.staged {
				t.Fatalf("staged %v, want %v", got, c.staged)
			}
			if c.staged {
				// Another session may not put this session's staged
				// page: its arena span is released with this session,
				// and would then hand the next request's rows to it.
				other, err := snd.Open(t.Context(), r.Addr(), transfer.Key{Room: 2, Epoch: 1, Cap: transfer.NewCapability()})
				if err != nil {
					t.Fatal(err)
				}
				if err := other.Write(staged.Write(0, 0, into[0], tokens[0])); err == nil {
					t.Error("a page staged by one session was put by another")
				}
				_ = other.Close()
			}
			// Written before anyone waited for the staging: Write must.
			for i := range pages {
				if err := sess.Write(staged.Write(i, i, into[i], tokens[i])); err != nil {
					t.Fatal(err)
				}
			}
			if err := sess.Flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			sums, err := staged.Wait()
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range pages {
				want, err := transfer.ReadPage(src, p, tokens[i], nil)
				if err != nil {
					t.Fatal(err)
				}
				got, err := transfer.ReadPage(c.kv, into[i], tokens[i], nil)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("page %d (%d tokens) landed differently from what was staged", into[i], tokens[i])
				}
				sum := transfer.Checksum(want)
				if c.staged {
					sum = kernels.PageSum(want)
				}
				if sums[i] != sum {
					t.Errorf("page %d: sum %016x, want %016x", into[i], sums[i], sum)
				}
			}
			if err := sess.Close(); err != nil {
				t.Fatal(err)
			}
			st := snd.ArenaStats()
			if st.FreeBytes != free || st.Quarantined != 0 {
				t.Fatalf("after a flushed close: %+v, want all %d bytes free and nothing quarantined", st, free)
			}
			if c.staged && st.Staged != len(pages) {
				t.Fatalf("%d pages staged, want %d", st.Staged, len(pages))
			}
		})
	}
}
