package roles

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// PrefillOptions configure a prefill worker.
type PrefillOptions struct {
	Engine                *scheduler.Engine
	Pool                  *kvpool.Pool
	Metrics               *metrics.Set
	Layout                *pdv1.KVLayout
	Sender                transfer.Sender
	Transport             string // the Sender's name ("tcp" if empty); must match Reservation.transport
	ContextLength, MaxSeq int
	// Auth authenticates this worker's calls to decode workers (nil:
	// plaintext, tests on loopback).
	Auth *auth.Plane
	Log  *slog.Logger
}

// Prefill is the prefill worker: it computes prompts in chunks, writes each
// completed page into the decode worker's reserved page, and commits.
type Prefill struct {
	pdv1.UnimplementedPrefillServer
	o        PrefillOptions
	grpcAddr string
	peers    conns

	mu       sync.Mutex
	active   map[transfer.Key]context.CancelFunc
	known    map[string]bool // decode gRPC addresses the router paired this worker with
	draining atomic.Bool
}

// maxKnownDecode bounds the decode addresses remembered: a cluster has far
// fewer decode workers, and a caller cannot grow the table without bound.
const maxKnownDecode = 4096

// learnDecode remembers a decode worker the router paired this worker
// with; only those are ever dialled on a decode worker's word.
func (p *Prefill) learnDecode(addr string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.known) < maxKnownDecode {
		p.known[addr] = true
	}
}

func (p *Prefill) knowsDecode(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.known[addr] || !faults.On(faults.GuardDialKnown)
}

// SetDraining makes Prefill refuse new work (the worker is shutting down).
func (p *Prefill) SetDraining() { p.draining.Store(true) }

// Busy reports whether a prefill is in progress.
func (p *Prefill) Busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.active) > 0
}

// NewPrefill makes a prefill worker.
func NewPrefill(o PrefillOptions) *Prefill {
	p := &Prefill{o: o, active: map[transfer.Key]context.CancelFunc{}, known: map[string]bool{}}
	if o.Auth != nil {
		p.peers.opts = o.Auth.DialOptions(auth.RoleDecode)
	}
	return p
}

// SetAddr records the worker's own gRPC address (its identity as a writer).
func (p *Prefill) SetAddr(grpcAddr string) { p.grpcAddr = grpcAddr }

// Close drops peer connections.
func (p *Prefill) Close() { p.peers.close() }

// WorkerInfo implements Worker.
func (p *Prefill) WorkerInfo() *pdv1.WorkerInfo {
	running, queued := p.o.Engine.Load()
	info := &pdv1.WorkerInfo{Role: "prefill", Layout: p.o.Layout, ContextLength: uint32(p.o.ContextLength), MaxSequenceTokens: uint32(p.o.MaxSeq),
		Running: uint32(running), Queued: uint32(queued), Transport: p.transport(), GrpcAddr: p.grpcAddr, InternalAuth: describeAuth(p.o.Auth)}
	poolInfo(info, p.o.Pool)
	return info
}

// Info implements the RPC.
func (p *Prefill) Info(context.Context, *pdv1.InfoRequest) (*pdv1.WorkerInfo, error) {
	return p.WorkerInfo(), nil
}

func requestID(ctx context.Context, fallback string) string {
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get("x-request-id"); len(v) > 0 {
			return v[0]
		}
	}
	return fallback
}

// shipper packs completed pages on the engine loop (so local pages can be
// released as soon as the prompt is done) and writes them to the session
// on its own goroutine (so a slow network never stalls the engine).
type shipper struct {
	res       *pdv1.Reservation
	pageSize  int
	promptLen int
	checksums []uint64
	queue     chan transfer.PageWrite
	done      chan error
	firstAt   time.Time // when the first page was queued (engine loop only, read after finish)
	packErr   error     // a page that could not be read from the pool (engine loop only, read after finish)
}

func newShipper(res *pdv1.Reservation, pageSize, promptLen int, sess transfer.Session) *shipper {
	s := &shipper{res: res, pageSize: pageSize, promptLen: promptLen, checksums: make([]uint64, len(res.Pages)),
		queue: make(chan transfer.PageWrite, len(res.Pages)), done: make(chan error, 1)}
	go func() {
		var first error
		for w := range s.queue {
			if first == nil {
				first = sess.Write(w)
			}
		}
		s.done <- first
	}()
	return s
}

// onChunk runs on the engine loop after positions [from, to) were computed;
// it ships every page this completed (the last, partial page with the
// prompt's end). The queue holds every page of the prompt, so it never blocks.
func (s *shipper) onChunk(kv kernels.PagedKV, pages []int32, from, to int) {
	for i := from / s.pageSize; i*s.pageSize < to; i++ {
		end := min((i+1)*s.pageSize, s.promptLen)
		if to < end || i >= len(s.res.Pages) {
			break
		}
		tokens := end - i*s.pageSize
		if s.packErr != nil {
			return
		}
		data, err := transfer.ReadPage(kv, pages[i], tokens, make([]byte, 0, transfer.PackedSize(kv, tokens)))
		if err != nil {
			s.packErr = fmt.Errorf("reading page %d of the prompt: %w", i, err)
			return
		}
		s.checksums[i] = transfer.Checksum(data)
		if s.firstAt.IsZero() {
			s.firstAt = time.Now()
		}
		s.queue <- transfer.PageWrite{Index: i, Page: s.res.Pages[i], Tokens: tokens, Data: data}
	}
}

// finish waits until every queued page was handed to the session.
func (s *shipper) finish() error {
	close(s.queue)
	if err := <-s.done; err != nil {
		return err
	}
	return s.packErr
}

func (p *Prefill) transport() string {
	if p.o.Transport == "" {
		return "tcp"
	}
	return p.o.Transport
}

// Prefill implements the RPC.
func (p *Prefill) Prefill(ctx context.Context, req *pdv1.PrefillRequest) (*pdv1.PrefillReply, error) {
	id := requestID(ctx, req.RequestId)
	res := req.Reservation
	if res == nil {
		return nil, status.Error(codes.InvalidArgument, "prefill without a reservation")
	}
	capability, ok := transfer.CapabilityFrom(res.Capability)
	if !ok {
		return nil, status.Error(codes.InvalidArgument, "reservation without a capability")
	}
	key := transfer.Key{Room: res.Room, Epoch: res.Epoch, Cap: capability}
	p.learnDecode(res.DecodeAddr)
	// Test builds may inject faults here; release builds roll none.
	rf := faults.ForRequest()
	if p.draining.Load() {
		p.drained(id, res, key, rf.LostDrained)
		return nil, status.Error(codes.Unavailable, "prefill worker is shutting down")
	}
	log := p.o.Log.With("request_id", id, "room", key.Room, "epoch", key.Epoch)
	if why := LayoutMismatch(p.o.Layout, res.Layout); why != "" {
		p.o.Metrics.HandoffFailures.WithLabelValues("layout").Inc()
		p.drained(id, res, key, rf.LostDrained)
		return nil, status.Errorf(codes.FailedPrecondition, "KV layout mismatch between prefill and decode: %s", why)
	}
	if res.Transport != "" && res.Transport != p.transport() {
		p.drained(id, res, key, rf.LostDrained)
		return nil, status.Errorf(codes.FailedPrecondition, "decode reserved over transport %q, this prefill worker speaks %q", res.Transport, p.transport())
	}
	if int(res.PromptTokens) != len(req.Prompt) || len(res.Pages) != p.o.Pool.PagesFor(len(req.Prompt)) {
		p.drained(id, res, key, rf.LostDrained)
		return nil, status.Errorf(codes.InvalidArgument, "reservation covers %d tokens in %d pages; the prompt has %d tokens",
			res.PromptTokens, len(res.Pages), len(req.Prompt))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.mu.Lock()
	p.active[key] = cancel
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.active, key)
		p.mu.Unlock()
	}()

	r := scheduler.NewRoleRequest(scheduler.RolePrefill, id, req.Prompt, ParamsFromPB(req.Sampling))
	// The door first: a request this worker cannot hold is rejected before
	// any session to decode exists.
	if err := p.o.Engine.CheckDoor(r); err != nil {
		log.Info("prefill refused", "err", err)
		p.drained(id, res, key, rf.LostDrained)
		return nil, rejectStatus(err)
	}
	sessKey := key
	if rf.WrongEpoch {
		sessKey.Epoch++
	}
	sess, err := p.o.Sender.Open(ctx, res.TransferAddr, sessKey)
	if err != nil {
		_ = r.Lifecycle().To(scheduler.StateAborting, "transport open failed")
		p.end(id, r, nil, res, key, rf, "transport open failed")
		return nil, status.Errorf(codes.Unavailable, "cannot reach decode transport %s: %v", res.TransferAddr, err)
	}
	sess = faults.WrapSession(sess, rf, len(res.Pages)-1)
	p.o.Metrics.TransferSessions.Inc()
	ship := newShipper(res, p.o.Pool.PageSize(), len(req.Prompt), sess)
	r.OnChunk = ship.onChunk
	if err := p.o.Engine.Submit(r); err != nil {
		_ = sess.Close()
		_ = ship.finish()
		p.drained(id, res, key, rf.LostDrained)
		return nil, rejectStatus(err)
	}
	start := time.Now()

	ev, ok := r.Next(ctx)
	for ok && ev.Finish == "" {
		ev, ok = r.Next(ctx)
	}
	if !ok || ev.Finish != scheduler.FinishPrefilled {
		why := "prefill aborted"
		if ok && ev.Err != nil {
			why = ev.Err.Error()
		}
		r.Cancel()
		p.wait(r) // the engine has let go of r: no more pages will be queued
		_ = sess.Close()
		_ = ship.finish()
		p.end(id, r, nil, res, key, rf, why)
		if !ok {
			return nil, status.Error(codes.Canceled, why)
		}
		return nil, status.Error(codes.Internal, why)
	}
	// Every write must have landed before Commit claims it did.
	err = ship.finish()
	if err == nil {
		err = sess.Flush(ctx)
	}
	if err != nil {
		p.o.Metrics.HandoffFailures.WithLabelValues("transfer").Inc()
		_ = r.Lifecycle().To(scheduler.StateAborting, err.Error())
		p.end(id, r, sess, res, key, rf, err.Error())
		return nil, status.Errorf(codes.Unavailable, "KV transfer failed: %v", err)
	}
	bytes := sess.Bytes()
	_ = sess.Close()
	p.o.Metrics.TransferBytes.Add(float64(bytes))
	p.o.Metrics.TransferSeconds.Observe(time.Since(ship.firstAt).Seconds())

	cc, err := p.peers.get(res.DecodeAddr)
	if err == nil {
		cctx, ccancel := context.WithTimeout(withRequestID(ctx, id), 30*time.Second)
		claimed := uint32(len(req.Prompt))
		if rf.OverClaim {
			claimed++
		}
		sid := sess.ID()
		_, err = pdv1.NewDecodeClient(cc).Commit(cctx, &pdv1.CommitRequest{Room: res.Room, Epoch: sessKey.Epoch, TokensWritten: claimed,
			PageChecksums: ship.checksums, FirstToken: TokenToPB(ev.Token), Writer: p.grpcAddr, Capability: res.Capability, SessionId: sid[:],
			PromptLogprobs: TokensToPB(ev.Prompt)})
		ccancel()
	}
	if err != nil {
		p.o.Metrics.HandoffFailures.WithLabelValues("commit").Inc()
		_ = r.Lifecycle().To(scheduler.StateAborting, "commit refused: "+err.Error())
		p.end(id, r, nil, res, key, rf, "commit refused")
		log.Warn("commit refused", "err", err)
		return nil, status.Errorf(status.Code(err), "commit refused by decode: %v", status.Convert(err).Message())
	}
	if err := r.Lifecycle().To(scheduler.StateSent, ""); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	p.o.Metrics.Outcome("sent")
	log.Info("prefilled and committed", "tokens", len(req.Prompt), "bytes", bytes, "seconds", time.Since(start).Seconds())
	return &pdv1.PrefillReply{TokensWritten: uint32(len(req.Prompt)), FirstToken: ev.Token.ID}, nil
}

// wait reads r's events until its last (the engine has torn it down).
func (p *Prefill) wait(r *scheduler.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ev, ok := r.Next(ctx)
		if !ok || ev.Finish != "" {
			return
		}
	}
}

// end tears a failed prefill down in the order the page rules need: close
// the session (after which nothing of it is in flight), then tell decode
// Drained, then Drained here.
func (p *Prefill) end(id string, r *scheduler.Request, sess transfer.Session, res *pdv1.Reservation, key transfer.Key, rf faults.Request, why string) {
	if sess != nil {
		_ = sess.Close()
	}
	if r.Lifecycle().Live() {
		_ = r.Lifecycle().To(scheduler.StateAborting, why)
	}
	p.drained(id, res, key, rf.LostDrained)
	_ = r.Lifecycle().To(scheduler.StateDrained, "")
	p.o.Metrics.Outcome("drained")
}

// drained tells decode this worker has no write in flight for key and will
// issue none.
func (p *Prefill) drained(id string, res *pdv1.Reservation, key transfer.Key, lost bool) {
	if lost { // an injected fault: the message never arrives
		return
	}
	cc, err := p.peers.get(res.DecodeAddr)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(withRequestID(context.Background(), id), 10*time.Second)
	defer cancel()
	if _, err := pdv1.NewDecodeClient(cc).Drained(ctx, &pdv1.DrainedRequest{Room: key.Room, Epoch: key.Epoch, Writer: p.grpcAddr, Capability: key.Cap[:]}); err != nil {
		p.o.Log.Warn("drained not delivered; decode keeps the pages quarantined until the session is proven closed", "request_id", id, "err", err)
	}
}

// Abort implements the RPC: stop writing for a room. A prefill in progress
// is cancelled and says Drained itself once its session is closed; for a
// room with nothing in progress, Drained goes at once.
func (p *Prefill) Abort(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	capability, _ := transfer.CapabilityFrom(a.Capability)
	key := transfer.Key{Room: a.Room, Epoch: a.Epoch, Cap: capability}
	p.mu.Lock()
	cancel, ok := p.active[key]
	p.mu.Unlock()
	if ok && faults.IgnoreAbort() {
		return &pdv1.Ack{}, nil // test builds only: a writer that keeps writing
	}
	if ok {
		cancel()
		return &pdv1.Ack{}, nil
	}
	if a.DecodeAddr == "" {
		return nil, errors.New("abort without a decode address to answer")
	}
	if !p.knowsDecode(a.DecodeAddr) {
		// The answer goes only where the router sent this worker before;
		// an address taken from the request alone is never dialled.
		p.o.Metrics.InternalAuthFailures.WithLabelValues("Abort").Inc()
		return nil, status.Error(codes.PermissionDenied, "abort from a decode worker this prefill worker was never paired with")
	}
	go p.drained(a.RequestId, &pdv1.Reservation{DecodeAddr: a.DecodeAddr}, key, false)
	return &pdv1.Ack{}, nil
}
