package handoff

import (
	"crypto/subtle"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// lease is a reservation's one door for frames. The transport's goroutines
// land frames concurrently, each under mu, without waiting on the desk; the
// desk binds the session at Admit and revokes the lease before Commit's
// checks, under mu, so no frame lands once the pages are being verified.
type lease struct {
	r      *scheduler.Request
	cap    transfer.Capability
	prompt []int32

	mu      sync.Mutex
	bound   bool // a transfer session was admitted: session names it
	session transfer.SessionID
	revoked bool
}

// boundTo says whether id names the transfer session decode admitted for
// the reservation, the only one that may write its pages or commit them,
// by the session_bind check (DecodeGuards.SessionBound, sameSession).
// Admit, the frames' lookup and Commit all ask it.
func (l *lease) boundTo(id []byte, check func(bool, transfer.SessionID, []byte) bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return check(l.bound, l.session, id)
}

// isBound says whether a session was ever admitted.
func (l *lease) isBound() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bound
}

// revoke ends the lease: no frame lands from here on.
func (l *lease) revoke() {
	l.mu.Lock()
	l.revoked = true
	l.mu.Unlock()
}

// writable says whether a write may land: only while the lease stands,
// and only before Commit while the request is live. Called under l.mu.
func (l *lease) writable() bool {
	st := l.r.State()
	return !l.revoked && (st == scheduler.StateReserved || st == scheduler.StateReceiving)
}

// leaseTable is the reservations as the frames see them.
type leaseTable struct {
	mu sync.RWMutex
	m  map[transfer.Key]*lease
}

func (t *leaseTable) add(k transfer.Key, l *lease) {
	t.mu.Lock()
	t.m[k] = l
	t.mu.Unlock()
}

func (t *leaseTable) remove(k transfer.Key) {
	t.mu.Lock()
	delete(t.m, k)
	t.mu.Unlock()
}

func (t *leaseTable) get(k transfer.Key) *lease {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.m[roomKey(k.Room, k.Epoch)]
}

// sameSession is the session_bind check: a session was admitted (bound)
// and id is its name.
func sameSession(bound bool, session transfer.SessionID, id []byte) bool {
	return bound && len(id) == len(session) && subtle.ConstantTimeCompare(session[:], id) == 1
}

// Admit implements transfer.Sink, the receiver's gate for sessions: a
// session may write only into a live, still-open reservation whose
// capability it presents, only the pages it reserved, in order, and only
// if no other session was admitted for it before.
func (d *Decode) Admit(k transfer.Key) ([]int32, error) {
	type out struct {
		pages []int32
		err   error
	}
	o, ok := call(&d.inbox, func(answer func(out)) {
		res := d.find("transfer", k.Room, k.Epoch, k.Cap[:])
		if res == nil {
			d.o.Metrics.LateDropped.WithLabelValues("admit").Inc()
			answer(out{err: fmt.Errorf("no live reservation for %s", k)})
			return
		}
		d.on(res, func() {
			pages, err := d.admit(res, k)
			answer(out{pages, err})
		})
	})
	if !ok {
		return nil, errStopped
	}
	return o.pages, o.err
}

func (d *Decode) admit(res *reservation, k transfer.Key) ([]int32, error) {
	l := res.lease
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.writable() {
		d.o.Metrics.LateDropped.WithLabelValues("admit").Inc()
		return nil, fmt.Errorf("reservation %s no longer accepts writes", k)
	}
	if l.bound && !d.o.Guards.SessionBound(l.bound, l.session, k.Session[:]) {
		d.authFailure("transfer")
		return nil, fmt.Errorf("reservation %s is already being written by another session", k)
	}
	l.session, l.bound = k.Session, true
	if err := d.receiving(res); err != nil {
		return nil, err
	}
	return slices.Clone(res.prompt), nil
}

// receiving notes the admission: Reserved → Receiving, once.
func (d *Decode) receiving(res *reservation) error {
	err := res.r.Lifecycle().Move([]scheduler.State{scheduler.StateReserved}, scheduler.StateReceiving, "")
	if err == nil {
		res.firstByte = time.Now()
		return nil
	}
	if res.r.State() == scheduler.StateReceiving {
		return nil
	}
	return err
}

// Write implements transfer.Sink: the receiver's gate, on the transport's
// goroutine. A frame lands only in a page of a live reservation whose lease
// stands, from its bound session, at the index the reservation gave that
// page, with the token count that page must hold.
func (d *Decode) Write(k transfer.Key, w transfer.PageWrite) error {
	l := d.leases.get(k)
	if l == nil {
		return d.o.Guards.LateDrop(d.o.Pool, w, fmt.Errorf("no live reservation for %s", k))
	}
	if !d.o.Guards.CapabilityMatches(l.cap, k.Cap[:]) {
		d.authFailure("transfer")
		d.o.Log.Warn("message with a wrong capability refused", "rpc", "transfer", "room", k.Room, "epoch", k.Epoch)
		return d.o.Guards.LateDrop(d.o.Pool, w, fmt.Errorf("no live reservation for %s", k))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !d.o.Guards.SessionBound(l.bound, l.session, k.Session[:]) {
		d.authFailure("transfer")
		return d.o.Guards.LateDrop(d.o.Pool, w, fmt.Errorf("no live reservation for %s", k))
	}
	if !l.writable() {
		return d.o.Guards.LateDrop(d.o.Pool, w, fmt.Errorf("reservation %s no longer accepts writes", k))
	}
	ps := d.o.Pool.PageSize()
	n := len(l.r.Prompt)
	if err := d.o.Guards.OwnerTag(d.o.Pool, l.r, l.prompt, w.Index, w.Page); err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues("owner_tag").Inc()
		return err
	}
	if want := min(ps, n-w.Index*ps); w.Tokens != want {
		d.o.Metrics.HandoffFailures.WithLabelValues("bad_count").Inc()
		return fmt.Errorf("page index %d carries %d tokens, the reservation expects %d", w.Index, w.Tokens, want)
	}
	landed, err := transfer.Land(d.o.Pool.KV(), w)
	if err != nil {
		return err
	}
	d.o.Metrics.TransferBytes.Add(float64(landed))
	return d.o.Pool.MarkWritten(l.r.Owner(), w.Page, w.Tokens)
}

// dropLate is the late_drop check (DecodeGuards.LateDrop): a frame for a
// reservation that no longer takes writes is dropped and counted, never
// unpacked. It is a guard of the desk's rather than a Sink wrapped around
// it because a wrapper could not land such frames without finding the
// reservation a second time, which counts the refusals twice, and the
// count of late drops is what the gate reads.
func (d *Decode) dropLate(_ *kvpool.Pool, _ transfer.PageWrite, why error) error {
	d.o.Metrics.LateDropped.WithLabelValues("write").Inc()
	return why
}

// ownsPage is the owner_tag check (DecodeGuards.OwnerTag): page, sent for
// index of r's prompt pages, is the page the reservation gave that index,
// tagged as r's and allocated. Write and Commit ask it of every page; it
// sits between finding the reservation and unpacking into the pool.
func (*Decode) ownsPage(pool *kvpool.Pool, r *scheduler.Request, prompt []int32, index int, page int32) error {
	if index < 0 || index >= len(prompt) || prompt[index] != page {
		return fmt.Errorf("page %d at index %d is not in reservation %s", page, index, roomKey(r.Room(), r.Owner().Epoch))
	}
	if owner, _, st := pool.Owner(page); owner != r.Owner() || st != kvpool.PageAllocated {
		return fmt.Errorf("page %d is tagged %v (%s), not %v", page, owner, st, r.Owner())
	}
	return nil
}

// Closed implements transfer.Sink: the session is closed and its receiver
// joined, which proves no further write of it can land.
func (d *Decode) Closed(k transfer.Key, proof string) { d.post(d.closedEvent(k, proof)) }

func (d *Decode) closedEvent(k transfer.Key, proof string) func() {
	return func() {
		if res := d.findSession("transfer", k); res != nil {
			d.on(res, func() { d.writerGone(res, false, proof) })
		}
	}
}
