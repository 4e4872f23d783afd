// The decode worker, stage by stage (one file each, in the order a request
// meets them):
//
//	decode_reserve.go  Reserve: the door, the reservation and its capability, per-peer bounds
//	decode_receive.go  the transport's gate: a session is admitted, its frames land
//	decode_commit.go   Commit: every claim checked against what landed, then the batch
//	decode_stream.go   Stream: the generated tokens, to the router
//	decode_abort.go    abort and drain: the writer is told, the pages wait for its proof
//
// This file holds the worker itself, its reservation table and the sweep
// that forgets ended reservations. The prefill worker mirrors it
// (prefill.go).

package roles

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
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
	// Guards are the worker's handoff and plane checks (guards.go); the
	// zero value is every check.
	Guards DecodeGuards
	// Faults are injected only by the faults build's command; the zero
	// value injects none.
	Faults DecodeFaults
}

// reservation is one live use of decode pages by a handed-over request.
type reservation struct {
	r      *scheduler.Request
	key    transfer.Key // with the capability; Session is the bound session
	writer string       // prefill gRPC address
	prompt []int32
	peer   string // who reserved it, for the per-peer bounds
	held   int    // pages it counts against its peer

	// mu orders page writes against Commit's move to Verifying: a write
	// lands only while the request is Reserved or Receiving, checked and
	// done under mu, so none lands once the pages are being verified.
	mu        sync.Mutex
	bound     bool // a transfer session was admitted: key.Session names it
	firstByte time.Time
	abortedAt time.Time
	reader    bool // a Stream call took the reservation's events
	timer     *time.Timer
}

// Decode is the decode worker: it reserves pages, receives the prompt's KV
// through a transport, verifies the Commit, and generates.
type Decode struct {
	pdv1.UnimplementedDecodeServer
	o            DecodeOptions
	recv         transfer.Receiver
	grpcAddr     string
	transferAddr string
	oneSided     bool // the receiver is one-sided: no frames, pages proven at Commit
	peers        conns
	shuttingDown atomic.Bool

	// mu guards the tables. It is never held while waiting on the engine
	// (the engine runs ended, which takes it, on its loop).
	mu    sync.Mutex
	rooms map[transfer.Key]*reservation // by room and epoch alone
	over  map[transfer.Key]time.Time    // rooms whose request ended, and when
	usage map[string]*peerUse
	stop  chan struct{}
	wg    sync.WaitGroup
}

// NewDecode makes a decode worker. Attach a receiver with SetReceiver.
func NewDecode(o DecodeOptions) *Decode {
	if o.HandoffTimeout <= 0 {
		o.HandoffTimeout = 60 * time.Second
	}
	d := &Decode{o: o, rooms: map[transfer.Key]*reservation{}, over: map[transfer.Key]time.Time{}, usage: map[string]*peerUse{}, stop: make(chan struct{})}
	d.o.Guards = o.Guards.withChecks(d)
	d.o.Faults = o.Faults.withNone()
	if o.Auth != nil {
		d.peers.opts = o.Auth.DialOptions(auth.RolePrefill)
	}
	d.wg.Add(1)
	go d.sweep()
	return d
}

// SetReceiver attaches the transport receiver (made with d as its Sink) and
// the addresses peers reach this worker's gRPC server and receiver at.
func (d *Decode) SetReceiver(r transfer.Receiver, grpcAddr, transferAddr string) {
	d.recv, d.grpcAddr, d.transferAddr = r, grpcAddr, transferAddr
	d.oneSided = transfer.IsOneSided(r)
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
func (d *Decode) Busy() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, res := range d.rooms {
		if !res.r.Lifecycle().Terminal() {
			return true
		}
	}
	return false
}

// Close stops the sweeper and drops peer connections.
func (d *Decode) Close() {
	close(d.stop)
	d.wg.Wait()
	d.peers.close()
}

// WorkerInfo implements Worker.
func (d *Decode) WorkerInfo() *pdv1.WorkerInfo {
	running, queued := d.o.Engine.Load()
	info := &pdv1.WorkerInfo{Role: "decode", Layout: d.o.Layout, ContextLength: uint32(d.o.ContextLength), MaxSequenceTokens: uint32(d.o.MaxSeq),
		Running: uint32(running), Queued: uint32(queued), Transport: d.transport(), GrpcAddr: d.grpcAddr}
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

// ended runs once, on the move that ends a reservation's request (a
// terminal state: its pages are released and no writer holds them), on
// whichever goroutine made it (the engine loop, mostly): the request no
// longer counts against the worker or its peer.
func (d *Decode) ended(res *reservation) {
	d.o.Metrics.ReservationsActive.Dec()
	d.releasePeer(res.peer, res.held)
	d.mu.Lock()
	d.over[roomKey(res.key.Room, res.key.Epoch)] = time.Now()
	d.mu.Unlock()
}

// forget drops an ended reservation from the table (its events were
// streamed, or nobody came for them).
func (d *Decode) forget(res *reservation) {
	k := roomKey(res.key.Room, res.key.Epoch)
	d.mu.Lock()
	if _, over := d.over[k]; over {
		delete(d.rooms, k)
		delete(d.over, k)
	}
	d.mu.Unlock()
}

// sweep forgets reservations that ended more than a minute ago without a
// Stream taking their last event.
func (d *Decode) sweep() {
	defer d.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		d.mu.Lock()
		for k, at := range d.over {
			if time.Since(at) > time.Minute {
				delete(d.rooms, k)
				delete(d.over, k)
			}
		}
		d.mu.Unlock()
	}
}
