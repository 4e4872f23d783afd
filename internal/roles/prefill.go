// The prefill worker, stage by stage, mirroring the decode worker:
//
//	prefill_run.go    Prefill: the door, a session to the reservation, the chunks, flush, Commit
//	prefill_ship.go   each completed page read from the pool and written to the session
//	prefill_abort.go  abort and drain: close the session, then tell decode Drained
//
// This file holds the worker itself and the decode workers it may answer.

package roles

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
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
	// Identity is what the worker serves, reported in Info.
	Identity Identity
	// Auth authenticates this worker's calls to decode workers (nil:
	// plaintext, tests on loopback).
	Auth *auth.Plane
	// DialOptions go before Auth's on every call to a decode worker, so
	// that they see (and may change) a call before it is signed: where a
	// faults build puts its decorators (cmd/baton/inject_faults.go).
	DialOptions []grpc.DialOption
	Log         *slog.Logger
	// Guards are the worker's plane checks (guards.go); the zero value is
	// every check.
	Guards PrefillGuards
}

// Prefill is the prefill worker: it computes prompts in chunks, writes each
// completed page into the decode worker's reserved page, and commits.
type Prefill struct {
	pdv1.UnimplementedPrefillServer
	o        PrefillOptions
	grpcAddr string
	peers    conns

	mu           sync.Mutex
	active       map[transfer.Key]context.CancelFunc
	known        map[string]bool // decode gRPC addresses the router paired this worker with
	shuttingDown atomic.Bool
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

// knowsDecode is the dial_known check (PrefillGuards.DialKnown): a decode
// worker's word may make this worker dial addr only if the router paired
// them.
func (p *Prefill) knowsDecode(addr string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.known[addr]
}

// SetShuttingDown makes Prefill refuse new work (the worker is shutting down).
func (p *Prefill) SetShuttingDown() { p.shuttingDown.Store(true) }

// Busy reports whether a prefill is in progress.
func (p *Prefill) Busy() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.active) > 0
}

// NewPrefill makes a prefill worker.
func NewPrefill(o PrefillOptions) *Prefill {
	p := &Prefill{o: o, active: map[transfer.Key]context.CancelFunc{}, known: map[string]bool{}}
	p.o.Guards = o.Guards.withChecks(p)
	switch {
	case o.Auth != nil:
		p.peers.opts = append(slices.Clone(o.DialOptions), o.Auth.DialOptions(auth.RoleDecode)...)
	case len(o.DialOptions) > 0:
		p.peers.opts = append(slices.Clone(o.DialOptions), grpc.WithTransportCredentials(insecure.NewCredentials()))
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
		Running: uint32(running), Queued: uint32(queued), Transport: p.transport(), GrpcAddr: p.grpcAddr, InternalAuth: describeAuth(p.o.Auth),
		ServedModel: p.o.Identity.ServedModel, TokenizerFingerprint: p.o.Identity.Tokenizer}
	poolInfo(info, p.o.Pool)
	return info
}

// Info implements the RPC.
func (p *Prefill) Info(context.Context, *pdv1.InfoRequest) (*pdv1.WorkerInfo, error) {
	return p.WorkerInfo(), nil
}

// Tokenizer implements the RPC: the files of the worker's tokenizer, for a
// router started without --model.
func (p *Prefill) Tokenizer(context.Context, *pdv1.TokenizerRequest) (*pdv1.TokenizerFiles, error) {
	if p.o.Identity.Files == nil {
		return nil, status.Error(codes.NotFound, "this worker keeps no tokenizer files to hand out")
	}
	return p.o.Identity.Files, nil
}

func (p *Prefill) transport() string {
	if p.o.Transport == "" {
		return "tcp"
	}
	return p.o.Transport
}
