// The prefill worker is the gRPC face of its desk (internal/handoff: the
// stages in prefill_run.go, prefill_ship.go and prefill_abort.go there),
// as the decode worker is of decode's:
//
//	prefill_handoff.go  the RPCs of the handoff (Prefill, Abort), each a call to the desk
//	                    (internal/handoff/prefill.go), and the desk's calls to decode over gRPC
//
// This file holds the worker itself.

package roles

import (
	"context"
	"slices"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/handoff"
)

// PrefillOptions configure a prefill worker: its desk's options (the
// worker sets their Decoders) and what only the worker's gRPC face uses.
type PrefillOptions struct {
	PrefillDesk
	Layout                *pdv1.KVLayout
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
}

// Prefill is the prefill worker: it computes prompts in chunks, writes each
// completed page into the decode worker's reserved page, and commits. Its
// desk (internal/handoff) makes every move of a prefill request but the
// engine's; this is its gRPC face.
type Prefill struct {
	pdv1.UnimplementedPrefillServer
	o            PrefillOptions
	grpcAddr     string
	peers        conns
	desk         *handoff.Prefill
	shuttingDown atomic.Bool
}

// SetShuttingDown makes Prefill refuse new work (the worker is shutting down).
func (p *Prefill) SetShuttingDown() { p.shuttingDown.Store(true) }

// Busy reports whether a prefill is in progress.
func (p *Prefill) Busy() bool { return p.desk.Busy() }

// NewPrefill makes a prefill worker and its desk.
func NewPrefill(o PrefillOptions) *Prefill {
	p := &Prefill{o: o}
	switch {
	case o.Auth != nil:
		p.peers.opts = append(slices.Clone(o.DialOptions), o.Auth.DialOptions(auth.RoleDecode)...)
	case len(o.DialOptions) > 0:
		p.peers.opts = append(slices.Clone(o.DialOptions), grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	desk := o.PrefillDesk
	desk.Decoders = decodeWorkers{p}
	p.desk = handoff.NewPrefill(desk)
	return p
}

// SetAddr records the worker's own gRPC address (its identity as a writer).
func (p *Prefill) SetAddr(grpcAddr string) { p.grpcAddr = grpcAddr }

// Close stops the desk and drops peer connections.
func (p *Prefill) Close() {
	p.desk.Close()
	p.peers.close()
}

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
