// Package handoff is the one owner of a PD request on a worker before its
// engine has it: the decode desk (Decode) makes every move of a handed-over
// request from Reserve to the batch, and of an aborted one until its pages
// come back. It is fed by events, as the engine loop is
// (internal/scheduler/messages.go): RPC handlers, transport goroutines and
// timers post what happened and, where they need the outcome, wait for the
// answer. Work that waits (the engine loop, checksums, calls to prefill)
// runs on goroutines of its own that report back as events. The prefill
// desk (Prefill, prefill.go) is its mirror on the prefill worker: the one
// owner of a prefill request's moves that are not its engine's, from the
// door to Sent or Drained.
//
// The decode desk, stage by stage (one file each, in the order a request
// meets them):
//
//	decode_reserve.go  Reserve: the door, the reservation and its capability, per-peer bounds
//	decode_receive.go  the transport's gate: a session is admitted, its frames land under the lease
//	decode_commit.go   Commit: the lease revoked, every claim checked against what landed, then the batch
//	decode_abort.go    abort and drain: the writer is told, the pages wait for its proof
//
// This file holds the desk itself: its inbox, its table and the sweep that
// forgets ended reservations. internal/roles turns the gRPC calls into the
// desk's events and its answers into status codes.
package handoff

import (
	"context"
	"log/slog"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// DecodeOptions configure a decode desk.
type DecodeOptions struct {
	Engine  *scheduler.Engine
	Pool    *kvpool.Pool
	Metrics *metrics.Set
	// MaxSeq is the effective context, which bounds what a request counts
	// against its caller.
	MaxSeq int
	// HandoffTimeout bounds the wait for Commit after Reserve; past it the
	// request is aborted (its pages still wait for the writer to drain).
	HandoffTimeout time.Duration
	// Landing, when set, is where a one-sided transport's writes land
	// instead of the pool: host memory the transport registered, page for
	// page the pool's shape, for a pool the transport cannot reach (GPU
	// memory). Commit verifies each page there and then copies it into
	// the pool.
	Landing kernels.PagedKV
	// Sums is the transport's page checksum, which Commit's claims are
	// checked against (nil: transfer.HostSums, tcp's and ucx's into host
	// memory; cuda-ipc's, and ucx's into a registered GPU pool, is
	// transfer.DeviceSums). With a one-sided transport and no Landing, the
	// pages are checked with it in one batch.
	Sums transfer.Sums
	// MaxReservationsPerPeer and MaxPagesPerPeer bound what one caller of
	// Reserve may hold at once (0: no bound), so that one member gone
	// wrong cannot take the whole pool.
	MaxReservationsPerPeer, MaxPagesPerPeer int
	// Cache, when set, is the engine's prefix cache (decode keeps finished
	// requests' pages): Commit re-checks the pages a reservation holds from
	// it against the checksums it recorded when they were cached.
	Cache *prefixcache.Cache
	// Writers reaches the prefill workers that write reservations.
	Writers Writers
	Log     *slog.Logger
	// Guards are the desk's handoff checks (guards.go); the zero value is
	// every check.
	Guards DecodeGuards
	// Faults are injected only by the faults build's command; the zero
	// value injects none.
	Faults DecodeFaults
}

// Writers are the calls the desk makes to a reservation's writer, a
// prefill worker, so that this package needs no RPC stack of its own.
type Writers interface {
	// Abort asks writer to stop writing key's pages; it answers Drained
	// once nothing of it is in flight. An error leaves the pages
	// quarantined: only Drained or a transport proof frees them.
	Abort(writer string, key transfer.Key, requestID, why string) error
}

// reservation is one live use of decode pages by a handed-over request.
// Only the desk's goroutine reads or writes its fields, but for the lease,
// which the transport's goroutines share.
type reservation struct {
	r       *scheduler.Request
	ho      *scheduler.Handover // the request's moves until it is enqueued
	key     transfer.Key        // with the capability; the bound session is the lease's
	writer  string              // prefill gRPC address
	prompt  []int32
	peer    string // who reserved it, for the per-peer bounds
	counted int    // pages it counts against its peer
	lease   *lease
	// log names the request (and its trace, when traced) on the desk's
	// lines about it; tctx carries the span of its Reserve call, the
	// parent of the spans the desk makes for it after that call returned.
	log  *slog.Logger
	tctx context.Context

	firstByte time.Time
	abortedAt time.Time
	reader    bool // a Stream took the reservation's events
	joined    bool // Commit put it into the batch: the engine owns it, the handoff timer no longer counts
	timer     *time.Timer

	// busy: a call for it waits (the checks, the engine loop); its next
	// events wait in pending, so that its moves happen in the order they
	// were posted.
	busy    bool
	pending []func()
}

// Decode is the decode desk.
type Decode struct {
	o        DecodeOptions
	recv     transfer.Receiver
	oneSided bool // the receiver is one-sided: no frames, pages proven at Commit

	inbox

	// Owned by the desk's goroutine.
	rooms map[transfer.Key]*reservation // by room and epoch alone
	over  map[transfer.Key]time.Time    // rooms whose request ended, and when
	usage map[string]*peerUse

	// leases are what the frames find, without waiting on the desk; the
	// desk adds and removes them with the rooms.
	leases leaseTable
}

// NewDecode makes a decode desk and starts its goroutine.
func NewDecode(o DecodeOptions) *Decode {
	if o.HandoffTimeout <= 0 {
		o.HandoffTimeout = 60 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	d := &Decode{o: o, inbox: newInbox(),
		rooms: map[transfer.Key]*reservation{}, over: map[transfer.Key]time.Time{}, usage: map[string]*peerUse{}}
	d.leases.m = map[transfer.Key]*lease{}
	d.o.Guards = o.Guards.withChecks(d)
	d.o.Faults = o.Faults.withNone()
	go d.serve(time.Second, d.sweep)
	return d
}

// SetReceiver attaches the transport receiver (made with d as its Sink).
func (d *Decode) SetReceiver(r transfer.Receiver) {
	d.recv = r
	d.oneSided = transfer.IsOneSided(r)
}

// on runs ev for res now, or after the call res waits on returns.
func (d *Decode) on(res *reservation, ev func()) {
	if res.busy {
		res.pending = append(res.pending, ev)
		return
	}
	ev()
}

// await runs slow (checks, or a call that waits on the engine loop) on a
// goroutine of its own, then then on the desk. Until then, res takes no
// other event: they wait in its pending list, in their order.
func (d *Decode) await(res *reservation, slow func(), then func()) {
	res.busy = true
	go func() {
		slow()
		d.post(func() {
			res.busy = false
			then()
			for !res.busy && len(res.pending) > 0 {
				ev := res.pending[0]
				res.pending = res.pending[1:]
				ev()
			}
		})
	}()
}

// Busy reports whether any reservation is still open.
func (d *Decode) Busy() bool {
	busy, _ := call(&d.inbox, func(answer func(bool)) {
		for _, res := range d.rooms {
			if !res.r.Lifecycle().Terminal() {
				answer(true)
				return
			}
		}
		answer(false)
	})
	return busy
}

// ended is posted once, by the move that ends a reservation's request (a
// terminal state: its pages are released and no writer holds them), from
// whichever goroutine made it (the desk, or the engine loop for a request
// in the batch): the request no
// longer counts against the worker or its peer. It runs at once even while
// res waits on the engine, since it moves nothing.
func (d *Decode) ended(res *reservation) {
	d.o.Metrics.ReservationsActive.Dec()
	d.releasePeer(res.peer, res.counted)
	d.over[roomKey(res.key.Room, res.key.Epoch)] = time.Now()
}

// forget drops an ended reservation from the table (its events were
// streamed, or nobody came for them).
func (d *Decode) forget(res *reservation) {
	k := roomKey(res.key.Room, res.key.Epoch)
	if _, over := d.over[k]; over {
		d.drop(k)
	}
}

func (d *Decode) drop(k transfer.Key) {
	delete(d.rooms, k)
	delete(d.over, k)
	d.leases.remove(k)
}

// sweep forgets reservations that ended more than a minute ago without a
// Stream taking their last event.
func (d *Decode) sweep() {
	for k, at := range d.over {
		if time.Since(at) > time.Minute {
			d.drop(k)
		}
	}
}

// Lookup finds the reservation of room and epoch, live or ended but not
// yet forgotten: its request, and whether a Stream took its events.
func (d *Decode) Lookup(room, epoch uint64) (r *scheduler.Request, streamed, ok bool) {
	type out struct {
		r        *scheduler.Request
		streamed bool
	}
	o, _ := call(&d.inbox, func(answer func(out)) {
		if res := d.rooms[roomKey(room, epoch)]; res != nil {
			answer(out{res.r, res.reader})
			return
		}
		answer(out{})
	})
	return o.r, o.streamed, o.r != nil
}
