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
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"

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

// Key names one reservation: a decode room and the epoch of its pages, for
// logs, and the capability that makes the name worth something.
type Key struct {
	Room, Epoch uint64
	Cap         Capability
	// Session is the transfer session a write came through, set by the
	// receiver from the session's handshake (a sender's Open ignores it):
	// decode binds a reservation to the first session it admits, and takes
	// writes, the end of writing and Commit only from that one.
	Session SessionID
}

// SessionID names one transfer session. Both ends learn it in the
// session's handshake; nobody else does.
type SessionID [32]byte

// Reservation is k without its session: the name of the reservation
// alone, the same for every session that writes it.
func (k Key) Reservation() Key {
	k.Session = SessionID{}
	return k
}

// String names the reservation for logs; the capability stays out of them.
func (k Key) String() string { return fmt.Sprintf("room %d epoch %d", k.Room, k.Epoch) }

// Capability is decode's unguessable name for one reservation: 256 random
// bits made at Reserve. Rooms count up and page ids are reused, so anyone
// could name a reservation by them; only the router and the one prefill
// worker it chose learn the capability, and every message about the
// reservation must carry it.
type Capability [32]byte

// NewCapability draws a fresh capability from the system's random source.
func NewCapability() Capability {
	var c Capability
	if _, err := rand.Read(c[:]); err != nil {
		panic("transfer: no randomness for a capability: " + err.Error())
	}
	return c
}

// CapabilityFrom reads a capability off the wire; anything but 32 bytes is
// not one.
func CapabilityFrom(b []byte) (Capability, bool) {
	var c Capability
	if len(b) != len(c) {
		return c, false
	}
	copy(c[:], b)
	return c, true
}

// Matches compares in constant time, so the time a refusal takes says
// nothing about how much of a guess was right.
func (c Capability) Matches(b []byte) bool {
	return len(b) == len(c) && subtle.ConstantTimeCompare(c[:], b) == 1
}

// PageWrite is one page of KV: the page's position in the reservation
// (Index), the decode page id it must land in, how many token slots it
// fills from slot 0, and the packed rows (see Pack).
type PageWrite struct {
	Index  int
	Page   int32
	Tokens int
	Data   []byte
	// Src, when set, is where the page's rows are instead of Data: in
	// device memory the receiving side copies from itself (cuda-ipc), or
	// the sending session puts from (ucx with an arena). Data is then not
	// sent.
	Src PageSource
}

// PageSource is a page's packed rows somewhere the decode side reads them
// from itself rather than off the wire.
type PageSource interface {
	// Land copies the rows into the first tokens slots of page of kv and
	// returns how many bytes it copied. The copy may only be queued when
	// it returns: the transport that made the source owns the wait, and
	// waits before it acknowledges the page, reads on, or reports the
	// session Closed (cuda-ipc's receiver batches its copies so). Its
	// Sink need not wait: the rows are in place and no copy of them is in
	// flight by the time anything depends on them.
	Land(kv kernels.PagedKV, page int32, tokens int) (int, error)
}

// Land puts w's rows into its page of kv, from w.Src or from w.Data, and
// returns the bytes landed.
func Land(kv kernels.PagedKV, w PageWrite) (int, error) {
	if w.Src != nil {
		return w.Src.Land(kv, w.Page, w.Tokens)
	}
	if err := Unpack(kv, w.Page, w.Tokens, w.Data); err != nil {
		return 0, err
	}
	return len(w.Data), nil
}

// Staged is what a session made of a batch of prompt pages: per page, the
// packed rows to send (nil for a staged page), where a staged page's rows
// are (nil for one sent as Data), and the checksum Commit claims for it.
//
// Staging on a device may still be under way when the session returns
// it (Pending set, Sums nil): Wait, off the engine loop, for the sums.
// The session itself waits before it sends a staged page (a page's place
// is not told before its rows are there), and every Pending is to be
// waited for, which frees what it holds.
type Staged struct {
	Data    [][]byte
	Srcs    []PageSource
	Sums    []uint64
	Pending kernels.Staging
}

// Wait returns the pages' sums once the staging is done.
func (s Staged) Wait() ([]uint64, error) {
	if s.Pending == nil {
		return s.Sums, nil
	}
	return s.Pending.Wait()
}

// Write is page i's write for reservation index index, decode page page.
func (s Staged) Write(i, index int, page int32, tokens int) PageWrite {
	w := PageWrite{Index: index, Page: page, Tokens: tokens, Data: s.Data[i]}
	if s.Srcs != nil {
		w.Src = s.Srcs[i]
	}
	return w
}

// Stager is a Session that takes a prompt's pages straight from the
// prefill pool: it stages them in device memory (PageWrite.Src) where the
// decode side copies them from (cuda-ipc: it sends only where they are)
// or from where it puts them itself (ucx with an arena). Its checksums
// are the transport's, or the receiver's (kernels.PageSum, computed on
// the device, for cuda-ipc and for ucx into a GPU pool).
type Stager interface {
	// StagePages stages the first tokens[i] slots of pool page pages[i];
	// a page that could not be staged (no room) goes as Data. It may
	// return before the staging is done (Staged.Pending).
	StagePages(kv kernels.PagedKV, pages []int32, tokens []int) (Staged, error)
}

// StagePages readies pages for a session: staged by the session where it
// is a Stager, else packed into host memory and summed with Checksum
// (ReadStaged).
func StagePages(s Session, kv kernels.PagedKV, pages []int32, tokens []int) (Staged, error) {
	if st, ok := s.(Stager); ok {
		return st.StagePages(kv, pages, tokens)
	}
	return ReadStaged(kv, pages, tokens, Checksum)
}

// ReadStaged packs pages into host memory (ReadPages), to go as Data, each
// summed with sum (Checksum, or kernels.PageSum for cuda-ipc and for ucx
// into a GPU pool).
func ReadStaged(kv kernels.PagedKV, pages []int32, tokens []int, sum func([]byte) uint64) (Staged, error) {
	data, err := ReadPages(kv, pages, tokens)
	if err != nil {
		return Staged{}, err
	}
	sums := make([]uint64, len(data))
	for i, d := range data {
		sums[i] = sum(d)
	}
	return Staged{Data: data, Sums: sums}, nil
}

// Sums is how a decode worker checksums the pages it verifies at Commit:
// the transport's function over the first tokens[i] slots of pages[i] as
// they are in its pool.
type Sums func(kv kernels.PagedKV, pages []int32, tokens []int) ([]uint64, error)

// HostSums reads the pages back (ReadPages) and takes Checksum of each:
// tcp's sums, and ucx's into host memory.
func HostSums(kv kernels.PagedKV, pages []int32, tokens []int) ([]uint64, error) {
	st, err := ReadStaged(kv, pages, tokens, Checksum)
	return st.Sums, err
}

// DeviceSums takes kernels.PageSum of the pages where they are, on a pool
// that can (kernels.PageSummer: a GPU's): cuda-ipc's sums, and ucx's into
// a GPU pool registered with UCX. A cuda-ipc worker starts only with such
// a pool.
func DeviceSums(kv kernels.PagedKV, pages []int32, tokens []int) ([]uint64, error) {
	s, ok := kv.Device.(kernels.PageSummer)
	if !ok {
		return nil, errors.New("transfer: this pool cannot sum pages where they are")
	}
	return s.SumPages(pages, tokens)
}

// Sink is the decode side's gate for incoming sessions and writes.
//
// A transport calls Admit once per session, when its HELLO (room, epoch,
// capability) is in and before any of its writes: an error refuses the
// session, whose writes then all come back from Flush as ErrRefused,
// carrying the error's text. pages are the reservation's page ids in
// order, index i to pages[i]; a one-sided receiver (see OneSided) hands
// them to the sender with the remote key, and the sender refuses, before
// any byte moves, a write whose page is not pages[Index], whose token
// count is outside 1..page size, or whose payload is not PackedSize (that
// stops a confused sender, not a hostile one: whoever holds the remote key
// can write anywhere in the registered memory, which is why only an
// admitted member's session gets it).
//
// A transport calls Write for every page frame of an admitted session it
// receives and only writes through it; an error refuses the frame
// (nothing is written) and is reported to the sender. Closed is called
// once per session after the session's connection is closed and its
// receiver has returned: from then on no write of that session can land.
//
// w.Data belongs to the transport and is only valid during Write (a
// transport reuses its receive buffers), so a Sink copies what it keeps.
type Sink interface {
	Admit(k Key) (pages []int32, err error)
	Write(k Key, w PageWrite) error
	Closed(k Key, proof string)
}

// OneSided is implemented by a Receiver whose senders write straight into
// the decode side's registered memory (one-sided puts: ucx). Its Sink's
// Write is never called, since no frame reaches the decode side, so the
// decode worker learns what landed from the memory itself: at Commit it
// recomputes each page's checksum over the page contents (Checksum of
// the written slots packed, or the transport's Sums where it has its own)
// and marks the pages written only if every one matches.
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

// Evictor is implemented by a Receiver that can end a session itself. A
// receiver that writes the pages (tcp) ends the session's connection and
// joins its goroutine, then calls Sink.Closed with that as the proof: the
// decode side can free an aborted reservation's pages without waiting for
// a writer that holds its connection open and never says Drained.
type Evictor interface {
	Evict(k Key)
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
	// ID names the session as its handshake did (see Key.Session).
	ID() SessionID
}

// PackedSize is the size of tokens slots of one page, packed.
func PackedSize(kv kernels.PagedKV, tokens int) int { return kv.PackedBytes(tokens) }

// ReadPage packs the first tokens slots of a page of any pool
// (kernels.PackPage's layout): one in device memory is read through its
// DeviceKV (an error is the device's).
func ReadPage(kv kernels.PagedKV, page int32, tokens int, dst []byte) ([]byte, error) {
	if kv.Device != nil {
		return kv.Device.ReadPage(page, tokens, dst)
	}
	return kernels.PackPage(kv, page, tokens, dst), nil
}

// ReadPages is ReadPage for several pages (tokens[i] slots of pages[i]),
// in one pass where the pool's memory is a kernels.PagesReader.
func ReadPages(kv kernels.PagedKV, pages []int32, tokens []int) ([][]byte, error) {
	if len(pages) != len(tokens) {
		return nil, fmt.Errorf("transfer: %d pages and %d token counts", len(pages), len(tokens))
	}
	if r, ok := kv.Device.(kernels.PagesReader); ok {
		return r.ReadPages(pages, tokens)
	}
	out := make([][]byte, len(pages))
	for i, p := range pages {
		var err error
		if out[i], err = ReadPage(kv, p, tokens[i], make([]byte, 0, PackedSize(kv, tokens[i]))); err != nil {
			return nil, err
		}
	}
	return out, nil
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
	return kernels.UnpackPage(kv, page, tokens, src)
}

// Checksum is the xxh3 of a page's packed rows: what Commit claims per page
// and what decode recomputes from its own copy.
func Checksum(packed []byte) uint64 { return xxh3.Hash(packed) }
