package roles

import (
	"fmt"
	"slices"
	"time"

	"github.com/batonlm/baton/internal/faults"
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
	if res.bound && res.key.Session != k.Session && faults.On(faults.GuardSessionBind) {
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
		if !faults.On(faults.GuardLateDrop) {
			return d.unguardedWrite(w)
		}
		d.o.Metrics.LateDropped.WithLabelValues("write").Inc()
		return fmt.Errorf("no live reservation for %s", k)
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if !res.writable() {
		if !faults.On(faults.GuardLateDrop) {
			return d.unguardedWrite(w)
		}
		d.o.Metrics.LateDropped.WithLabelValues("write").Inc()
		return fmt.Errorf("reservation %s no longer accepts writes", k)
	}
	ps := d.o.Pool.PageSize()
	n := len(res.r.Prompt)
	if faults.On(faults.GuardOwnerTag) {
		if w.Index < 0 || w.Index >= len(res.prompt) || res.prompt[w.Index] != w.Page {
			d.o.Metrics.HandoffFailures.WithLabelValues("owner_tag").Inc()
			return fmt.Errorf("page %d at index %d is not in reservation %s", w.Page, w.Index, k)
		}
		if owner, _, st := d.o.Pool.Owner(w.Page); owner != res.r.Owner() || st != kvpool.PageAllocated {
			d.o.Metrics.HandoffFailures.WithLabelValues("owner_tag").Inc()
			return fmt.Errorf("page %d is tagged %v (%s), not %v", w.Page, owner, st, res.r.Owner())
		}
	} else if w.Page < 0 || int(w.Page) >= d.o.Pool.NumPages() || w.Index < 0 {
		return fmt.Errorf("page %d outside the pool", w.Page)
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
	if err := d.o.Pool.MarkWritten(res.r.Owner(), w.Page, w.Tokens); err != nil && faults.On(faults.GuardOwnerTag) {
		return err
	}
	return nil
}

// unguardedWrite is what a receiver without the late-message drop would do
// (test builds only, with the guard switched off): write the frame where it
// points, whoever holds the page now.
func (d *Decode) unguardedWrite(w transfer.PageWrite) error {
	if w.Page < 0 || int(w.Page) >= d.o.Pool.NumPages() || w.Tokens <= 0 || w.Tokens > d.o.Pool.PageSize() {
		return fmt.Errorf("page %d outside the pool", w.Page)
	}
	return transfer.Unpack(d.o.Pool.KV(), w.Page, w.Tokens, w.Data)
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
