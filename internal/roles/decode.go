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
	"net/http"
	"sync/atomic"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// DecodeOptions configure a decode worker: its desk's options (the worker
// sets their Writers) and what only the worker's gRPC face uses.
type DecodeOptions struct {
	DecodeDesk
	Layout *pdv1.KVLayout
	// ContextLength is the model's configured context (the desk's MaxSeq
	// is the effective one).
	ContextLength int
	// Transport names the KV transport in Reserve replies ("tcp" if empty;
	// "ucx").
	Transport string
	// Identity is what the worker serves, reported in Info.
	Identity Identity
	// Auth authenticates this worker's calls to prefill workers (nil:
	// plaintext, tests on loopback).
	Auth *auth.Plane
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
	desk := o.DecodeDesk
	desk.Writers = prefillWriters{d}
	d.desk = handoff.NewDecode(desk)
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
