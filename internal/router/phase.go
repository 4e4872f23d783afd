package router

import "strings"

// phase is where a request stands on its way through the router. Only the
// request's run goroutine moves it (stream.to); Next, Cancel and Stop talk
// to run through channels and never touch it.
type phase uint8

const (
	phasePicking   phase = iota // choosing a prefill/decode pair
	phaseQueued                 // in the router's queue: no decode worker has room now
	phaseReserved               // a decode worker holds pages for it
	phaseRelaying               // prefill computes the prompt into them; decode's token stream is open
	phaseStreaming              // its first event reached the caller
	phaseMigrating              // its decode worker failed it after tokens reached the caller; it goes on elsewhere from them
	phaseDone                   // its last event was delivered, or a stop string ended it
	phaseFailed                 // it ended with an error
	phaseCancelled              // the caller left
)

var phaseNames = [...]string{"picking", "queued", "reserved", "relaying", "streaming", "migrating", "done", "failed", "cancelled"}

func (p phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return "phase?"
}

func (p phase) terminal() bool { return p >= phaseDone }

// phaseMoves are the legal moves (a prompt its decode worker computes
// itself goes from picking straight to relaying: nothing is reserved): an
// attempt that fails before the first
// token goes back to picking; one whose decode worker failed it after
// tokens (the worker went away, reported a failure of its own, or its spec
// guard stopped it) migrates, and from there picks again to go on from the
// tokens the caller has, or ends; any live phase may end with an error or
// a caller that left.
var phaseMoves = map[phase][]phase{
	phasePicking:   {phaseQueued, phaseReserved, phaseRelaying, phaseFailed, phaseCancelled},
	phaseQueued:    {phasePicking, phaseFailed, phaseCancelled},
	phaseReserved:  {phaseRelaying, phaseFailed, phaseCancelled},
	phaseRelaying:  {phaseStreaming, phasePicking, phaseMigrating, phaseFailed, phaseCancelled, phaseDone},
	phaseStreaming: {phaseDone, phaseMigrating, phaseFailed, phaseCancelled},
	phaseMigrating: {phasePicking, phaseDone, phaseFailed, phaseCancelled},
}

func (p phase) may(next phase) bool {
	for _, q := range phaseMoves[p] {
		if q == next {
			return true
		}
	}
	return false
}

// to moves the request to next (staying put is no move). An illegal move is
// a bug in run's control flow: it is logged and made all the same, since
// the request's calls are already past it.
func (s *stream) to(next phase) {
	if next == s.phase {
		return
	}
	if !s.phase.may(next) {
		s.log.Error("router request moved out of order", "from", s.phase, "to", next, "phases", s.phases())
	}
	s.phase = next
	s.trail = append(s.trail, next)
	if next.terminal() {
		s.log.Debug("request ended", "phases", s.phases())
	}
}

// phases is the request's way so far, for the log.
func (s *stream) phases() string {
	names := make([]string, len(s.trail)+1)
	names[0] = phasePicking.String()
	for i, p := range s.trail {
		names[i+1] = p.String()
	}
	return strings.Join(names, " > ")
}
