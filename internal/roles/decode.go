package roles

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
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
	// ReceiverWrites is true for transports whose receiver writes the pages
	// itself (tcp): once it refuses a reservation nothing more can land. A
	// one-sided transport (RDMA puts) must wait for the writer instead.
	ReceiverWrites bool
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
	// Auth authenticates this worker's calls to prefill workers (nil:
	// plaintext, tests on loopback).
	Auth *auth.Plane
	Log  *slog.Logger
}

// reservation is one live use of decode pages by a handed-over request.
type reservation struct {
	r      *scheduler.Request
	key    transfer.Key // with the capability; Session is the bound session
	writer string       // prefill gRPC address
	prompt []int32
	peer   string // who reserved it, for the per-peer bounds
	held   int    // pages it counts against its peer

	// mu orders page writes against the moments that close the pages to
	// writers (Commit, abort): after open goes false no write lands.
	mu        sync.Mutex
	open      bool
	bound     bool // a transfer session was admitted: key.Session names it
	firstByte time.Time
	abortedAt time.Time
	ended     time.Time // terminal and writer gone: eligible for removal
	streamed  bool      // a Stream delivered the last event
	reader    bool      // a Stream call took the reservation's events
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
	draining     atomic.Bool

	mu    sync.Mutex
	rooms map[transfer.Key]*reservation // by room and epoch alone
	usage map[string]*peerUse
	stop  chan struct{}
	wg    sync.WaitGroup
}

// NewDecode makes a decode worker. Attach a receiver with SetReceiver.
func NewDecode(o DecodeOptions) *Decode {
	if o.HandoffTimeout <= 0 {
		o.HandoffTimeout = 60 * time.Second
	}
	d := &Decode{o: o, rooms: map[transfer.Key]*reservation{}, usage: map[string]*peerUse{}, stop: make(chan struct{})}
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
	if !res.open {
		d.o.Metrics.LateDropped.WithLabelValues("admit").Inc()
		return nil, fmt.Errorf("reservation %s no longer accepts writes", k)
	}
	if res.bound && res.key.Session != k.Session && faults.On(faults.GuardSessionBind) {
		d.authFailure("transfer")
		return nil, fmt.Errorf("reservation %s is already being written by another session", k)
	}
	res.key.Session, res.bound = k.Session, true
	if res.r.State() == scheduler.StateReserved {
		if err := res.r.Lifecycle().To(scheduler.StateReceiving, ""); err != nil {
			return nil, err
		}
		res.firstByte = time.Now()
	}
	return slices.Clone(res.prompt), nil
}

// SetDraining makes Reserve refuse new work (the worker is shutting down);
// what it already holds runs to the end.
func (d *Decode) SetDraining() { d.draining.Store(true) }

// Busy reports whether any reservation is still open.
func (d *Decode) Busy() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, res := range d.rooms {
		res.mu.Lock()
		ended := !res.ended.IsZero()
		res.mu.Unlock()
		if !ended {
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

// Reserve implements the RPC: the decode door.
func (d *Decode) Reserve(ctx context.Context, req *pdv1.ReserveRequest) (*pdv1.Reservation, error) {
	if d.draining.Load() {
		return nil, status.Error(codes.Unavailable, "decode worker is shutting down")
	}
	if why := LayoutMismatch(d.o.Layout, req.Layout); why != "" {
		d.o.Metrics.HandoffFailures.WithLabelValues("layout").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "KV layout mismatch between prefill and decode: %s", why)
	}
	peer := callerID(ctx)
	r := scheduler.NewRoleRequest(scheduler.RoleDecode, req.RequestId, req.Prompt, ParamsFromPB(req.Sampling))
	held := d.peerPages(r)
	if !d.admitPeer(peer, held) {
		d.o.Log.Warn("reserve refused: the caller holds its share of the pool", "request_id", req.RequestId, "peer", peer)
		return nil, status.Error(codes.ResourceExhausted, "too many reservations held by this caller")
	}
	if err := d.o.Engine.Reserve(r); err != nil {
		d.releasePeer(peer, held)
		d.o.Log.Info("reserve refused", "request_id", req.RequestId, "err", err)
		return nil, rejectStatus(err)
	}
	key := transfer.Key{Room: r.Room(), Epoch: r.Owner().Epoch, Cap: transfer.NewCapability()}
	ps := d.o.Pool.PageSize()
	res := &reservation{r: r, key: key, writer: req.Writer, prompt: r.Pages()[:(len(req.Prompt)+ps-1)/ps], open: true,
		peer: peer, held: held}
	d.mu.Lock()
	d.rooms[roomKey(key.Room, key.Epoch)] = res
	d.mu.Unlock()
	d.o.Metrics.ReservationsTotal.Inc()
	d.o.Metrics.ReservationsActive.Inc()
	res.timer = time.AfterFunc(d.o.HandoffTimeout, func() {
		if d.abortReserved(res, "handoff timeout: no commit from prefill") {
			d.o.Metrics.HandoffFailures.WithLabelValues("timeout").Inc()
		}
	})
	d.o.Log.Info("reserved", "request_id", req.RequestId, "room", key.Room, "epoch", key.Epoch, "pages", len(r.Pages()), "prompt_pages", len(res.prompt))
	return &pdv1.Reservation{Room: key.Room, Epoch: key.Epoch, Pages: res.prompt, PromptTokens: uint32(len(req.Prompt)),
		Layout: d.o.Layout, Transport: d.transport(), TransferAddr: d.transferAddr, DecodeAddr: d.grpcAddr, Capability: key.Cap[:]}, nil
}

// roomKey is how reservations are filed: room and epoch alone, so that a
// message naming a live room with a wrong capability is told apart from a
// late one (and counted as what it is).
func roomKey(room, epoch uint64) transfer.Key { return transfer.Key{Room: room, Epoch: epoch} }

// find returns the live reservation a message names, if the message
// carries its capability. A wrong capability for a live room is a
// stranger's guess (or a member's bug): it is counted under rpc and
// answered exactly as an unknown room is.
func (d *Decode) find(rpc string, room, epoch uint64, capability []byte) *reservation {
	d.mu.Lock()
	res := d.rooms[roomKey(room, epoch)]
	d.mu.Unlock()
	if res == nil {
		return nil
	}
	if !res.key.Cap.Matches(capability) && faults.On(faults.GuardCapability) {
		d.authFailure(rpc)
		d.o.Log.Warn("message with a wrong capability refused", "rpc", rpc, "room", room, "epoch", epoch)
		return nil
	}
	return res
}

// findSession is find for what a transfer session reports: the session
// must also be the one admitted for the reservation.
func (d *Decode) findSession(rpc string, k transfer.Key) *reservation {
	res := d.find(rpc, k.Room, k.Epoch, k.Cap[:])
	if res == nil {
		return nil
	}
	res.mu.Lock()
	ok := res.bound && res.key.Session == k.Session
	res.mu.Unlock()
	if !ok && faults.On(faults.GuardSessionBind) {
		d.authFailure(rpc)
		return nil
	}
	return res
}

func (d *Decode) authFailure(rpc string) {
	d.o.Metrics.InternalAuthFailures.WithLabelValues(rpc).Inc()
}

// peerUse is what one caller of Reserve holds now.
type peerUse struct{ reservations, pages int }

// peerPages is what a request counts against its caller: the pages it
// reserves for its whole sequence.
func (d *Decode) peerPages(r *scheduler.Request) int {
	tokens := len(r.Prompt) + r.Params.MaxTokens
	if r.Params.MaxTokens <= 0 || tokens > d.o.MaxSeq {
		tokens = d.o.MaxSeq
	}
	return d.o.Pool.PagesFor(tokens)
}

// admitPeer counts pages against peer's bounds, or refuses them.
func (d *Decode) admitPeer(peer string, pages int) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[peer]
	if u == nil {
		u = &peerUse{}
		d.usage[peer] = u
	}
	over := (d.o.MaxReservationsPerPeer > 0 && u.reservations+1 > d.o.MaxReservationsPerPeer) ||
		(d.o.MaxPagesPerPeer > 0 && u.pages+pages > d.o.MaxPagesPerPeer)
	if over && faults.On(faults.GuardPeerQuota) {
		if u.reservations == 0 {
			delete(d.usage, peer)
		}
		return false
	}
	u.reservations++
	u.pages += pages
	return true
}

// releasePeer gives back what admitPeer counted.
func (d *Decode) releasePeer(peer string, pages int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	u := d.usage[peer]
	if u == nil {
		return
	}
	u.reservations--
	u.pages -= pages
	if u.reservations <= 0 {
		delete(d.usage, peer)
	}
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
	if !res.open {
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
	if res.r.State() == scheduler.StateReserved {
		if err := res.r.Lifecycle().To(scheduler.StateReceiving, ""); err != nil {
			return err
		}
		res.firstByte = time.Now()
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

func (d *Decode) writerGone(res *reservation, drained bool, proof string) {
	res.mu.Lock()
	res.open = false
	res.mu.Unlock()
	if !d.o.Engine.WriterGone(res.r, drained, proof) {
		kind := "drained"
		if !drained {
			kind = "closed"
		}
		d.o.Metrics.LateDropped.WithLabelValues(kind).Inc()
		return
	}
	res.mu.Lock()
	if !res.abortedAt.IsZero() {
		d.o.Metrics.DrainWait.Observe(time.Since(res.abortedAt).Seconds())
	}
	res.mu.Unlock()
	d.maybeEnd(res)
}

// Commit implements the RPC: it checks every claim of the handoff before the
// request may decode. Any failed check fails the request (its client sees a
// 5xx naming the check) and is counted.
func (d *Decode) Commit(ctx context.Context, c *pdv1.CommitRequest) (*pdv1.Ack, error) {
	key := roomKey(c.Room, c.Epoch)
	res := d.find("Commit", c.Room, c.Epoch, c.Capability)
	if res == nil {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		return nil, status.Errorf(codes.NotFound, "no live reservation for %s", key)
	}
	if !d.fromBoundSession(res, c.SessionId) {
		// Refused without touching the reservation: its own writer's
		// Commit may still come.
		d.authFailure("Commit")
		return nil, status.Errorf(codes.PermissionDenied, "commit for %s does not come from the session that wrote its pages", key)
	}
	res.mu.Lock()
	res.open = false // nothing lands after the pages are verified
	first := res.firstByte
	res.mu.Unlock()
	if st := res.r.State(); st != scheduler.StateReserved && st != scheduler.StateReceiving {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "reservation %s is %s; commit dropped", key, res.r.State())
	}
	if reason, err := d.verify(res, c); err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues(reason).Inc()
		d.o.Log.Warn("commit refused", "request_id", res.r.ID, "room", key.Room, "check", reason, "err", err)
		d.o.Engine.FailReserved(res.r, fmt.Errorf("KV handoff failed the %s check: %w", reason, err))
		d.maybeEnd(res)
		return nil, status.Errorf(codes.FailedPrecondition, "commit refused by the %s check: %v", reason, err)
	}
	if err := res.r.Lifecycle().To(scheduler.StateCommitted, ""); err != nil {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "reservation %s: %v", key, err)
	}
	res.timer.Stop()
	if !first.IsZero() {
		d.o.Metrics.TransferSeconds.Observe(time.Since(first).Seconds())
	}
	if res.r.Params.PromptLogprobs {
		res.r.SetPromptLogprobs(TokensFromPB(c.PromptLogprobs, len(res.r.Prompt)-1))
	}
	if err := d.o.Engine.Join(res.r, TokenFromPB(c.FirstToken)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.o.Log.Info("committed", "request_id", res.r.ID, "room", key.Room, "tokens", c.TokensWritten)
	return &pdv1.Ack{}, nil
}

// fromBoundSession says whether a Commit names the transfer session that
// decode admitted for res (the only one that may have written its pages).
func (d *Decode) fromBoundSession(res *reservation, id []byte) bool {
	if !faults.On(faults.GuardSessionBind) {
		return true
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.bound && len(id) == len(res.key.Session) && subtle.ConstantTimeCompare(res.key.Session[:], id) == 1
}

// verify checks a Commit against the pages: tokens written equal tokens
// reserved, one checksum per page, every page tagged as this request's and
// written as far as the prompt reaches, and each checksum equal to the
// checksum of what actually landed.
func (d *Decode) verify(res *reservation, c *pdv1.CommitRequest) (string, error) {
	n := len(res.r.Prompt)
	coverage := faults.On(faults.GuardCoverage)
	switch {
	case c.Writer != res.writer:
		return "writer", fmt.Errorf("commit from %q, the reservation's writer is %q", c.Writer, res.writer)
	case coverage && int(c.TokensWritten) < n:
		return "coverage", fmt.Errorf("%d tokens written, %d reserved", c.TokensWritten, n)
	case coverage && int(c.TokensWritten) > n:
		return "over_claim", fmt.Errorf("%d tokens claimed, only %d reserved", c.TokensWritten, n)
	case len(c.PageChecksums) != len(res.prompt):
		return "coverage", fmt.Errorf("%d page checksums for %d pages", len(c.PageChecksums), len(res.prompt))
	case c.FirstToken == nil:
		return "first_token", errors.New("no first token")
	}
	ps := d.o.Pool.PageSize()
	kv := d.o.Pool.KV()
	var buf []byte
	for i, p := range res.prompt {
		want := min(ps, n-i*ps)
		owner, written, st := d.o.Pool.Owner(p)
		if faults.On(faults.GuardOwnerTag) && (owner != res.r.Owner() || st != kvpool.PageAllocated) {
			return "owner_tag", fmt.Errorf("page %d is tagged %v (%s), not %v", p, owner, st, res.r.Owner())
		}
		if d.oneSided {
			// No frame marked anything: what landed is proven by its
			// checksum over the page contents, then marked written.
			landed := kv
			if d.o.Landing.Data != nil {
				landed = d.o.Landing
			}
			var err error
			if buf, err = checkLanded(landed, p, want, c.PageChecksums[i], buf); err != nil {
				return "checksum", err
			}
			if d.o.Landing.Data != nil {
				// The verified bytes, not the landing zone again: a late
				// write there cannot slip in between check and copy.
				if err := transfer.Unpack(kv, p, want, buf); err != nil {
					return "checksum", fmt.Errorf("copying verified page %d into the pool: %w", p, err)
				}
			}
			if err := d.o.Pool.MarkWritten(res.r.Owner(), p, want); err != nil {
				return "coverage", err
			}
			continue
		}
		if coverage && written != want {
			return "coverage", fmt.Errorf("page %d holds %d written tokens, %d needed", p, written, want)
		}
		if !coverage && written < want {
			// Without the coverage guard the pages count as written (the
			// read gate would refuse them otherwise): the incident's shape.
			_ = d.o.Pool.MarkWritten(res.r.Owner(), p, want)
		}
		var err error
		if buf, err = checkLanded(kv, p, want, c.PageChecksums[i], buf); err != nil {
			return "checksum", err
		}
	}
	return "", nil
}

// checkLanded reads back the first tokens slots of page as they are in the
// pool (device memory included) and compares their checksum with the
// commit's claim. buf is reused.
func checkLanded(kv kernels.PagedKV, page int32, tokens int, claim uint64, buf []byte) ([]byte, error) {
	buf, err := transfer.ReadPage(kv, page, tokens, buf)
	if err != nil {
		return buf, fmt.Errorf("reading page %d back: %w", page, err)
	}
	if got := transfer.Checksum(buf); faults.On(faults.GuardChecksum) && got != claim {
		return buf, fmt.Errorf("page %d checksum %016x, commit claims %016x", page, got, claim)
	}
	return buf, nil
}

// abortReserved aborts a reservation that has not joined the batch, or asks
// the engine to abort it if it has. The writer is told to stop; the pages
// stay quarantined until it says Drained or its session is proven closed.
func (d *Decode) abortReserved(res *reservation, why string) bool {
	res.mu.Lock()
	res.open = false
	if res.abortedAt.IsZero() {
		res.abortedAt = time.Now()
	}
	res.mu.Unlock()
	res.timer.Stop()
	switch res.r.State() {
	case scheduler.StateReserved, scheduler.StateReceiving:
		if !d.o.Engine.ReleaseReserved(res.r, why) {
			return false
		}
	case scheduler.StateCommitted, scheduler.StateDecoding:
		res.r.Cancel()
		return true
	default:
		return false
	}
	d.o.Log.Info("aborted before decode", "request_id", res.r.ID, "room", res.key.Room, "why", why)
	res.mu.Lock()
	landed := !res.firstByte.IsZero()
	res.mu.Unlock()
	if d.o.Engine.WriterHeld(res.r) && !landed && d.o.ReceiverWrites {
		// Nothing of this reservation ever landed, and the receiver, the
		// only thing that writes these pages, refuses it from now on: no
		// write can land, whether or not the writer is still reachable.
		d.writerGone(res, false, "no frame landed and the receiver refuses this reservation from now on")
	}
	if ev, ok := d.recv.(transfer.Evictor); ok && landed && d.o.Engine.WriterHeld(res.r) {
		// A writer that neither drains nor closes within the handoff
		// timeout (gone wrong, or holding its connection to keep the pages
		// quarantined) is cut off by the receiver, whose goroutine's end
		// (Closed) is then the proof that nothing more lands.
		time.AfterFunc(d.o.HandoffTimeout, func() {
			if d.o.Engine.WriterHeld(res.r) {
				d.o.Log.Warn("writer still holds its session after an abort; the receiver ends it", "request_id", res.r.ID, "room", res.key.Room)
				ev.Evict(res.sessionKey())
			}
		})
	}
	if d.o.Engine.WriterHeld(res.r) {
		go d.tellWriter(res, why)
		if !faults.On(faults.GuardDrainWait) {
			// Test builds only: reuse the pages without waiting for the writer.
			d.writerGone(res, false, "drain wait switched off")
		}
	}
	d.maybeEnd(res)
	return true
}

// tellWriter sends Abort to the prefill worker writing res; it answers with
// Drained once nothing of it is in flight.
func (d *Decode) tellWriter(res *reservation, why string) {
	cc, err := d.peers.get(res.writer)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(withRequestID(context.Background(), res.r.ID), 10*time.Second)
	defer cancel()
	_, err = pdv1.NewPrefillClient(cc).Abort(ctx, &pdv1.AbortRequest{Room: res.key.Room, Epoch: res.key.Epoch, Reason: why,
		RequestId: res.r.ID, DecodeAddr: d.grpcAddr, Capability: res.key.Cap[:]})
	if err != nil {
		// The pages stay quarantined: only Drained or a transport proof frees them.
		d.o.Log.Warn("abort to prefill failed; pages stay quarantined until the session is proven closed",
			"request_id", res.r.ID, "writer", res.writer, "err", err)
	}
}

// CancelReservation implements the RPC (the router gives up on a handoff).
func (d *Decode) CancelReservation(ctx context.Context, c *pdv1.CancelRequest) (*pdv1.Ack, error) {
	res := d.find("CancelReservation", c.Room, c.Epoch, c.Capability)
	if res == nil || !d.abortReserved(res, "reservation cancelled: "+c.Reason) {
		d.o.Metrics.LateDropped.WithLabelValues("cancel").Inc()
	}
	return &pdv1.Ack{}, nil
}

// Abort implements the RPC (the client left).
func (d *Decode) Abort(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	res := d.find("Abort", a.Room, a.Epoch, a.Capability)
	if res == nil || !d.abortReserved(res, "aborted: "+a.Reason) {
		d.o.Metrics.LateDropped.WithLabelValues("abort").Inc()
	}
	return &pdv1.Ack{}, nil
}

// Finish implements the RPC (a stop string matched at the router).
func (d *Decode) Finish(ctx context.Context, a *pdv1.AbortRequest) (*pdv1.Ack, error) {
	if res := d.find("Finish", a.Room, a.Epoch, a.Capability); res != nil {
		res.r.Stop()
	}
	return &pdv1.Ack{}, nil
}

// Drained implements the RPC: the writer's word that nothing of it is in flight.
func (d *Decode) Drained(ctx context.Context, dr *pdv1.DrainedRequest) (*pdv1.Ack, error) {
	res := d.find("Drained", dr.Room, dr.Epoch, dr.Capability)
	if res == nil || dr.Writer != res.writer {
		d.o.Metrics.LateDropped.WithLabelValues("drained").Inc()
		return &pdv1.Ack{}, nil
	}
	d.writerGone(res, true, "")
	return &pdv1.Ack{}, nil
}

// Stream implements the RPC: the generated tokens, to the router.
func (d *Decode) Stream(req *pdv1.StreamRequest, out pdv1.Decode_StreamServer) error {
	res := d.find("Stream", req.Room, req.Epoch, req.Capability)
	if res == nil {
		return status.Errorf(codes.NotFound, "no reservation room %d epoch %d", req.Room, req.Epoch)
	}
	if !res.claimStream() {
		// One reader per reservation: a second Stream would split the
		// tokens between two callers.
		d.authFailure("Stream")
		return status.Errorf(codes.FailedPrecondition, "reservation room %d epoch %d is already being streamed", req.Room, req.Epoch)
	}
	ctx := out.Context()
	for {
		ev, ok := res.r.Next(ctx)
		if !ok { // the router went away: the request has no reader left
			d.abortReserved(res, "router stream closed")
			return ctx.Err()
		}
		te := &pdv1.TokenEvent{Token: TokenToPB(ev.Token), PromptLogprobs: TokensToPB(ev.Prompt)}
		switch ev.Finish {
		case "":
		case scheduler.FinishStop, scheduler.FinishLength:
			te.Finish = ev.Finish
		case scheduler.FinishAbort:
			te.Error, te.Code = "request aborted: "+errString(ev.Err), 499
		default:
			te.Error, te.Code = errString(ev.Err), 500
		}
		if err := out.Send(te); err != nil {
			d.abortReserved(res, "router stream broken")
			return err
		}
		if ev.Finish != "" {
			res.mu.Lock()
			res.streamed = true
			res.mu.Unlock()
			d.maybeEnd(res)
			return nil
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}

// maybeEnd notes when a reservation is over: terminal and its writer gone.
func (d *Decode) maybeEnd(res *reservation) {
	if !res.r.Lifecycle().Terminal() || d.o.Engine.WriterHeld(res.r) {
		return
	}
	res.mu.Lock()
	first := res.ended.IsZero()
	if first {
		res.ended = time.Now()
	}
	res.mu.Unlock()
	if first {
		d.o.Metrics.ReservationsActive.Dec()
		d.releasePeer(res.peer, res.held)
	}
}

// sessionKey names the session bound to res (the zero session if none
// was admitted).
func (res *reservation) sessionKey() transfer.Key {
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.key
}

// claimStream marks res as having its one reader.
func (res *reservation) claimStream() bool {
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.reader {
		return false
	}
	res.reader = true
	return true
}

// sweep forgets reservations that are over and whose events were streamed
// (or that nobody streamed for a minute), and aborts finished requests whose
// reader vanished.
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
		var live []*reservation
		for k, res := range d.rooms {
			res.mu.Lock()
			ended, streamed := res.ended, res.streamed
			res.mu.Unlock()
			if !ended.IsZero() && (streamed || time.Since(ended) > time.Minute) {
				delete(d.rooms, k)
				continue
			}
			live = append(live, res)
		}
		d.mu.Unlock()
		for _, res := range live {
			d.maybeEnd(res) // a request that finished in the engine ends here
		}
	}
}
