//go:build ucx

package roles

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/ucx"
)

// ucxMemory is where a decode worker's pool lives and UCX puts land.
type ucxMemory int

const (
	// ucxGoMemory: the pool in Go memory, registered with UCX.
	ucxGoMemory ucxMemory = iota
	// ucxAllocated: the pool in memory UCX allocated, so on one host the
	// prefill's puts are one-sided for real.
	ucxAllocated
	// ucxLanding: the pool in a backend's own memory (a GPU's), which UCX
	// cannot reach; puts land in a UCX-allocated zone of the same pages and
	// Commit copies each verified page into the pool.
	ucxLanding
)

func newUCXPair(t *testing.T, pageSize, chunk int) *pair {
	return newUCXPairIn(t, ucxGoMemory, 4096/pageSize, pageSize, chunk)
}

func newUCXPairIn(t *testing.T, mem ucxMemory, pages, pageSize, chunk int) *pair {
	return newUCXPairSums(t, mem, pages, pageSize, chunk, nil)
}

// newUCXPairSums is newUCXPairIn whose decode checks Commit with sums.
func newUCXPairSums(t *testing.T, mem ucxMemory, pages, pageSize, chunk int, sums transfer.Sums) *pair {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode"), pm: metrics.New("prefill")}
	var be kernels.Backend = cpu.New(1)
	var reg *ucx.Region
	var data []float32
	if mem != ucxGoMemory {
		l, err := model.Load(model.LoadOptions{}, be)
		if err != nil {
			t.Fatal(err)
		}
		c := l.Model.Config
		layout := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
		if reg, err = ucx.AllocKV(pages * layout.PageFloats()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Free() })
	}
	switch mem {
	case ucxAllocated:
		data = reg.Floats()
	case ucxLanding:
		be = kernelstest.Device{Backend: be}
	}
	de, dpool, c := newWorkerEngineOn(t, be, scheduler.RoleDecode, p.dm, pages, pageSize, chunk, data)
	pe, ppool, _ := newWorkerEngine(t, scheduler.RolePrefill, p.pm, pages, pageSize, chunk)
	p.dPool, p.pPool = dpool, ppool
	p.layout = Layout(ModelID("stories260K", c), c, pageSize)
	recvKV, opts := dpool.KV(), []ucx.Option(nil)
	var landing kernels.PagedKV
	if reg != nil {
		opts = append(opts, ucx.WithMemory(reg))
	}
	if mem == ucxLanding {
		landing = kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Data: reg.Floats()}
		recvKV = landing
	}
	p.decode = NewDecode(DecodeOptions{DecodeDesk: DecodeDesk{Engine: de, Pool: dpool, Metrics: p.dm, MaxSeq: 512, HandoffTimeout: 5 * time.Second, Landing: landing, Sums: sums, Log: log}, Layout: p.layout, ContextLength: 512, Transport: "ucx"})
	t.Cleanup(p.decode.Close)
	recv, err := ucx.Listen("127.0.0.1:0", p.decode, recvKV, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { recv.Close() })
	daddr := serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterDecodeServer(gs, p.decode) })
	p.decode.SetReceiver(recv, daddr, recv.Addr())
	snd, err := ucx.NewSender()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	p.prefill = NewPrefill(PrefillOptions{PrefillDesk: PrefillDesk{Engine: pe, Pool: ppool, Metrics: p.pm, Sender: snd, Log: log}, Layout: p.layout, Transport: "ucx", ContextLength: 512, MaxSeq: 512})
	t.Cleanup(p.prefill.Close)
	p.prefillAddr = serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterPrefillServer(gs, p.prefill) })
	p.prefill.SetAddr(p.prefillAddr)
	p.dc = pdv1.NewDecodeClient(dial(t, daddr))
	p.pc = pdv1.NewPrefillClient(dial(t, p.prefillAddr))
	return p
}

func TestUCXHandoffGreedyReference(t *testing.T) {
	want := loadRef(t)
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {1, 2}, {64, 3}, {2, 3}} {
		handoffsMatch(t, newUCXPair(t, tc.page, tc.chunk), want, 3, fmt.Sprintf("page %d chunk %d", tc.page, tc.chunk))
	}
}

func TestUCXHandoffAllocKV(t *testing.T) {
	handoffsMatch(t, newUCXPairIn(t, ucxAllocated, 256, 16, 512), loadRef(t), 3, "UCX-allocated pool")
}

func TestUCXHandoffDevicePoolLanding(t *testing.T) {
	want := loadRef(t)
	p := newUCXPairIn(t, ucxLanding, 256, 16, 512)
	handoffsMatch(t, p, want, 3, "device pool, landing zone")
	if w, want := deviceMemory(t, p.dPool).Writes.Load(), int64(3*p.dPool.PagesFor(len(want.PromptIDs))); w != want {
		t.Fatalf("%d verified pages copied into the device pool, want %d", w, want)
	}
}

// countedSums is transfer.HostSums counting its calls and pages.
type countedSums struct{ calls, pages atomic.Int64 }

func (c *countedSums) sums(kv kernels.PagedKV, pages []int32, tokens []int) ([]uint64, error) {
	c.calls.Add(1)
	c.pages.Add(int64(len(pages)))
	return transfer.HostSums(kv, pages, tokens)
}

// With the transport's own Sums (as ucx into a registered GPU pool has),
// Commit proves a one-sided reservation's pages in one batched call, not
// one read-back a page, and the handoffs still give the reference.
func TestUCXOneSidedSumsBatched(t *testing.T) {
	want := loadRef(t)
	var c countedSums
	p := newUCXPairSums(t, ucxGoMemory, 256, 4, 512, c.sums)
	handoffsMatch(t, p, want, 3, "one-sided, batched sums")
	perPrompt := int64(p.dPool.PagesFor(len(want.PromptIDs)))
	if calls, pages := c.calls.Load(), c.pages.Load(); calls != 3 || pages != 3*perPrompt {
		t.Fatalf("sums called %d times over %d pages, want 3 over %d", calls, pages, 3*perPrompt)
	}
}

// A page that differs in the pool from what the writer claims fails the
// batched one-sided check under the checksum label, and no page of the
// reservation is marked written.
func TestUCXOneSidedSumsCorruptPage(t *testing.T) {
	want := loadRef(t)
	var c countedSums
	p := newUCXPairSums(t, ucxGoMemory, 256, 4, 512, c.sums)
	ctx := context.Background()
	prompt := want.PromptIDs[:8]
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "x", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	snd, err := ucx.NewSender()
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	sess, err := snd.Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	kv := p.dPool.KV()
	sums := writeFullPages(t, sess, kv, res.Pages, transfer.Checksum)
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The second page changes in the pool after it landed.
	if err := transfer.Unpack(kv, res.Pages[1], 4, make([]byte, transfer.PackedSize(kv, 4))); err != nil {
		t.Fatal(err)
	}
	_, err = p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(prompt)),
		PageChecksums: sums, FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: res.Capability, SessionId: sidOf(sess)})
	if err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("commit over a page that changed in the pool: %v", err)
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "checksum"); n != 1 {
		t.Fatalf("%v checksum failures counted, want 1", n)
	}
	if calls := c.calls.Load(); calls != 1 {
		t.Fatalf("sums called %d times, want one batch", calls)
	}
	for _, pg := range res.Pages {
		if _, written, _ := p.dPool.Owner(pg); written != 0 {
			t.Fatalf("page %d marked written (%d tokens) by a commit that failed", pg, written)
		}
	}
	sess.Close()
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}
