// Package inject puts faults into a prefill worker's handoff (frame and
// request faults of a BATON_FAULTS spec) as decorators around the parts the
// worker is made of: its transport Sender, its gRPC calls to decode and its
// gRPC server. Only files built with the faults tag install them
// (cmd/baton/inject_faults.go), so the worker's own code has one path and
// never asks about a fault. Without a spec each decorator returns what it
// was given.
package inject

import (
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

var (
	rngMu sync.Mutex
	rng   *rand.Rand
)

// roll draws true with probability p from the spec's seeded stream.
func roll(sp *faults.Spec, p float64) bool {
	if p <= 0 {
		return false
	}
	rngMu.Lock()
	defer rngMu.Unlock()
	if rng == nil {
		rng = rand.New(rand.NewPCG(sp.Seed, sp.Seed^0x5851f42d4c957f2d))
	}
	return rng.Float64() < p
}

// request holds the per-request faults rolled for one reservation.
type request struct {
	ShortWrite, OverClaim, WrongEpoch, LostDrained bool
	open                                           int // sessions open for it
}

// requests are the rolls by reservation capability (unique per
// reservation, and carried by Open, Commit and Drained alike).
var requests = struct {
	sync.Mutex
	m map[transfer.Capability]*request
}{m: map[transfer.Capability]*request{}}

// forRequest rolls a reservation's faults the first time any decorator
// sees it and returns the same roll after.
func forRequest(sp *faults.Spec, c transfer.Capability) *request {
	requests.Lock()
	defer requests.Unlock()
	rf := requests.m[c]
	if rf == nil {
		rf = &request{ShortWrite: roll(sp, sp.ShortWrite), OverClaim: roll(sp, sp.OverClaim),
			WrongEpoch: roll(sp, sp.WrongEpoch), LostDrained: roll(sp, sp.LostDrained)}
		requests.m[c] = rf
	}
	return rf
}

func forget(c transfer.Capability) {
	requests.Lock()
	delete(requests.m, c)
	requests.Unlock()
}

// Sender wraps a prefill worker's transport: per reservation it may open
// the session with a wrong epoch, and it puts the frame faults between the
// worker and the session.
func Sender(s transfer.Sender) transfer.Sender {
	sp := faults.Active()
	if sp == nil {
		return s
	}
	return &sender{Sender: s, sp: sp}
}

type sender struct {
	transfer.Sender
	sp *faults.Spec
}

func (s *sender) Open(ctx context.Context, addr string, k transfer.Key) (transfer.Session, error) {
	rf := forRequest(s.sp, k.Cap)
	if rf.WrongEpoch {
		k.Epoch++
	}
	sess, err := s.Sender.Open(ctx, addr, k)
	if err != nil {
		return nil, err
	}
	requests.Lock()
	rf.open++
	requests.Unlock()
	var out transfer.Session = &session{Session: sess, sp: s.sp, rf: rf}
	if rf.ShortWrite {
		out = &shortSession{Session: out}
	}
	return out, nil
}

// DialOptions decorate a prefill worker's calls to decode: a Commit may
// claim one token more than was written, or name the wrong epoch the
// session was opened with, and a Drained may be lost. They go before the
// internal plane's options, so a signed call is signed as changed.
func DialOptions() []grpc.DialOption {
	sp := faults.Active()
	if sp == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		switch m := req.(type) {
		case *pdv1.CommitRequest:
			c, _ := transfer.CapabilityFrom(m.Capability)
			rf := forRequest(sp, c)
			if rf.OverClaim || rf.WrongEpoch {
				m = cloneCommit(m)
				if rf.OverClaim {
					m.TokensWritten++
				}
				if rf.WrongEpoch {
					m.Epoch++
				}
			}
			err := invoker(ctx, method, m, reply, cc, opts...)
			if err == nil {
				forget(c)
			}
			return err
		case *pdv1.DrainedRequest:
			c, _ := transfer.CapabilityFrom(m.Capability)
			lost := forRequest(sp, c).LostDrained
			forget(c)
			if lost { // the message never arrives
				return nil
			}
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})}
}

func cloneCommit(m *pdv1.CommitRequest) *pdv1.CommitRequest {
	return proto.Clone(m).(*pdv1.CommitRequest)
}

// ServerOptions decorate a prefill worker's gRPC server: with ignore_abort
// it answers decode's Abort without stopping a writer whose session is
// open, so that it carries on writing.
func ServerOptions() []grpc.ServerOption {
	sp := faults.Active()
	if sp == nil || !sp.IgnoreAbort {
		return nil
	}
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if a, ok := req.(*pdv1.AbortRequest); ok && info.FullMethod == "/baton.pd.v1.Prefill/Abort" {
			c, _ := transfer.CapabilityFrom(a.Capability)
			requests.Lock()
			rf := requests.m[c]
			writing := rf != nil && rf.open > 0
			requests.Unlock()
			if writing {
				return &pdv1.Ack{}, nil
			}
		}
		return handler(ctx, req)
	})}
}

var frames struct {
	sync.Mutex
	n int
}

type session struct {
	transfer.Session
	sp     *faults.Spec
	rf     *request
	held   *transfer.PageWrite // a frame held back to be sent after the next one
	closed bool
}

func (s *session) Write(w transfer.PageWrite) error {
	if s.sp.KillAfterFrames > 0 {
		frames.Lock()
		frames.n++
		n := frames.n
		frames.Unlock()
		if n > s.sp.KillAfterFrames {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
	}
	time.Sleep(s.sp.SlowWriter)
	if s.sp.Delay > 0 && roll(s.sp, s.sp.DelayP) {
		time.Sleep(s.sp.Delay)
	}
	if roll(s.sp, s.sp.Drop) {
		return nil
	}
	// A staged page (cuda-ipc) has no rows here to corrupt.
	if roll(s.sp, s.sp.Corrupt) && len(w.Data) > 0 {
		w.Data = append([]byte(nil), w.Data...)
		w.Data[len(w.Data)/2] ^= 0x40
	}
	if roll(s.sp, s.sp.WrongPage) {
		w.Page++
	}
	if s.held == nil && roll(s.sp, s.sp.Reorder) {
		s.held = &w
		return nil
	}
	dup := roll(s.sp, s.sp.Duplicate)
	var copyW transfer.PageWrite
	if dup {
		copyW = w
		copyW.Data = append([]byte(nil), w.Data...)
	}
	if err := s.Session.Write(w); err != nil {
		return err
	}
	if dup {
		if err := s.Session.Write(copyW); err != nil {
			return err
		}
	}
	return s.release()
}

// StagePages stages through the session underneath where it can
// (cuda-ipc), so the faults above apply to the frames that name staged
// pages too.
func (s *session) StagePages(kv kernels.PagedKV, pages []int32, tokens []int) (transfer.Staged, error) {
	return transfer.StagePages(s.Session, kv, pages, tokens)
}

func (s *session) release() error {
	if s.held == nil {
		return nil
	}
	h := *s.held
	s.held = nil
	return s.Session.Write(h)
}

func (s *session) Flush(ctx context.Context) error {
	if err := s.release(); err != nil {
		return err
	}
	return s.Session.Flush(ctx)
}

func (s *session) Close() error {
	if !s.closed {
		s.closed = true
		requests.Lock()
		s.rf.open--
		requests.Unlock()
	}
	return s.Session.Close()
}

// shortSession never sends the last page written: each frame waits for
// the next one, and the one still waiting at Flush is dropped. Pages are
// written in order, so that is the prompt's last page.
type shortSession struct {
	transfer.Session
	last *transfer.PageWrite
}

func (s *shortSession) Write(w transfer.PageWrite) error {
	prev := s.last
	s.last = &w
	if prev == nil {
		return nil
	}
	return s.Session.Write(*prev)
}

// StagePages: see session.StagePages.
func (s *shortSession) StagePages(kv kernels.PagedKV, pages []int32, tokens []int) (transfer.Staged, error) {
	return transfer.StagePages(s.Session, kv, pages, tokens)
}

func (s *shortSession) Flush(ctx context.Context) error {
	s.last = nil
	return s.Session.Flush(ctx)
}
