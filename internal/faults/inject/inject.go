// Package inject puts faults into a prefill worker's handoff (frame and
// request faults of a BATON_FAULTS spec) in binaries built with the faults
// tag; in every other build there is no spec and each hook is a no-op. It
// sits apart from package faults so that the guards' switches, which the
// scheduler reads, do not bring the transport along.
package inject

import (
	"context"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/batonlm/baton/internal/faults"
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

// IgnoreAbort reports whether a writer should ignore Abort (a fault).
func IgnoreAbort() bool {
	sp := faults.Active()
	return sp != nil && sp.IgnoreAbort
}

// Request holds the per-request faults rolled for one prefill.
type Request struct {
	ShortWrite, OverClaim, WrongEpoch, LostDrained bool
}

// ForRequest rolls the per-request faults (none without a spec).
func ForRequest() Request {
	sp := faults.Active()
	if sp == nil {
		return Request{}
	}
	return Request{ShortWrite: roll(sp, sp.ShortWrite), OverClaim: roll(sp, sp.OverClaim),
		WrongEpoch: roll(sp, sp.WrongEpoch), LostDrained: roll(sp, sp.LostDrained)}
}

// WrapSession puts the frame faults between a prefill and its session:
// drop, delay, duplicate, reorder, corrupt, misdirect, a slow writer, a
// short write (the last page never sent) and a kill mid-transfer.
func WrapSession(s transfer.Session, rf Request, lastIndex int) transfer.Session {
	sp := faults.Active()
	if sp == nil {
		return s
	}
	return &session{Session: s, sp: sp, rf: rf, last: lastIndex}
}

var frames struct {
	sync.Mutex
	n int
}

type session struct {
	transfer.Session
	sp   *faults.Spec
	rf   Request
	last int
	held *transfer.PageWrite // a frame held back to be sent after the next one
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
	if (s.rf.ShortWrite && w.Index == s.last) || roll(s.sp, s.sp.Drop) {
		return nil
	}
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
