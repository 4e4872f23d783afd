package cuda

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// CUDA IPC page arenas on the fake driver, which maps an exported
// allocation into another process through a memfd (testdata/fakecuda).
// The real driver refuses to open a handle in the process that made it,
// so only the two-process test also runs on a GPU.

var ipcDTypes = []kernels.DType{kernels.F32, kernels.F16, kernels.BF16}

// ipcLayout has rows of an odd number of halves, so f16 and bf16 pages
// are not a whole number of f32 words.
func ipcLayout(dt kernels.DType) kernels.PagedKV {
	return kernels.PagedKV{PageSize: 8, Layers: 2, KVHeads: 3, HeadDim: 5, DType: dt}
}

// ipcSource is a pool of b holding random pages, and its host copy.
func ipcSource(t *testing.T, b *Backend, dt kernels.DType, seed uint64) (*KVPool, kernels.PagedKV) {
	t.Helper()
	host := ipcLayout(dt)
	host.Data = randVec(rand.New(rand.NewPCG(seed, seed+1)), 4*host.PageFloats(), 1)
	return toDevice(t, b, host).Device.(*KVPool), host
}

// ipcPool is an empty (zeroed) pool of b, closed with the test.
func ipcPool(t *testing.T, b *Backend, dt kernels.DType) *KVPool {
	t.Helper()
	dk, err := b.AllocKV(ipcLayout(dt), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dk.Close() })
	return dk.(*KVPool)
}

// ipcPlan is a few pages of the source at offsets with gaps between them:
// full, partial and one-token pages and an empty one.
type ipcPlan struct {
	Pages   []int32
	Tokens  []int
	Offs    []int
	Targets []int32
	Bytes   int
}

func newIPCPlan(l kernels.PagedKV) ipcPlan {
	p := ipcPlan{Pages: []int32{2, 0, 3, 1, 2}, Tokens: []int{8, 3, 1, 0, 5}, Targets: []int32{1, 3, 0, 2, 2}}
	at := 2
	for _, n := range p.Tokens {
		p.Offs = append(p.Offs, at)
		at += l.PackedBytes(n) + 6
	}
	p.Bytes = at + 10
	return p
}

// wantAfter is the importer's pool after the plan's copies into a zeroed
// pool, in the host layout.
func (p ipcPlan) wantAfter(src kernels.PagedKV) []float32 {
	want := src
	want.Data = make([]float32, len(src.Data))
	for i, page := range p.Pages {
		if err := kernels.UnpackPage(want, p.Targets[i], p.Tokens[i], kernels.PackPage(src, page, p.Tokens[i], nil)); err != nil {
			panic(err)
		}
	}
	return want.Data
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: word %d is %#x, want %#x", what, i, math.Float32bits(got[i]), math.Float32bits(want[i]))
		}
	}
}

// poolData is kp's pages in the host layout.
func poolData(t *testing.T, kp *KVPool) []float32 {
	t.Helper()
	kv := kp.layout
	kv.Device = kp
	return fromDevice(t, kv)
}

// TestFakeIPCRoundTrip: pages staged in one backend's arena, mapped by
// another backend's pool and copied into its pages, are there bit for bit
// (every KV dtype, full, partial, one-token and empty pages, offsets with
// gaps), and nothing else of the importer's pool changes. Stage returns
// each page's PageSum, computed on the device.
func TestFakeIPCRoundTrip(t *testing.T) {
	exp, imp := fakeBackend(t), fakeBackend(t)
	for i, dt := range ipcDTypes {
		src, host := ipcSource(t, exp, dt, uint64(70+i))
		dst := ipcPool(t, imp, dt)
		plan := newIPCPlan(host)
		ar, err := kernels.PeerExporter(src).NewArena(plan.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		defer ar.Close()
		staged, err := stage(ar, plan.Pages, plan.Tokens, plan.Offs)
		if err != nil {
			t.Fatal(err)
		}
		for j, p := range plan.Pages {
			if want := kernels.PageSum(kernels.PackPage(host, p, plan.Tokens[j], nil)); staged[j] != want {
				t.Fatalf("%s: Stage entry %d (page %d, %d tokens) summed %#x, PageSum of PackPage %#x", dt, j, p,
					plan.Tokens[j], staged[j], want)
			}
		}
		pm, err := kernels.PeerImporter(dst).OpenPeer(ar.Handle())
		if err != nil {
			t.Fatal(err)
		}
		defer pm.Close()
		if pm.Size() < ar.Size() || pm.Size() > ar.Size()+3 {
			t.Fatalf("%s: an arena of %d bytes maps as %d", dt, ar.Size(), pm.Size())
		}
		for j := range plan.Pages {
			if err := pm.CopyPage(plan.Targets[j], plan.Tokens[j], plan.Offs[j]); err != nil {
				t.Fatal(err)
			}
		}
		sameBits(t, fmt.Sprintf("%s: importer's pool", dt), poolData(t, dst), plan.wantAfter(host))
	}
}

// TestFakeIPCArenaOutlivesClose: a mapped arena stays readable after the
// exporter frees it (the driver counts the references), and its handle
// does not map again once freed.
func TestFakeIPCArenaOutlivesClose(t *testing.T) {
	b := fakeBackend(t)
	src, host := ipcSource(t, b, kernels.BF16, 80)
	dst := ipcPool(t, b, kernels.BF16)
	ar, err := src.NewArena(host.PackedBytes(8))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stage(ar, []int32{3}, []int{8}, []int{0}); err != nil {
		t.Fatal(err)
	}
	pm, err := dst.OpenPeer(ar.Handle())
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	handle := ar.Handle()
	if err := ar.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pm.CopyPage(1, 8, 0); err != nil {
		t.Fatal(err)
	}
	got, err := dst.ReadPage(1, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, kernels.PackPage(host, 3, 8, nil)) {
		t.Fatal("a page copied from an arena its exporter freed differs")
	}
	if pm2, err := dst.OpenPeer(handle); err == nil {
		pm2.Close()
		t.Fatal("the handle of a freed arena mapped")
	}
}

// ipcChild is what the parent of TestIPCChild asks of it.
type ipcChild struct {
	Dir      string // the fake driver's libraries; "": the GPU
	Handle   string // hex
	DType    kernels.DType
	Plan     ipcPlan
	Out      string // where the child writes its pool's pages
	WantFail bool   // the handle must not map
}

const ipcChildEnv = "BATON_IPC_CHILD"

// TestIPCChild is the importer of TestFakeIPCTwoProcesses, in a process of
// its own; it runs only when that test starts it.
func TestIPCChild(t *testing.T) {
	spec := os.Getenv(ipcChildEnv)
	if spec == "" {
		t.Skip("the importer process of TestFakeIPCTwoProcesses")
	}
	var c ipcChild
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		t.Fatal(err)
	}
	l := defaultLibs()
	if c.Dir != "" {
		l = libs{driver: []string{filepath.Join(c.Dir, "libcuda.so.1")}, cublas: []string{filepath.Join(c.Dir, "libcublas.so.12")}}
	}
	b, err := open(l, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	kp := ipcPool(t, b, c.DType)
	handle, err := hex.DecodeString(c.Handle)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := kp.OpenPeer(handle)
	if c.WantFail {
		if err == nil {
			t.Fatal("the handle of a freed arena mapped in another process")
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	for j := range c.Plan.Pages {
		if err := pm.CopyPage(c.Plan.Targets[j], c.Plan.Tokens[j], c.Plan.Offs[j]); err != nil {
			t.Fatal(err)
		}
	}
	if err := pm.Close(); err != nil {
		t.Fatal(err)
	}
	var out []byte
	for p := range kp.Pages() {
		page, err := kp.ReadPage(int32(p), kp.layout.PageSize, nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page...)
	}
	if err := os.WriteFile(c.Out, out, 0o600); err != nil {
		t.Fatal(err)
	}
}

// runIPCChild runs TestIPCChild with c and fails where it does.
func runIPCChild(t *testing.T, c ipcChild) {
	t.Helper()
	spec, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIPCChild$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), ipcChildEnv+"="+string(spec))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestIPCChild") {
		t.Fatalf("the importer process: %v\n%s", err, out)
	}
}

// TestFakeIPCTwoProcesses: another process maps the arena by its handle
// and copies the staged pages (written after the handle was made) into
// its own pool, bit for bit, for every KV dtype; once the exporter frees
// the arena, the handle no longer maps there.
func TestFakeIPCTwoProcesses(t *testing.T) {
	b := fakeBackend(t) // builds the libraries in fakeDir
	testIPCTwoProcesses(t, b, fakeDir)
}

// TestGPUIPCTwoProcesses is the same between two processes on GPU 0, but
// for the freed arena's handle, which the driver need not refuse.
func TestGPUIPCTwoProcesses(t *testing.T) { testIPCTwoProcesses(t, gpuBackend(t), "") }

func testIPCTwoProcesses(t *testing.T, b *Backend, libDir string) {
	for i, dt := range ipcDTypes {
		src, host := ipcSource(t, b, dt, uint64(90+i))
		plan := newIPCPlan(host)
		ar, err := src.NewArena(plan.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := stage(ar, plan.Pages, plan.Tokens, plan.Offs); err != nil {
			t.Fatal(err)
		}
		c := ipcChild{Dir: libDir, Handle: hex.EncodeToString(ar.Handle()), DType: dt, Plan: plan,
			Out: filepath.Join(t.TempDir(), "pages")}
		runIPCChild(t, c)
		got, err := os.ReadFile(c.Out)
		if err != nil {
			t.Fatal(err)
		}
		want := host
		want.Data = plan.wantAfter(host)
		var wantBytes []byte
		for p := range want.Pages() {
			wantBytes = append(wantBytes, kernels.PackPage(want, int32(p), want.PageSize, nil)...)
		}
		if !bytes.Equal(got, wantBytes) {
			t.Fatalf("%s: the importer process's pool differs from the pages staged", dt)
		}
		if err := ar.Close(); err != nil {
			t.Fatal(err)
		}
		if libDir != "" {
			c.WantFail = true
			runIPCChild(t, c)
		}
	}
}

// TestFakeIPCRefusals: bad handles do not map, and a copy or a stage that
// would reach outside the arena or the pool is an error that writes
// nothing.
func TestFakeIPCRefusals(t *testing.T) {
	b := fakeBackend(t)
	src, host := ipcSource(t, b, kernels.F16, 100)
	dst := ipcPool(t, b, kernels.F16)
	page := host.PackedBytes(8)
	ar, err := src.NewArena(2 * page)
	if err != nil {
		t.Fatal(err)
	}
	defer ar.Close()
	if _, err := stage(ar, []int32{0, 1}, []int{8, 8}, []int{0, page}); err != nil {
		t.Fatal(err)
	}
	handle := ar.Handle()
	garbage := make([]byte, 64)
	rand.NewChaCha8([32]byte{1}).Read(garbage)
	forged := append([]byte(nil), handle...)
	forged[40] ^= 1 // the fake's tag: the right process and file number, another name
	for name, h := range map[string][]byte{"garbage": garbage, "zero": make([]byte, 64), "truncated": handle[:63],
		"long": append(append([]byte(nil), handle...), 0), "forged": forged, "empty": nil} {
		if pm, err := dst.OpenPeer(h); err == nil {
			pm.Close()
			t.Errorf("a %s handle mapped", name)
		}
	}
	if len(dst.peers) != 0 {
		t.Fatalf("%d peers tracked after refused handles", len(dst.peers))
	}

	pm, err := dst.OpenPeer(handle)
	if err != nil {
		t.Fatal(err)
	}
	defer pm.Close()
	// Page 2 of the importer holds known rows the refused copies must leave.
	if err := dst.WritePage(2, 8, kernels.PackPage(host, 3, 8, nil)); err != nil {
		t.Fatal(err)
	}
	size := pm.Size()
	for _, c := range []struct {
		what   string
		page   int32
		tokens int
		off    int
	}{
		{"an offset past the mapping", 2, 1, size + 2},
		{"an offset at its end", 2, 1, size},
		{"a page running past its end", 2, 8, size - page + 2},
		{"a partial page running past its end", 2, 3, size - host.PackedBytes(2)},
		{"a negative offset", 2, 1, -2},
		{"an odd offset", 2, 1, 1},
		{"a page outside the pool", 4, 1, 0},
		{"a negative page", -1, 1, 0},
		{"more tokens than a page", 2, 9, 0},
	} {
		if err := pm.CopyPage(c.page, c.tokens, c.off); err == nil {
			t.Errorf("CopyPage of %s (page %d, %d tokens at %d of %d)", c.what, c.page, c.tokens, c.off, size)
		}
		got, err := dst.ReadPage(2, 8, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, kernels.PackPage(host, 3, 8, nil)) {
			t.Fatalf("a refused CopyPage of %s wrote into the pool", c.what)
		}
	}
	// The last page that fits does fit.
	if err := pm.CopyPage(2, 8, size-page); err != nil {
		t.Fatalf("CopyPage of the arena's last page: %v", err)
	}

	// A refused Stage launches nothing, its valid entries included: the
	// arena still holds pages 0 and 1.
	for _, c := range []struct {
		what   string
		pages  []int32
		tokens []int
		offs   []int
	}{
		{"a page outside the pool", []int32{3, 4}, []int{8, 1}, []int{0, page}},
		{"more tokens than a page", []int32{3, 2}, []int{8, 9}, []int{0, page}},
		{"an offset past the arena", []int32{3, 2}, []int{8, 1}, []int{0, 2*page + 2}},
		{"a page running past its end", []int32{3, 2}, []int{8, 8}, []int{0, page + 2}},
		{"a negative offset", []int32{3, 2}, []int{8, 1}, []int{0, -2}},
		{"an odd offset", []int32{3, 2}, []int{8, 1}, []int{0, 3}},
		{"fewer offsets than pages", []int32{3, 2}, []int{8, 1}, []int{0}},
		{"fewer token counts than pages", []int32{3, 2}, []int{8}, []int{0, page}},
	} {
		if _, err := stage(ar, c.pages, c.tokens, c.offs); err == nil {
			t.Errorf("Stage of %s", c.what)
		}
	}
	for i, off := range []int{0, page} {
		if err := pm.CopyPage(0, 8, off); err != nil {
			t.Fatal(err)
		}
		got, err := dst.ReadPage(0, 8, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, kernels.PackPage(host, int32(i), 8, nil)) {
			t.Fatalf("after refused Stages the arena's page at %d changed", off)
		}
	}
	if _, err := src.NewArena(0); err == nil {
		t.Error("an arena of 0 bytes")
	}
}

// memfds counts this process's open files the fake driver made to export
// allocations.
func memfds(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); err == nil && strings.Contains(l, "fakecuda-ipc-") {
			n++
		}
	}
	return n
}

// TestFakeIPCClose: Close of an arena and of a peer frees the memory and
// can be called again; use after Close is an error; the pool's Close frees
// the arenas and peers still open, as the backend's Close does its pools'.
func TestFakeIPCClose(t *testing.T) {
	b := fakeBackend(t)
	d := b.drv
	before := memfds(t)
	src, _ := ipcSource(t, b, kernels.F32, 110)
	dst := ipcPool(t, b, kernels.F32)
	ar, err := src.NewArena(1 << 12)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := dst.OpenPeer(ar.Handle())
	if err != nil {
		t.Fatal(err)
	}
	arPtr, pmPtr := ar.(*arena).ptr, pm.(*peerMemory).ptr
	if n := memfds(t); n != before+1 {
		t.Fatalf("%d export files open with one arena, want %d", n, before+1)
	}
	if _, _, err := d.addressRange(pmPtr + 100); err != nil {
		t.Fatalf("the mapped arena is not known to the driver: %v", err)
	}
	for i := range 2 {
		if err := pm.Close(); err != nil {
			t.Fatalf("peer Close %d: %v", i, err)
		}
		if err := ar.Close(); err != nil {
			t.Fatalf("arena Close %d: %v", i, err)
		}
	}
	if _, _, err := d.addressRange(arPtr); err == nil {
		t.Fatal("the arena is still allocated after its Close")
	}
	if _, _, err := d.addressRange(pmPtr); err == nil {
		t.Fatal("the peer is still mapped after its Close")
	}
	if n := memfds(t); n != before {
		t.Fatalf("%d export files open after Close, want %d", n, before)
	}
	if err := pm.CopyPage(0, 1, 0); err == nil {
		t.Fatal("CopyPage after Close")
	}
	if _, err := stage(ar, []int32{0}, []int{1}, []int{0}); err == nil {
		t.Fatal("Stage after Close")
	}
	if len(src.arenas) != 0 || len(dst.peers) != 0 {
		t.Fatalf("%d arenas and %d peers tracked after their Close", len(src.arenas), len(dst.peers))
	}

	// Left open, they go with their pools.
	ar, err = src.NewArena(1 << 12)
	if err != nil {
		t.Fatal(err)
	}
	pm, err = dst.OpenPeer(ar.Handle())
	if err != nil {
		t.Fatal(err)
	}
	arPtr, pmPtr = ar.(*arena).ptr, pm.(*peerMemory).ptr
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.addressRange(pmPtr); err == nil {
		t.Fatal("the peer is still mapped after its pool's Close")
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := d.addressRange(arPtr); err == nil {
		t.Fatal("the arena is still allocated after its pool's Close")
	}
	if n := memfds(t); n != before {
		t.Fatalf("%d export files open after the pools' Close, want %d", n, before)
	}
	if err := pm.Close(); err != nil {
		t.Fatalf("peer Close after its pool's: %v", err)
	}
	if err := ar.Close(); err != nil {
		t.Fatalf("arena Close after its pool's: %v", err)
	}
	if err := pm.CopyPage(0, 1, 0); err == nil {
		t.Fatal("CopyPage after the pool's Close")
	}
	if _, err := src.NewArena(16); err == nil {
		t.Fatal("NewArena of a closed pool")
	}
	if _, err := dst.OpenPeer(make([]byte, 64)); err == nil {
		t.Fatal("OpenPeer of a closed pool")
	}
}

// TestFakeIPCBackendClose: the backend's Close frees the arenas and
// peers of the pools still open.
func TestFakeIPCBackendClose(t *testing.T) {
	b, err := open(fakeLibs(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	before := memfds(t)
	src := ipcPool(t, b, kernels.F32)
	dst := ipcPool(t, b, kernels.F32)
	ar, err := src.NewArena(64)
	if err != nil {
		t.Fatal(err)
	}
	pm, err := dst.OpenPeer(ar.Handle())
	if err != nil {
		t.Fatal(err)
	}
	arPtr, pmPtr := ar.(*arena).ptr, pm.(*peerMemory).ptr
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	for what, p := range map[string]dptr{"arena": arPtr, "peer": pmPtr} {
		if _, _, err := b.drv.addressRange(p); err == nil {
			t.Errorf("the %s is still known to the driver after the backend's Close", what)
		}
	}
	if n := memfds(t); n != before {
		t.Fatalf("%d export files open after the backend's Close, want %d", n, before)
	}
	if err := ar.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pm.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFakeIPCMissing: on a driver without CUDA IPC, pools still work and
// exporting or mapping an arena says what is missing.
func TestFakeIPCMissing(t *testing.T) {
	b := bareBackend(t)
	kp := ipcPool(t, b, kernels.F32)
	if _, err := kp.NewArena(64); err == nil || !strings.Contains(err.Error(), "no CUDA IPC") {
		t.Fatalf("NewArena without CUDA IPC: %v", err)
	}
	if _, err := kp.OpenPeer(make([]byte, 64)); err == nil || !strings.Contains(err.Error(), "no CUDA IPC") {
		t.Fatalf("OpenPeer without CUDA IPC: %v", err)
	}
	if err := kp.WritePage(1, 1, make([]byte, kp.layout.PackedBytes(1))); err != nil {
		t.Fatal(err)
	}
}

// stage is Arena.Stage and the Wait for it.
func stage(ar kernels.Arena, pages []int32, tokens, offs []int) ([]uint64, error) {
	st, err := ar.Stage(pages, tokens, offs)
	if err != nil {
		return nil, err
	}
	return st.Wait()
}

// TestFakeIPCStageAsync: Stage queues the packs and the sums and returns
// without waiting for the pool's stream; Wait waits for the staging's
// event alone, once however often it is called, and gives its slot back
// for the next Stage. A staging left unwaited when its pool closes fails
// its Wait instead of touching freed memory.
func TestFakeIPCStageAsync(t *testing.T) {
	b := fakeBackend(t)
	src, host := ipcSource(t, b, kernels.BF16, 90)
	plan := newIPCPlan(host)
	ar, err := src.NewArena(plan.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	defer ar.Close()
	syncs, events := src.Synchronizes()
	st, err := ar.Stage(plan.Pages, plan.Tokens, plan.Offs)
	if err != nil {
		t.Fatal(err)
	}
	if s, e := src.Synchronizes(); s != syncs || e != events {
		t.Fatalf("Stage waited: %d stream synchronises and %d event waits", s-syncs, e-events)
	}
	for range 2 {
		sums, err := st.Wait()
		if err != nil {
			t.Fatal(err)
		}
		for j, p := range plan.Pages {
			if want := kernels.PageSum(kernels.PackPage(host, p, plan.Tokens[j], nil)); sums[j] != want {
				t.Fatalf("entry %d summed %#x, want %#x", j, sums[j], want)
			}
		}
	}
	if s, e := src.Synchronizes(); s != syncs || e != events+1 {
		t.Fatalf("two Waits: %d stream synchronises and %d event waits, want 0 and 1", s-syncs, e-events)
	}
	if _, err := stage(ar, plan.Pages, plan.Tokens, plan.Offs); err != nil {
		t.Fatal(err)
	}
	if len(src.slots) != 1 || len(src.freeSlots) != 1 {
		t.Fatalf("%d staging slots (%d free) after two stagings in turn, want one, free", len(src.slots), len(src.freeSlots))
	}
	left, err := ar.Stage(plan.Pages, plan.Tokens, plan.Offs)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := left.Wait(); err == nil {
		t.Fatal("a staging's Wait after its pool's Close")
	}
}

// TestFakeIPCPageRuns: consecutive full pages whose packed rows sit back
// to back move as one copy, both ways: Stage packs pool pages 0-2 into the
// arena with one copy (page 3, partial, with the pack kernel), and a
// batch of QueuePage calls lands them into consecutive importer pages 1-3
// with one copy at Drain (the partial page with the unpack kernel). The
// pages are bit for bit where they belong, every dtype.
func TestFakeIPCPageRuns(t *testing.T) { testIPCPageRuns(t, fakeBackend(t), fakeBackend(t)) }

func testIPCPageRuns(t *testing.T, exp, imp *Backend) {
	for i, dt := range ipcDTypes {
		src, host := ipcSource(t, exp, dt, uint64(80+i))
		dst := ipcPool(t, imp, dt)
		l := host
		full := l.PackedBytes(l.PageSize)
		plan := ipcPlan{Pages: []int32{0, 1, 2, 3}, Tokens: []int{8, 8, 8, 5}, Targets: []int32{1, 2, 3, 0},
			Offs: []int{0, full, 2 * full, 3 * full}, Bytes: 4 * full}
		ar, err := kernels.PeerExporter(src).NewArena(plan.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		defer ar.Close()
		before := src.runCopies
		if _, err := stage(ar, plan.Pages, plan.Tokens, plan.Offs); err != nil {
			t.Fatal(err)
		}
		if n := src.runCopies - before; n != 1 {
			t.Errorf("%s: Stage of three consecutive full pages made %d copies, want 1", dt, n)
		}
		pm, err := kernels.PeerImporter(dst).OpenPeer(ar.Handle())
		if err != nil {
			t.Fatal(err)
		}
		defer pm.Close()
		before = dst.runCopies
		for j := range plan.Pages {
			if err := pm.QueuePage(plan.Targets[j], plan.Tokens[j], plan.Offs[j]); err != nil {
				t.Fatal(err)
			}
		}
		if err := pm.Drain(); err != nil {
			t.Fatal(err)
		}
		if n := dst.runCopies - before; n != 1 {
			t.Errorf("%s: landing three consecutive full pages made %d copies, want 1", dt, n)
		}
		sameBits(t, fmt.Sprintf("%s: importer's pool", dt), poolData(t, dst), plan.wantAfter(host))
	}
}
