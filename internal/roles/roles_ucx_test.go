//go:build ucx

package roles

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer/ucx"
)

func newUCXPair(t *testing.T, pageSize, chunk int) *pair {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode"), pm: metrics.New("prefill")}
	pages := 4096 / pageSize
	de, dpool, c := newWorkerEngine(t, scheduler.RoleDecode, p.dm, pages, pageSize, chunk)
	pe, ppool, _ := newWorkerEngine(t, scheduler.RolePrefill, p.pm, pages, pageSize, chunk)
	p.dPool, p.pPool = dpool, ppool
	p.layout = Layout(ModelID("stories260K", c), c, pageSize)
	p.decode = NewDecode(DecodeOptions{Engine: de, Pool: dpool, Metrics: p.dm, Layout: p.layout, ContextLength: 512, MaxSeq: 512, HandoffTimeout: 5 * time.Second, Transport: "ucx", Log: log})
	t.Cleanup(p.decode.Close)
	recv, err := ucx.Listen("127.0.0.1:0", p.decode, dpool.KV())
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
	p.prefill = NewPrefill(PrefillOptions{Engine: pe, Pool: ppool, Metrics: p.pm, Layout: p.layout, Sender: snd, Transport: "ucx", ContextLength: 512, MaxSeq: 512, Log: log})
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
		p := newUCXPair(t, tc.page, tc.chunk)
		for i := 0; i < 3; i++ {
			toks, fin, err := p.handoff(t, want.PromptIDs, len(want.GeneratedIDs))
			if err != nil {
				t.Fatalf("page %d: %v", tc.page, err)
			}
			if fin != "length" || len(toks) != len(want.GeneratedIDs) {
				t.Fatalf("page %d: finish %q after %d tokens", tc.page, fin, len(toks))
			}
			for j := range toks {
				if toks[j] != want.GeneratedIDs[j] {
					t.Fatalf("page %d: token %d = %d, want %d", tc.page, j, toks[j], want.GeneratedIDs[j])
				}
			}
		}
		waitAllFree(t, p.dPool, p.pPool)
	}
}

// TestUCXHandoffAllocKV: the decode pool lives in memory UCX allocated
// (kvpool.Config.Data = ucx.AllocKV(...).Floats()), so on one host the
// prefill's puts are one-sided for real.
func TestUCXHandoffAllocKV(t *testing.T) {
	want := loadRef(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode"), pm: metrics.New("prefill")}
	const pageSize, pages = 16, 256
	l, err := model.Load(model.LoadOptions{}, cpu.New(1))
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pc := kvpool.Config{NumPages: pages, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true}
	reg, err := ucx.AllocKV(pages * 2 * pageSize * c.Layers * c.KVHeads * c.HeadDim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Free() })
	pc.Data = reg.Floats()
	dpool, err := kvpool.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	de := scheduler.NewEngine(l.Model, dpool, scheduler.Config{Role: scheduler.RoleDecode, ContextLength: c.ContextLength, ChunkSize: 512, MaxRunning: 32,
		IsEOG: func(id int32) bool { return id == 2 }}, p.dm)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { de.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	pe, ppool, _ := newWorkerEngine(t, scheduler.RolePrefill, p.pm, pages, pageSize, 512)
	p.dPool, p.pPool = dpool, ppool
	p.layout = Layout(ModelID("stories260K", &c), &c, pageSize)
	p.decode = NewDecode(DecodeOptions{Engine: de, Pool: dpool, Metrics: p.dm, Layout: p.layout, ContextLength: 512, MaxSeq: 512, HandoffTimeout: 5 * time.Second, Transport: "ucx", Log: log})
	t.Cleanup(p.decode.Close)
	recv, err := ucx.Listen("127.0.0.1:0", p.decode, dpool.KV(), ucx.WithMemory(reg))
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
	p.prefill = NewPrefill(PrefillOptions{Engine: pe, Pool: ppool, Metrics: p.pm, Layout: p.layout, Sender: snd, Transport: "ucx", ContextLength: 512, MaxSeq: 512, Log: log})
	t.Cleanup(p.prefill.Close)
	p.prefillAddr = serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterPrefillServer(gs, p.prefill) })
	p.prefill.SetAddr(p.prefillAddr)
	p.dc = pdv1.NewDecodeClient(dial(t, daddr))
	p.pc = pdv1.NewPrefillClient(dial(t, p.prefillAddr))
	for i := 0; i < 3; i++ {
		toks, _, err := p.handoff(t, want.PromptIDs, len(want.GeneratedIDs))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(toks, want.GeneratedIDs) {
			t.Fatalf("tokens %v, want %v", toks, want.GeneratedIDs)
		}
	}
	waitAllFree(t, p.dPool, p.pPool)
}

// TestUCXHandoffDevicePoolLanding: a decode pool in a backend's own memory
// (a GPU's) cannot take UCX puts; they land in a UCX-allocated landing zone
// of the same pages, and Commit copies each verified page into the pool.
func TestUCXHandoffDevicePoolLanding(t *testing.T) {
	want := loadRef(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode"), pm: metrics.New("prefill")}
	const pageSize, pages = 16, 256
	de, dpool, c := newWorkerEngineOn(t, kernelstest.Device{Backend: cpu.New(1)}, scheduler.RoleDecode, p.dm, pages, pageSize, 512)
	pe, ppool, _ := newWorkerEngine(t, scheduler.RolePrefill, p.pm, pages, pageSize, 512)
	p.dPool, p.pPool = dpool, ppool
	landing := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
	reg, err := ucx.AllocKV(pages * landing.PageFloats())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Free() })
	landing.Data = reg.Floats()
	p.layout = Layout(ModelID("stories260K", c), c, pageSize)
	p.decode = NewDecode(DecodeOptions{Engine: de, Pool: dpool, Metrics: p.dm, Layout: p.layout, ContextLength: 512, MaxSeq: 512,
		HandoffTimeout: 5 * time.Second, Transport: "ucx", Landing: landing, Log: log})
	t.Cleanup(p.decode.Close)
	recv, err := ucx.Listen("127.0.0.1:0", p.decode, landing, ucx.WithMemory(reg))
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
	p.prefill = NewPrefill(PrefillOptions{Engine: pe, Pool: ppool, Metrics: p.pm, Layout: p.layout, Sender: snd, Transport: "ucx", ContextLength: 512, MaxSeq: 512, Log: log})
	t.Cleanup(p.prefill.Close)
	p.prefillAddr = serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterPrefillServer(gs, p.prefill) })
	p.prefill.SetAddr(p.prefillAddr)
	p.dc = pdv1.NewDecodeClient(dial(t, daddr))
	p.pc = pdv1.NewPrefillClient(dial(t, p.prefillAddr))
	const runs = 3
	for i := 0; i < runs; i++ {
		toks, _, err := p.handoff(t, want.PromptIDs, len(want.GeneratedIDs))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(toks, want.GeneratedIDs) {
			t.Fatalf("tokens %v, want %v", toks, want.GeneratedIDs)
		}
	}
	waitAllFree(t, p.dPool, p.pPool)
	if w, want := deviceMemory(t, dpool).Writes.Load(), int64(runs*dpool.PagesFor(len(want.PromptIDs))); w != want {
		t.Fatalf("%d verified pages copied into the device pool, want %d", w, want)
	}
}
