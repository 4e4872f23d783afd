package roles

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
	testref "github.com/batonlm/baton/test/reference"
)

type pair struct {
	decode      *Decode
	prefill     *Prefill
	dPool       *kvpool.Pool
	pPool       *kvpool.Pool
	dm, pm      *metrics.Set
	dc          pdv1.DecodeClient
	pc          pdv1.PrefillClient
	layout      *pdv1.KVLayout
	prefillAddr string
}

// testMaxRunning is the batch limit of engines the tests make.
var testMaxRunning = 32

// testModelPath, when set, is the model engines the tests make serve
// (the bundled one otherwise).
var testModelPath string

// testDecodeSpec, when set, is the speculative decoding of decode engines
// the tests make.
var testDecodeSpec func(testing.TB, kernels.Backend) scheduler.SpecConfig

func newWorkerEngine(t testing.TB, role scheduler.Role, ms *metrics.Set, pages, pageSize, chunk int) (*scheduler.Engine, *kvpool.Pool, *model.Config) {
	return newWorkerEngineOn(t, cpu.New(1), role, ms, pages, pageSize, chunk, nil)
}

// newWorkerEngineOn runs the bundled model on be; a backend that holds the
// KV pool in its own memory (kernels.KVAllocator) gets the pool there, else
// it is data when given (memory a transport allocated) or Go memory.
func newWorkerEngineOn(t testing.TB, be kernels.Backend, role scheduler.Role, ms *metrics.Set, pages, pageSize, chunk int, data []float32) (*scheduler.Engine, *kvpool.Pool, *model.Config) {
	l, err := model.Load(model.LoadOptions{Path: testModelPath}, be)
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pc := kvpool.Config{NumPages: pages, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true, Data: data}
	if a, ok := be.(kernels.KVAllocator); ok {
		layout := kernels.PagedKV{PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim}
		if pc.Device, err = a.AllocKV(layout, pages); err != nil {
			t.Fatal(err)
		}
	}
	pool, err := kvpool.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	var spec scheduler.SpecConfig
	if role == scheduler.RoleDecode && testDecodeSpec != nil {
		spec = testDecodeSpec(t, be)
	}
	e := scheduler.NewEngine(l.Model, pool, scheduler.Config{Role: role, ContextLength: c.ContextLength, ChunkSize: chunk, MaxRunning: testMaxRunning,
		IsEOG: func(id int32) bool { return id == 2 }, Spec: spec}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, pool, &c
}

func serveGRPC(t testing.TB, register func(*grpc.Server)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	register(gs)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)
	return ln.Addr().String()
}

func dial(t testing.TB, addr string) *grpc.ClientConn {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func newPair(t testing.TB, pageSize, chunk int, opts ...func(*DecodeOptions)) *pair {
	return newPairOn(t, cpu.New(1), pageSize, chunk, opts...)
}

// newPairOn is a prefill and a decode worker over tcp, both on be.
func newPairOn(t testing.TB, be kernels.Backend, pageSize, chunk int, opts ...func(*DecodeOptions)) *pair {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode"), pm: metrics.New("prefill")}
	pages := 4096 / pageSize
	de, dpool, c := newWorkerEngineOn(t, be, scheduler.RoleDecode, p.dm, pages, pageSize, chunk, nil)
	pe, ppool, _ := newWorkerEngineOn(t, be, scheduler.RolePrefill, p.pm, pages, pageSize, chunk, nil)
	p.dPool, p.pPool = dpool, ppool
	p.layout = Layout(ModelID("stories260K", c), c, pageSize)
	do := DecodeOptions{DecodeDesk: DecodeDesk{Engine: de, Pool: dpool, Metrics: p.dm, MaxSeq: 512, HandoffTimeout: 5 * time.Second, Log: log}, Layout: p.layout, ContextLength: 512}
	for _, o := range opts {
		o(&do)
	}
	p.decode = NewDecode(do)
	t.Cleanup(p.decode.Close)
	recv, err := tcp.Listen("127.0.0.1:0", p.decode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { recv.Close() })
	daddr := serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterDecodeServer(gs, p.decode) })
	p.decode.SetReceiver(recv, daddr, recv.Addr())
	p.prefill = NewPrefill(PrefillOptions{PrefillDesk: PrefillDesk{Engine: pe, Pool: ppool, Metrics: p.pm, Sender: tcp.NewSender(), Log: log}, Layout: p.layout, ContextLength: 512, MaxSeq: 512})
	t.Cleanup(p.prefill.Close)
	p.prefillAddr = serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterPrefillServer(gs, p.prefill) })
	p.prefill.SetAddr(p.prefillAddr)
	p.dc = pdv1.NewDecodeClient(dial(t, daddr))
	p.pc = pdv1.NewPrefillClient(dial(t, p.prefillAddr))
	return p
}

type reference = testref.Greedy

func loadRef(t *testing.T) reference { return loadRefTB(t) }

func loadRefTB(t testing.TB) reference { return testref.Load(t) }

// handoff plays the router: Reserve, Stream, Prefill; it returns the tokens.
func (p *pair) handoff(t *testing.T, prompt []int32, maxTokens int) ([]int32, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "t", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: uint32(maxTokens)},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		return nil, "", err
	}
	st, err := p.dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	if err != nil {
		return nil, "", err
	}
	perr := make(chan error, 1)
	go func() {
		_, err := p.pc.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "t", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: uint32(maxTokens)}, Reservation: res})
		perr <- err
	}()
	toks, fin, err := readTokens(st)
	if _, event := err.(*eventError); err == nil || event {
		// The stream ended as decode meant it to: prefill's answer is in.
		if perr := <-perr; err == nil {
			err = perr
		}
	}
	return toks, fin, err
}

// readTokens reads a token stream to its last event: the tokens, and its
// finish, or its error (an error event is an *eventError).
func readTokens(st grpc.ServerStreamingClient[pdv1.TokenEvent]) ([]int32, string, error) {
	var toks []int32
	for {
		ev, err := st.Recv()
		if err != nil {
			return toks, "", err
		}
		if ev.Token != nil {
			toks = append(toks, ev.Token.Id)
		}
		if ev.Error != "" {
			return toks, "", &eventError{ev.Error}
		}
		if ev.Finish != "" {
			return toks, ev.Finish, nil
		}
	}
}

type eventError struct{ msg string }

func (e *eventError) Error() string { return e.msg }

func waitAllFree(t *testing.T, pools ...*kvpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, pool := range pools {
		for pool.Free() != pool.NumPages() {
			if time.Now().After(deadline) {
				t.Fatalf("pages not released: %+v", pool.Stats())
			}
			time.Sleep(10 * time.Millisecond)
		}
		if st := pool.Stats(); st.ReleaseErrors != 0 || st.Quarantined != 0 {
			t.Fatalf("pool bookkeeping: %+v", st)
		}
	}
}

func TestHandoffGreedyReference(t *testing.T) {
	want := loadRef(t)
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {1, 2}, {64, 3}, {2, 3}} {
		handoffsMatch(t, newPair(t, tc.page, tc.chunk), want, 4, fmt.Sprintf("page %d chunk %d", tc.page, tc.chunk))
	}
}

// handoffsMatch runs the reference prompt through the pair n times at
// once, checks every token of each, and then that every page came back.
func handoffsMatch(t *testing.T, p *pair, want reference, n int, what string) {
	t.Helper()
	before := p.dPool.Stats()
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, fin, err := p.handoff(t, want.PromptIDs, len(want.GeneratedIDs))
			if err != nil || fin != "length" {
				t.Errorf("%s: finish %q, %v", what, fin, err)
				return
			}
			if !slices.Equal(toks, want.GeneratedIDs) {
				t.Errorf("%s: tokens %v, want %v", what, toks, want.GeneratedIDs)
			}
		}()
	}
	wg.Wait()
	waitAllFree(t, p.dPool, p.pPool)
	// A normal handoff ends the writer's hold by its Commit (its word that
	// it is done), never by a reclaim on a close proof.
	st := p.dPool.Stats()
	drains, reclaims := st.WritersDone-before.WritersDone, st.Reclaims-before.Reclaims
	if reclaims != 0 || drains != uint64(n) || st.ReleaseErrors != 0 {
		t.Errorf("%s: decode pool drains %d (want %d), reclaims %d (want 0), release errors %d", what, drains, n, reclaims, st.ReleaseErrors)
	}
}

// With room for one request in the batch, committed requests wait their turn
// (holding their pages) and all still produce the reference.
func TestDecodeQueuesCommittedRequests(t *testing.T) {
	testMaxRunning = 1
	defer func() { testMaxRunning = 32 }()
	want := loadRef(t)
	p := newPair(t, 16, 512)
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, fin, err := p.handoff(t, want.PromptIDs, 16)
			if err != nil || fin != "length" || len(toks) != 16 {
				t.Errorf("handoff: %v %q %d", err, fin, len(toks))
				return
			}
			for j := range toks {
				if toks[j] != want.GeneratedIDs[j] {
					t.Errorf("token %d = %d, want %d", j, toks[j], want.GeneratedIDs[j])
					return
				}
			}
		}()
	}
	wg.Wait()
	waitAllFree(t, p.dPool, p.pPool)
}

// A commit that claims more than was written, or whose checksum does not
// match, never lets the request decode: the client gets an error naming the
// check, the failure is counted, and every page comes back.
func TestCommitChecks(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx := context.Background()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "x", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	// A session opens and writes nothing: a commit claiming the whole
	// prompt must fail coverage.
	sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(want.PromptIDs)),
		PageChecksums: make([]uint64, len(res.Pages)), FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: res.Capability, SessionId: sidOf(sess)})
	if err == nil {
		t.Fatal("a commit over unwritten pages was accepted")
	}
	_ = sess.Close()
	if got := testutilCounter(t, p.dm, "baton_handoff_failures_total"); got < 1 {
		t.Fatalf("handoff failure not counted")
	}
	// The writer never wrote; its Drained releases the quarantined pages.
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)

	// A wrong layout is refused at Reserve.
	bad := proto.Clone(p.layout).(*pdv1.KVLayout)
	bad.HeadDim++
	if _, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "y", Prompt: want.PromptIDs, Layout: bad, Writer: p.prefillAddr}); err == nil {
		t.Fatal("layout mismatch accepted")
	}
}

// An abort after a frame landed keeps the pages quarantined until the writer
// says Drained; a Drained for a stale epoch is dropped and counted. A writer
// that never says it and holds its session open is cut off by the receiver
// after the handoff timeout, and that frees the pages. An abort before any
// frame landed frees at once: the receiver, the only writer of these pages,
// refuses the reservation from then on.
func TestAbortQuarantinesUntilDrained(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512, func(o *DecodeOptions) { o.HandoffTimeout = time.Second })
	ctx := context.Background()
	reserve := func() *pdv1.Reservation {
		// The writer address is not a real prefill: Abort to it fails, so only Drained frees.
		res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "z", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
			Layout: p.layout, Writer: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	kv := p.dPool.KV()
	landOne := func(res *pdv1.Reservation) transfer.Session {
		sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sess.Close() })
		if err := sess.Write(transfer.PageWrite{Index: 0, Page: res.Pages[0], Tokens: 4, Data: make([]byte, transfer.PackedSize(kv, 4))}); err != nil {
			t.Fatal(err)
		}
		if err := sess.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		return sess
	}
	res := reserve()
	landOne(res)
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "client left", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	// Abort returns once the request is torn down: the pages are where
	// they stay until the writer lets go.
	st := p.dPool.Stats()
	if st.Quarantined != len(res.Pages) {
		t.Fatalf("after abort: %d quarantined, want the %d prompt pages; %+v", st.Quarantined, len(res.Pages), st)
	}
	_, _ = p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch + 1, Writer: "127.0.0.1:1", Capability: res.Capability})
	if p.dPool.Stats().Quarantined != len(res.Pages) {
		t.Fatal("a Drained for another epoch freed pages")
	}
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: "127.0.0.1:1", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
	if testutilCounter(t, p.dm, "baton_late_messages_dropped_total") < 1 {
		t.Fatal("late Drained not counted")
	}

	// No Drained, the session held open: the receiver ends it.
	res = reserve()
	sess := landOne(res)
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "client left", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	if st := p.dPool.Stats(); st.Quarantined != len(res.Pages) {
		t.Fatalf("after abort: %d quarantined, want the %d prompt pages; %+v", st.Quarantined, len(res.Pages), st)
	}
	waitAllFree(t, p.dPool)
	if err := sess.Flush(ctx); err == nil {
		t.Fatal("the session the receiver ended still flushes")
	}

	res = reserve()
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "client left", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}

// resKey is the transfer key of a reservation, with its capability.
func resKey(res *pdv1.Reservation) transfer.Key {
	c, _ := transfer.CapabilityFrom(res.Capability)
	return transfer.Key{Room: res.Room, Epoch: res.Epoch, Cap: c}
}

// sidOf is the session ID a Commit carries.
func sidOf(s transfer.Session) []byte {
	id := s.ID()
	return id[:]
}

func testutilCounter(t *testing.T, ms *metrics.Set, name string) float64 {
	t.Helper()
	mfs, err := ms.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// A handoff timeout with a frame landed and a writer that is still
// connected but never commits aborts the request, and the pages stay
// quarantined: a timeout alone never frees a page a writer may still
// write. They come back on the writer's Drained.
func TestHandoffTimeoutKeepsQuarantine(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512, func(o *DecodeOptions) { o.HandoffTimeout = 300 * time.Millisecond })
	ctx := context.Background()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "slow", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: p.layout, Writer: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	kv := p.dPool.KV()
	if err := sess.Write(transfer.PageWrite{Index: 0, Page: res.Pages[0], Tokens: 4, Data: make([]byte, transfer.PackedSize(kv, 4))}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	r := p.decode.find("test", res.Room, res.Epoch, res.Capability)
	if r == nil {
		t.Fatal("reservation not found")
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.r.State() != scheduler.StateDraining {
		if time.Now().After(deadline) {
			t.Fatalf("the handoff timeout did not abort the request: %s", r.r.State())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := p.dPool.Stats(); st.Quarantined != len(res.Pages) {
		t.Fatalf("after the handoff timeout: %d quarantined, want the %d prompt pages; %+v", st.Quarantined, len(res.Pages), st)
	}
	// The timeout is counted once its abort returned, just after the move.
	for testutilCounter(t, p.dm, "baton_handoff_failures_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the timeout was not counted")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: "127.0.0.1:1", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}
