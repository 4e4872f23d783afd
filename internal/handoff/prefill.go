// The prefill desk, mirroring the decode desk stage by stage (one file
// each, in the order a request meets them):
//
//	prefill_run.go    Run: the door, a session to the reservation, the chunks, flush, close, Commit, Sent
//	prefill_ship.go   each completed page read from the pool and written to the session
//	prefill_abort.go  abort and drain: close the session, then tell decode Drained, then Drained here
//
// This file holds the desk itself: its inbox, the prefills in progress and
// the decode workers it may answer. Its goroutine makes every move of a
// prefill request that is not the engine's (Aborting, Drained, Sent) and
// keeps its tables; the request's slow work (the engine's events, flush,
// the calls to decode) runs on the goroutine that asked for it (the
// Prefill RPC's) and reports each outcome to the desk. internal/roles
// turns the gRPC calls into the desk's calls and its refusals into
// status codes.

package handoff

import (
	"context"
	"log/slog"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// PrefillOptions configure a prefill desk.
type PrefillOptions struct {
	Engine  *scheduler.Engine
	Pool    *kvpool.Pool
	Metrics *metrics.Set
	Sender  transfer.Sender
	// Decoders reaches the decode workers that reserved the pages.
	Decoders Decoders
	Log      *slog.Logger
	// Guards are the desk's plane checks (guards.go); the zero value is
	// every check.
	Guards PrefillGuards
}

// Decoders are the calls the prefill desk makes to a reservation's decode
// worker, so that this package needs no RPC stack of its own.
type Decoders interface {
	// Commit claims the handoff done: decode checks the claim and answers;
	// an error is its refusal (or the call's failure).
	Commit(ctx context.Context, decodeAddr, requestID string, c Claim) error
	// Drained says this worker has no write in flight for key and will
	// issue none. An error leaves decode's pages quarantined until the
	// session is proven closed.
	Drained(decodeAddr, requestID string, key transfer.Key) error
}

// Ticket is the reservation decode made for a prefill: where to write and
// which pages.
type Ticket struct {
	Key          transfer.Key
	DecodeAddr   string // decode's gRPC address: Commit and Drained go there
	TransferAddr string // decode's transport address
	Pages        []int32
	HeldTokens   int // the prompt's lead decode holds already, in whole pages
}

// Claim is what Commit tells decode was written.
type Claim struct {
	Key           transfer.Key
	Session       transfer.SessionID
	TokensWritten int
	PageChecksums []uint64
	First         *request.Sampled
	Prompt        []request.Sampled // prompt logprobs
	CachedTokens  int
}

// Sent is the outcome of a prefill handed over.
type Sent struct {
	TokensWritten int
	FirstToken    int32
}

// maxKnownDecode bounds the decode addresses remembered: a cluster has far
// fewer decode workers, and a caller cannot grow the table without bound.
const maxKnownDecode = 4096

// Prefill is the prefill desk.
type Prefill struct {
	o PrefillOptions

	inbox

	// Owned by the desk's goroutine.
	active  map[transfer.Key]context.CancelFunc // prefills in progress
	known   map[string]bool                     // decode gRPC addresses the router paired this worker with
	closing bool                                // Close began: no new prefill is taken
	idle    chan struct{}                       // closed by the last prefill to leave once closing
}

// NewPrefill makes a prefill desk and starts its goroutine.
func NewPrefill(o PrefillOptions) *Prefill {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	d := &Prefill{o: o, inbox: newInbox(),
		active: map[transfer.Key]context.CancelFunc{}, known: map[string]bool{}}
	d.o.Guards = o.Guards.withChecks(d)
	go d.serve(0, nil)
	return d
}

// call runs ev on the desk and waits for it; false: the desk has stopped
// and ev did not run. Never call it from the desk.
func (d *Prefill) call(ev func()) bool {
	_, ok := call(&d.inbox, func(answer func(struct{})) { ev(); answer(struct{}{}) })
	return ok
}

// enter puts a prefill in the desk's table, where an Abort finds it; false
// once the desk is closing.
func (d *Prefill) enter(key transfer.Key, cancel context.CancelFunc) bool {
	taken := false
	d.call(func() {
		if !d.closing {
			d.active[key] = cancel
			taken = true
		}
	})
	return taken
}

// leave takes a prefill out of the table, the last thing it does.
func (d *Prefill) leave(key transfer.Key) {
	d.call(func() {
		delete(d.active, key)
		if d.closing && len(d.active) == 0 && d.idle != nil {
			close(d.idle)
			d.idle = nil
		}
	})
}

// Close stops the desk once no prefill is in progress: new ones are
// refused, those in progress are cancelled (the engine has stopped, or
// their callers left) and make their last moves on the desk as always,
// and then its goroutine ends.
func (d *Prefill) Close() {
	var idle chan struct{}
	d.call(func() {
		d.closing = true
		for _, cancel := range d.active {
			cancel()
		}
		if len(d.active) > 0 {
			d.idle = make(chan struct{})
			idle = d.idle
		}
	})
	if idle != nil {
		<-idle
	}
	d.inbox.Close()
}

// Learn remembers a decode worker the router paired this worker with;
// only those are ever dialled on a decode worker's word.
func (d *Prefill) Learn(addr string) {
	d.post(func() {
		if len(d.known) < maxKnownDecode {
			d.known[addr] = true
		}
	})
}

// knowsDecode is the dial_known check (PrefillGuards.DialKnown), on the
// desk: a decode worker's word may make this worker dial addr only if the
// router paired them.
func (d *Prefill) knowsDecode(addr string) bool { return d.known[addr] }

// Busy reports whether a prefill is in progress.
func (d *Prefill) Busy() bool {
	busy := false
	d.call(func() { busy = len(d.active) > 0 })
	return busy
}
