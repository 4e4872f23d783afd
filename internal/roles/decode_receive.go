package roles

import (
	"crypto/subtle"
	"fmt"
	"slices"
	"time"

	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// Admit implements transfer.Sink, the receiver's gate for sessions: a
// session may write only into a live, still-open reservation whose
// capability it presents, only the pages it reserved, in order, and only
// if no other session was admitted for it before.
func (d *Decode) Admit(k transfer.Key) ([]int32, error) {
	res := d.find("transfer", k.Room, k.Epoch, k.Cap[:])
	if res == nil {
		d.o.Metrics.LateDropped.WithLabelValues("admit").Inc()
		return nil, fmt.Errorf("no live reservation for %s", k)
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if !res.writable() {
		d.o.Metrics.LateDropped.WithLabelValues("admit").Inc()
		return nil, fmt.Errorf("reservation %s no longer accepts writes", k)
	}
	if res.bound && !res.boundTo(k.Session[:], d.o.Guards.SessionBound) {
		d.authFailure("transfer")
		return nil, fmt.Errorf("reservation %s is already being written by another session", k)
	}
	res.key.Session, res.bound = k.Session, true
	if err := res.receiving(); err != nil {
		return nil, err
	}
	return slices.Clone(res.prompt), nil
}

// Write implements transfer.Sink: the receiver's gate. A frame lands only in
// a page of a live, still-open reservation, at the index the reservation
// gave that page, with the token count that page must hold.
func (d *Decode) Write(k transfer.Key, w transfer.PageWrite) error {
	res := d.findSession("transfer", k)
	if res == nil {
		return d.o.Guards.LateDrop(d.o.Pool, w, fmt.Errorf("no live reservation for %s", k))
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if !res.writable() {
		return d.o.Guards.LateDrop(d.o.Pool, w, fmt.Errorf("reservation %s no longer accepts writes", k))
	}
	ps := d.o.Pool.PageSize()
	n := len(res.r.Prompt)
	if err := d.o.Guards.OwnerTag(d.o.Pool, res.r, res.prompt, w.Index, w.Page); err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues("owner_tag").Inc()
		return err
	}
	if want := min(ps, n-w.Index*ps); w.Tokens != want {
		d.o.Metrics.HandoffFailures.WithLabelValues("bad_count").Inc()
		return fmt.Errorf("page index %d carries %d tokens, the reservation expects %d", w.Index, w.Tokens, want)
	}
	if err := res.receiving(); err != nil {
		return err
	}
	if err := transfer.Unpack(d.o.Pool.KV(), w.Page, w.Tokens, w.Data); err != nil {
		return err
	}
	d.o.Metrics.TransferBytes.Add(float64(len(w.Data)))
	return d.o.Pool.MarkWritten(res.r.Owner(), w.Page, w.Tokens)
}

// dropLate is the late_drop check (DecodeGuards.LateDrop): a frame for a
// reservation that no longer takes writes is dropped and counted, never
// unpacked. It is a guard of Decode's rather than a Sink wrapped around
// it because a wrapper could not land such frames without finding the
// reservation a second time, which counts the refusals of find twice, and
// the count of late drops is what the gate reads.
func (d *Decode) dropLate(_ *kvpool.Pool, _ transfer.PageWrite, why error) error {
	d.o.Metrics.LateDropped.WithLabelValues("write").Inc()
	return why
}

// ownsPage is the owner_tag check (DecodeGuards.OwnerTag): page, sent for
// index of r's prompt pages, is the page the reservation gave that index,
// tagged as r's and allocated. Write and Commit ask it of every page; it
// sits between finding the reservation and unpacking into the pool, under
// res.mu.
func (*Decode) ownsPage(pool *kvpool.Pool, r *scheduler.Request, prompt []int32, index int, page int32) error {
	if index < 0 || index >= len(prompt) || prompt[index] != page {
		return fmt.Errorf("page %d at index %d is not in reservation %s", page, index, roomKey(r.Room(), r.Owner().Epoch))
	}
	if owner, _, st := pool.Owner(page); owner != r.Owner() || st != kvpool.PageAllocated {
		return fmt.Errorf("page %d is tagged %v (%s), not %v", page, owner, st, r.Owner())
	}
	return nil
}

// boundTo says whether id names the transfer session decode admitted for
// res, the only one that may write its pages or commit them, by the
// session_bind check (DecodeGuards.SessionBound, sameSession). Admit, the
// frames' lookup and Commit all ask it; called under res.mu.
func (res *reservation) boundTo(id []byte, check func(bool, transfer.SessionID, []byte) bool) bool {
	return check(res.bound, res.key.Session, id)
}

// sameSession is the session_bind check: a session was admitted (bound)
// and id is its name.
func sameSession(bound bool, session transfer.SessionID, id []byte) bool {
	return bound && len(id) == len(session) && subtle.ConstantTimeCompare(session[:], id) == 1
}

// Closed implements transfer.Sink: the session is closed and its receiver
// joined, which proves no further write of it can land.
func (d *Decode) Closed(k transfer.Key, proof string) {
	if res := d.findSession("transfer", k); res != nil {
		d.writerGone(res, false, proof)
	}
}

// writable says whether a write may land: only before Commit, and only
// while the request is live. Called under res.mu.
func (res *reservation) writable() bool {
	st := res.r.State()
	return st == scheduler.StateReserved || st == scheduler.StateReceiving
}

// receiving notes the first write (or one-sided admission): Reserved →
// Receiving, once. Called under res.mu.
func (res *reservation) receiving() error {
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

// sessionKey names the session bound to res (the zero session if none
// was admitted).
func (res *reservation) sessionKey() transfer.Key {
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.key
}
