package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/request"
)

// fakeNet lets a fake prefill "commit" to the fake decode that holds a
// reservation, without a transport.
type fakeNet struct {
	mu      sync.Mutex
	decodes map[string]*fake // by gRPC address
	rooms   atomic.Uint64
}

// fake is a prefill or decode worker: an HTTP server for /health and
// /server_info and a gRPC server for the role's service. It records every
// call the router makes.
type fake struct {
	t    *testing.T
	role string
	net  *fakeNet

	health atomic.Int32 // HTTP status of /health

	mu       sync.Mutex
	info     *pdv1.WorkerInfo
	grpcAddr string
	hs       *httptest.Server
	httpAddr string
	gs       *grpc.Server
	calls    map[string]int
	ids      []string // x-request-id metadata of every non-Info call
	reserves []*pdv1.ReserveRequest
	resv     []*pdv1.Reservation // what Reserve answered, in order
	aborts   []*pdv1.AbortRequest
	finishes []*pdv1.AbortRequest
	prefills []*pdv1.PrefillRequest
	gens     []*pdv1.GenerateRequest
	rooms    map[uint64]*fakeRoom

	// behaviour; nil means the default
	reserveErr func() error
	prefillFn  func(ctx context.Context, req *pdv1.PrefillRequest) error
	streamFn   func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error
	// generateFn stands in for a decode worker computing the prompt itself
	// (nil: it sends tokens as Stream does, from 100 + the tokens it was
	// given beyond the first request's prompt).
	generateFn func(req *pdv1.GenerateRequest, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error
	tokens     int // tokens a default stream sends (default 3)
	// readSoFar, when a test sets it, is closed once its client has read
	// what the worker sent so far.
	readSoFar chan struct{}
	// advertiseAny makes the worker advertise 0.0.0.0:port, as one
	// listening on every interface does.
	advertiseAny bool
}

type fakeRoom struct {
	room      uint64
	id        string // the request id
	committed chan struct{}
	ended     chan struct{} // Abort or Finish
	once      sync.Once
	endOnce   sync.Once
	// closedClean is set when the stream sent its last event after the
	// request ended, i.e. the router did not cut the stream first.
	closedClean atomic.Bool
}

func (r *fakeRoom) commit() { r.once.Do(func() { close(r.committed) }) }
func (r *fakeRoom) end()    { r.endOnce.Do(func() { close(r.ended) }) }

func testLayout() *pdv1.KVLayout {
	return &pdv1.KVLayout{Model: "m", PageSize: 16, Dtype: "f32", Layers: 2, KvHeads: 2, HeadDim: 8}
}

func newFake(t *testing.T, fn *fakeNet, role string) *fake {
	f := &fake{t: t, role: role, net: fn, calls: map[string]int{}, rooms: map[uint64]*fakeRoom{}, tokens: 3}
	f.health.Store(http.StatusOK)
	f.info = &pdv1.WorkerInfo{Role: role, Layout: testLayout(), ContextLength: 1024, MaxSequenceTokens: 1024,
		PoolTokens: 4096, PoolPages: 256, FreePages: 256}
	f.startHTTP("127.0.0.1:0")
	f.startGRPC()
	t.Cleanup(f.stop)
	return f
}

func (f *fake) startHTTP(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		f.t.Fatalf("listen %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(f.health.Load()))
	})
	mux.HandleFunc("GET /server_info", func(w http.ResponseWriter, _ *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		_ = json.NewEncoder(w).Encode(map[string]any{"role": f.role, "grpc_addr": f.info.GrpcAddr, "model": "m"})
	})
	hs := httptest.NewUnstartedServer(mux)
	_ = hs.Listener.Close()
	hs.Listener = ln
	hs.Start()
	f.mu.Lock()
	f.hs, f.httpAddr = hs, ln.Addr().String()
	f.mu.Unlock()
}

func (f *fake) stopHTTP() {
	f.mu.Lock()
	hs := f.hs
	f.hs = nil
	f.mu.Unlock()
	if hs != nil {
		hs.Close()
	}
}

func (f *fake) startGRPC() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.t.Fatal(err)
	}
	gs := grpc.NewServer()
	if f.role == roleDecode {
		pdv1.RegisterDecodeServer(gs, fakeDecode{fake: f})
	} else {
		pdv1.RegisterPrefillServer(gs, fakePrefill{fake: f})
	}
	go func() { _ = gs.Serve(ln) }()
	addr := ln.Addr().String()
	f.mu.Lock()
	f.gs, f.grpcAddr = gs, addr
	f.info.GrpcAddr = addr
	if f.advertiseAny {
		f.info.GrpcAddr = "0.0.0.0:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	}
	f.mu.Unlock()
	if f.role == roleDecode {
		f.net.mu.Lock()
		f.net.decodes[addr] = f
		f.net.mu.Unlock()
	}
}

func (f *fake) stopGRPC() {
	f.mu.Lock()
	gs := f.gs
	f.gs = nil
	f.mu.Unlock()
	if gs != nil {
		gs.Stop()
	}
}

func (f *fake) stop() {
	f.stopGRPC()
	f.stopHTTP()
}

func (f *fake) url() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return "http://" + f.httpAddr
}

func (f *fake) setInfo(fn func(*pdv1.WorkerInfo)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f.info)
}

// record counts a call and its request id metadata.
func (f *fake) record(ctx context.Context, method string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[method]++
	if method == "Info" {
		return
	}
	md, _ := metadata.FromIncomingContext(ctx)
	id := ""
	if v := md.Get(RequestIDKey); len(v) > 0 {
		id = v[0]
	}
	f.ids = append(f.ids, id)
}

// work is the number of calls other than Info: what the capacity gate
// must not cause.
func (f *fake) work() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for m, c := range f.calls {
		if m != "Info" {
			n += c
		}
	}
	return n
}

func (f *fake) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func (f *fake) room(id uint64) *fakeRoom {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rooms[id]
}

type fakeDecode struct {
	pdv1.UnimplementedDecodeServer
	*fake
}

func (d fakeDecode) Info(ctx context.Context, _ *pdv1.InfoRequest) (*pdv1.WorkerInfo, error) {
	d.record(ctx, "Info")
	d.mu.Lock()
	defer d.mu.Unlock()
	return cloneInfo(d.info), nil
}

func cloneInfo(i *pdv1.WorkerInfo) *pdv1.WorkerInfo { return proto.Clone(i).(*pdv1.WorkerInfo) }

func (d fakeDecode) Reserve(ctx context.Context, req *pdv1.ReserveRequest) (*pdv1.Reservation, error) {
	d.record(ctx, "Reserve")
	if d.reserveErr != nil {
		if err := d.reserveErr(); err != nil {
			return nil, err
		}
	}
	id := d.net.rooms.Add(1)
	rm := &fakeRoom{room: id, id: req.RequestId, committed: make(chan struct{}), ended: make(chan struct{})}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reserves = append(d.reserves, req)
	d.rooms[id] = rm
	res := &pdv1.Reservation{Room: id, Epoch: id * 10, Pages: []int32{1, 2}, PromptTokens: uint32(len(req.Prompt)),
		Layout: proto.Clone(d.info.Layout).(*pdv1.KVLayout), Transport: "tcp", DecodeAddr: d.grpcAddr}
	d.resv = append(d.resv, res)
	return proto.Clone(res).(*pdv1.Reservation), nil
}

func (d fakeDecode) Abort(ctx context.Context, req *pdv1.AbortRequest) (*pdv1.Ack, error) {
	d.record(ctx, "Abort")
	d.mu.Lock()
	d.aborts = append(d.aborts, req)
	rm := d.rooms[req.Room]
	d.mu.Unlock()
	if rm != nil {
		rm.end()
	}
	return &pdv1.Ack{}, nil
}

func (d fakeDecode) Finish(ctx context.Context, req *pdv1.AbortRequest) (*pdv1.Ack, error) {
	d.record(ctx, "Finish")
	d.mu.Lock()
	d.finishes = append(d.finishes, req)
	rm := d.rooms[req.Room]
	d.mu.Unlock()
	if rm != nil {
		rm.end()
	}
	return &pdv1.Ack{}, nil
}

func (d fakeDecode) Stream(req *pdv1.StreamRequest, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
	d.record(srv.Context(), "Stream")
	rm := d.room(req.Room)
	if rm == nil {
		return fmt.Errorf("no room %d", req.Room)
	}
	if d.streamFn != nil {
		return d.streamFn(rm, srv)
	}
	// Like a real decode worker: nothing to stream before the commit.
	select {
	case <-rm.committed:
	case <-rm.ended:
		return nil
	case <-srv.Context().Done():
		return nil
	}
	for i := range d.tokens {
		ev := &pdv1.TokenEvent{Token: &pdv1.Token{Id: int32(100 + i), Logprob: -0.5, Top: []*pdv1.TokenLogprob{{Id: int32(100 + i), Logprob: -0.5}, {Id: 7, Logprob: -2}}}}
		if i == d.tokens-1 {
			ev.Finish = request.FinishLength
		}
		if err := srv.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

func (d fakeDecode) Generate(req *pdv1.GenerateRequest, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
	d.record(srv.Context(), "Generate")
	d.mu.Lock()
	d.gens = append(d.gens, req)
	fn := d.generateFn
	d.mu.Unlock()
	if fn != nil {
		return fn(req, srv)
	}
	for i := range d.tokens {
		ev := &pdv1.TokenEvent{Token: &pdv1.Token{Id: int32(100 + i), Logprob: -0.5}}
		if i == d.tokens-1 {
			ev.Finish = request.FinishLength
		}
		if err := srv.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

type fakePrefill struct {
	pdv1.UnimplementedPrefillServer
	*fake
}

func (p fakePrefill) Info(ctx context.Context, _ *pdv1.InfoRequest) (*pdv1.WorkerInfo, error) {
	p.record(ctx, "Info")
	p.mu.Lock()
	defer p.mu.Unlock()
	return cloneInfo(p.info), nil
}

func (p fakePrefill) Prefill(ctx context.Context, req *pdv1.PrefillRequest) (*pdv1.PrefillReply, error) {
	p.record(ctx, "Prefill")
	p.mu.Lock()
	p.prefills = append(p.prefills, req)
	p.mu.Unlock()
	if p.prefillFn != nil {
		if err := p.prefillFn(ctx, req); err != nil {
			return nil, err
		}
	}
	p.net.mu.Lock()
	d := p.net.decodes[req.Reservation.DecodeAddr]
	p.net.mu.Unlock()
	if d == nil {
		return nil, fmt.Errorf("no decode at %s", req.Reservation.DecodeAddr)
	}
	if rm := d.room(req.Reservation.Room); rm != nil {
		rm.commit()
	}
	return &pdv1.PrefillReply{TokensWritten: uint32(len(req.Prompt)), FirstToken: 100}, nil
}

func (p fakePrefill) Abort(ctx context.Context, _ *pdv1.AbortRequest) (*pdv1.Ack, error) {
	p.record(ctx, "Abort")
	return &pdv1.Ack{}, nil
}

// cluster is a router over fake workers.
type cluster struct {
	t       *testing.T
	net     *fakeNet
	prefill []*fake
	decode  []*fake
	r       *Router
	m       *metrics.Set
	logs    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newCluster(t *testing.T, nPrefill, nDecode int, opt func(*Options)) *cluster {
	t.Helper()
	c := &cluster{t: t, net: &fakeNet{decodes: map[string]*fake{}}, logs: &syncBuffer{}}
	for range nPrefill {
		c.prefill = append(c.prefill, newFake(t, c.net, rolePrefill))
	}
	for range nDecode {
		c.decode = append(c.decode, newFake(t, c.net, roleDecode))
	}
	c.m = metrics.New("router")
	o := Options{HealthInterval: time.Hour, Metrics: c.m,
		Logger: slog.New(slog.NewTextHandler(c.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range c.prefill {
		o.Prefill = append(o.Prefill, f.url())
	}
	for _, f := range c.decode {
		o.Decode = append(o.Decode, f.url())
	}
	if opt != nil {
		opt(&o)
	}
	r, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	c.r = r
	t.Cleanup(r.Close)
	t.Cleanup(func() {
		// Every request of every router test moves through its phases in
		// order (phase.go); run's control flow logs any other move.
		if strings.Contains(c.logs.String(), "moved out of order") {
			t.Errorf("a request moved out of order:\n%s", c.logs.String())
		}
	})
	return c
}

func (c *cluster) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.r.Refresh(ctx)
}

func (c *cluster) generate(id string, n int, p request.Params) (*stream, error) {
	prompt := make([]int32, n)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	st, err := c.r.Generate(id, prompt, p)
	if err != nil {
		return nil, err
	}
	return st.(*stream), nil
}

// readAll reads a stream to its last event.
func readAll(t *testing.T, st *stream) (toks []int32, last request.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		ev, ok := st.Next(ctx)
		if !ok {
			t.Fatal("stream did not finish in time")
		}
		if ev.Token != nil {
			toks = append(toks, ev.Token.ID)
		}
		if ev.Finish != "" {
			return toks, ev
		}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
