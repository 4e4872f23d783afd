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
	if res.bound && !sessionBound(res, k.Session[:]) {
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
		return lateWrite(d, w, fmt.Errorf("no live reservation for %s", k))
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if !res.writable() {
		return lateWrite(d, w, fmt.Errorf("reservation %s no longer accepts writes", k))
	}
	ps := d.o.Pool.PageSize()
	n := len(res.r.Prompt)
	if err := ownerTag(d, res, w.Index, w.Page); err != nil {
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

// lateWrite answers a frame for a reservation that no longer takes writes:
// dropped and counted, never unpacked. It is a variable only so that a
// faults build can land such frames instead (guards_faults.go,
// BATON_GUARDS_OFF=late_drop). A Sink wrapped around Decode could not do
// that without finding the reservation a second time, which counts the
// refusals of find twice, and the count of late drops is what the gate
// reads; every other build runs dropLate.
var lateWrite = (*Decode).dropLate

func (d *Decode) dropLate(_ transfer.PageWrite, why error) error {
	d.o.Metrics.LateDropped.WithLabelValues("write").Inc()
	return why
}

// ownerTag says whether page, sent for index of res's prompt pages, is the
// page res gave that index, tagged as res's and allocated. Write and Commit
// ask it of every page. It is a variable only so that a faults build can
// let a frame land wherever it points (guards_faults.go,
// BATON_GUARDS_OFF=owner_tag): the check sits between finding the
// reservation and unpacking into the pool, under res.mu, so nothing
// outside Decode can take it away without writing Write again; every
// other build runs ownsPage.
var ownerTag = (*Decode).ownsPage

func (d *Decode) ownsPage(res *reservation, index int, page int32) error {
	if index < 0 || index >= len(res.prompt) || res.prompt[index] != page {
		return fmt.Errorf("page %d at index %d is not in reservation %s", page, index, res.key)
	}
	if owner, _, st := d.o.Pool.Owner(page); owner != res.r.Owner() || st != kvpool.PageAllocated {
		return fmt.Errorf("page %d is tagged %v (%s), not %v", page, owner, st, res.r.Owner())
	}
	return nil
}

// sessionBound says whether id names the transfer session decode admitted
// for res, the only one that may write its pages or commit them. Admit,
// the frames' lookup and Commit all ask it; called under res.mu. It is a
// variable only so that a faults build can let any session in
// (guards_faults.go, BATON_GUARDS_OFF=session_bind): the binding lives in
// the reservation, which nothing outside Decode sees; every other build
// runs boundTo.
var sessionBound = (*reservation).boundTo

func (res *reservation) boundTo(id []byte) bool {
	return res.bound && len(id) == len(res.key.Session) && subtle.ConstantTimeCompare(res.key.Session[:], id) == 1
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
