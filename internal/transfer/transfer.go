// Package transfer moves a prompt's KV pages from a prefill worker into the
// pages a decode worker reserved. One interface, several transports (tcp
// here; ucx behind a build tag), the same conformance tests for each.
//
// The decode side never trusts a frame: the Sink it is given checks each
// write against the live reservation before any byte reaches a page, and the
// end of a session (closed and joined) is reported so that the decode worker
// can use it as proof that no further write of that session can land.
package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/zeebo/xxh3"

	"github.com/batonlm/baton/internal/kernels"
)

// Errors a Session reports. Transports wrap them with the details, so
// callers test them with errors.Is.
var (
	// ErrRefused: the decode side's Sink refused a write of the session
	// (unknown or stale reservation, wrong page, bad size). A refused
	// write did not land; the session's other writes are not affected.
	ErrRefused = errors.New("transfer: write refused by the receiver")
	// ErrClosed: the session was closed (by Close, or because its
	// connection ended) and takes no more writes.
	ErrClosed = errors.New("transfer: session closed")
)

// Key names one reservation: a decode room and the epoch of its pages.
type Key struct {
	Room, Epoch uint64
}

func (k Key) String() string { return fmt.Sprintf("room %d epoch %d", k.Room, k.Epoch) }

// PageWrite is one page of KV: the page's position in the reservation
// (Index), the decode page id it must land in, how many token slots it
// fills from slot 0, and the packed rows (see Pack).
type PageWrite struct {
	Index  int
	Page   int32
	Tokens int
	Data   []byte
}

// Sink is the decode side's gate for incoming writes. A transport calls
// Write for every page frame it receives and only writes through it; an
// error refuses the frame (nothing is written) and is reported to the
// sender. Closed is called once per session after the session's connection
// is closed and its receiver has returned: from then on no write of that
// session can land.
//
// w.Data belongs to the transport and is only valid during Write (a
// transport reuses its receive buffers), so a Sink copies what it keeps.
type Sink interface {
	Write(k Key, w PageWrite) error
	Closed(k Key, proof string)
}

// Admitter is implemented by a Sink given to a one-sided receiver (see
// OneSided), which calls Admit once when a session opens, before the
// sender is given the means to write (the remote key): an error refuses
// the session (its writes come back from Flush as ErrRefused, carrying the
// error's text), and pages are the reservation's page ids in order, index
// i to pages[i]. The sender then refuses, before any byte moves, a write
// whose page is not pages[Index], whose token count is outside 1..page
// size, or whose payload is not PackedSize. This is the one-sided form of
// the Write gate: it stops a confused sender, not a hostile one (whoever
// holds the remote key can write anywhere in the registered memory).
type Admitter interface {
	Admit(k Key) (pages []int32, err error)
}

// OneSided is implemented by a Receiver whose senders write straight into
// the decode side's registered memory (one-sided puts: ucx). Its Sink's
// Write is never called, since no frame reaches the decode side, so the
// decode worker learns what landed from the memory itself: at Commit it
// recomputes each page's Checksum over the page contents (Pack of the
// written slots) and marks the pages written only if every one matches.
// Sink.Closed still comes at most once per session, and only with a proof
// (see the transport); a session that ends without one gets no Closed, and
// its pages wait for the writer's Drained.
type OneSided interface {
	OneSided() bool
}

// IsOneSided says whether r is a one-sided receiver.
func IsOneSided(r Receiver) bool {
	o, ok := r.(OneSided)
	return ok && o.OneSided()
}

// Receiver is the decode side of a transport.
type Receiver interface {
	// Addr is where senders connect (goes into the Reserve reply).
	Addr() string
	// Close stops accepting sessions, closes open ones and waits for every
	// receiver goroutine to return.
	Close() error
}

// Sender is the prefill side of a transport.
type Sender interface {
	// Open starts a session writing into reservation k at addr.
	Open(ctx context.Context, addr string, k Key) (Session, error)
}

// Session writes one reservation's pages.
type Session interface {
	// Write queues a page; it may return before the page landed. The
	// session owns w.Data from then on.
	Write(w PageWrite) error
	// Flush returns once every page written so far has landed in the
	// decode worker's pages (or the first error any of them met).
	Flush(ctx context.Context) error
	// Close ends the session. When it returns, no write of this session is
	// in flight or will be issued; it is safe to tell decode "Drained".
	Close() error
	// Bytes counts the payload bytes that landed.
	Bytes() int64
}

// PackedSize is the size of tokens slots of one page, packed.
func PackedSize(kv kernels.PagedKV, tokens int) int { return kv.PackedBytes(tokens) }

// Pack copies the first tokens slots of a page of a pool in Go memory, for
// every layer its K rows then its V rows, into dst (little-endian float32).
// Only written slots are packed, so neither side's stale data ever travels
// or enters a checksum.
func Pack(kv kernels.PagedKV, page int32, tokens int, dst []byte) []byte {
	kernels.CheckHostKV("transfer.Pack", kv)
	rf := kv.RowFloats()
	n := tokens * rf
	dst = dst[:0]
	for l := 0; l < kv.Layers; l++ {
		for _, off := range []int{kv.KOffset(int(page), l, 0), kv.VOffset(int(page), l, 0)} {
			for _, v := range kv.Data[off : off+n] {
				dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(v))
			}
		}
	}
	return dst
}

// ReadPage is Pack for any pool: one in device memory is read through its
// DeviceKV (an error is the device's).
func ReadPage(kv kernels.PagedKV, page int32, tokens int, dst []byte) ([]byte, error) {
	if kv.Device != nil {
		return kv.Device.ReadPage(page, tokens, dst)
	}
	return Pack(kv, page, tokens, dst), nil
}

// Unpack writes packed rows into a page of any pool: the inverse of
// ReadPage.
func Unpack(kv kernels.PagedKV, page int32, tokens int, src []byte) error {
	if len(src) != PackedSize(kv, tokens) {
		return fmt.Errorf("transfer: page payload of %d bytes, want %d for %d tokens", len(src), PackedSize(kv, tokens), tokens)
	}
	if kv.Device != nil {
		return kv.Device.WritePage(page, tokens, src)
	}
	rf := kv.RowFloats()
	n := tokens * rf
	i := 0
	for l := 0; l < kv.Layers; l++ {
		for _, off := range []int{kv.KOffset(int(page), l, 0), kv.VOffset(int(page), l, 0)} {
			dst := kv.Data[off : off+n]
			for j := range dst {
				dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(src[i:]))
				i += 4
			}
		}
	}
	return nil
}

// Checksum is the xxh3 of a page's packed rows: what Commit claims per page
// and what decode recomputes from its own copy.
func Checksum(packed []byte) uint64 { return xxh3.Hash(packed) }
