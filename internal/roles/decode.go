// The decode worker, stage by stage (one file each, in the order a request
// meets them):
//
//	decode_handoff.go  Reserve, the transport's Sink, Commit, Abort, Finish, Drained: each an
//	                   event for the handoff desk (internal/handoff), its answer a status code
//	decode_stream.go   Stream: the generated tokens, to the router
//
// This file holds the worker itself. The desk owns every move of a
// request before it joins the batch. The prefill worker mirrors it
// (prefill.go).

package roles

import (
	"context"
	"errors"
	"github.com/batonlm/baton/internal/handoff"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// DecodeOptions configure a decode worker.
type DecodeOptions struct {
	Engine  *scheduler.Engine
	Pool    *kvpool.Pool
	Metrics *metrics.Set
	Layout  *pdv1.KVLayout
	// ContextLength is the model's configured context; MaxSeq the effective one.
	ContextLength, MaxSeq int
	// HandoffTimeout bounds the wait for Commit after Reserve; past it the
	// request is aborted (its pages still wait for the writer to drain).
	HandoffTimeout time.Duration
	// Transport names the KV transport in Reserve replies ("tcp" if empty;
	// "ucx").
	Transport string
	// Landing, when set, is where a one-sided transport's writes land
	// instead of the pool: host memory the transport registered, page for
	// page the pool's shape, for a pool the transport cannot reach (GPU
	// memory). Commit verifies each page there and then copies it into
	// the pool.
	Landing kernels.PagedKV
	// MaxReservationsPerPeer and MaxPagesPerPeer bound what one caller of
	// Reserve may hold at once (0: no bound), so that one member gone
	// wrong cannot take the whole pool.
	MaxReservationsPerPeer, MaxPagesPerPeer int
	// Identity is what the worker serves, reported in Info.
	Identity Identity
	// Cache, when set, is the engine's prefix cache (decode keeps finished
	// requests' pages): Commit re-checks the pages a reservation holds from
	// it against the checksums it recorded when they were cached.
	Cache *prefixcache.Cache
	// Auth authenticates this worker's calls to prefill workers (nil:
	// plaintext, tests on loopback).
	Auth *auth.Plane
	Log  *slog.Logger
	// Guards are the desk's handoff checks (internal/handoff/guards.go);
	// the zero value is every check.
	Guards DecodeGuards
	// Faults are injected only by the faults build's command; the zero
	// value injects none.
	Faults DecodeFaults
}

// Decode is the decode worker: the gRPC face of its handoff desk
// (internal/handoff), which reserves pages, admits the transport's
// sessions, verifies the Commit and aborts, and of its engine, which
// generates.
type Decode struct {
	pdv1.UnimplementedDecodeServer
	o            DecodeOptions
	desk         *handoff.Decode
	grpcAddr     string
	transferAddr string
	peers        conns
	shuttingDown atomic.Bool
	live         liveStreams // the Stream calls, for HandBack
}

// NewDecode makes a decode worker. Attach a receiver with SetReceiver.
func NewDecode(o DecodeOptions) *Decode {
	d := &Decode{o: o}
	if o.Auth != nil {
		d.peers.opts = o.Auth.DialOptions(auth.RolePrefill)
	}
	d.desk = handoff.NewDecode(handoff.DecodeOptions{Engine: o.Engine, Pool: o.Pool, Metrics: o.Metrics, MaxSeq: o.MaxSeq,
		HandoffTimeout: o.HandoffTimeout, Landing: o.Landing, MaxReservationsPerPeer: o.MaxReservationsPerPeer,
		MaxPagesPerPeer: o.MaxPagesPerPeer, Cache: o.Cache, Writers: prefillWriters{d}, Log: o.Log, Guards: o.Guards, Faults: o.Faults})
	return d
}

// SetReceiver attaches the transport receiver (made with d as its Sink) and
// the addresses peers reach this worker's gRPC server and receiver at.
func (d *Decode) SetReceiver(r transfer.Receiver, grpcAddr, transferAddr string) {
	d.grpcAddr, d.transferAddr = grpcAddr, transferAddr
	d.desk.SetReceiver(r)
}

func (d *Decode) transport() string {
	if d.o.Transport == "" {
		return "tcp"
	}
	return d.o.Transport
}

// SetShuttingDown makes Reserve refuse new work (the worker is shutting down);
// what it already holds runs to the end.
func (d *Decode) SetShuttingDown() { d.shuttingDown.Store(true) }

// Busy reports whether any reservation is still open.
func (d *Decode) Busy() bool { return d.desk.Busy() }

// Close stops the desk and drops peer connections.
func (d *Decode) Close() {
	d.desk.Close()
	d.peers.close()
}

// WorkerInfo implements Worker.
func (d *Decode) WorkerInfo() *pdv1.WorkerInfo {
	running, queued := d.o.Engine.Load()
	info := &pdv1.WorkerInfo{Role: "decode", Layout: d.o.Layout, ContextLength: uint32(d.o.ContextLength), MaxSequenceTokens: uint32(d.o.MaxSeq),
		Running: uint32(running), Queued: uint32(queued), Transport: d.transport(), GrpcAddr: d.grpcAddr, PrefillsLocally: true}
	info.TransferAddr = d.transferAddr
	info.InternalAuth = describeAuth(d.o.Auth)
	info.ServedModel, info.TokenizerFingerprint = d.o.Identity.ServedModel, d.o.Identity.Tokenizer
	poolInfo(info, d.o.Pool)
	return info
}

// Info implements the RPC.
func (d *Decode) Info(context.Context, *pdv1.InfoRequest) (*pdv1.WorkerInfo, error) {
	return d.WorkerInfo(), nil
}

func rejectStatus(err error) error {
	var rej *scheduler.RejectError
	if errors.As(err, &rej) {
		if rej.Status == http.StatusBadRequest {
			return status.Error(codes.InvalidArgument, rej.Message)
		}
		return status.Error(codes.ResourceExhausted, rej.Message)
	}
	return status.Error(codes.Internal, err.Error())
}
