package scheduler

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
)

// lcAllStates is written out rather than derived so that a state added to the
// implementation but not to these tables shows up as a missing row.
var lcAllStates = []State{
	StateReceived, StateRejected, StateAdmitted, StatePrefilling, StateSending,
	StateSent, StateReserved, StateReceiving, StateCommitted, StateDecoding,
	StateFinished, StateAborting, StateDraining, StateAborted, StateDrained,
	StatePreempted, StateVerifying, StateSealed, StateAbandoned,
}

var lcAllRoles = []Role{RoleStandalone, RolePrefill, RoleDecode}

// lcSituations is the hand-written table of legal moves, per role.
var lcSituations = lifecycleSituations()

// lcSituation is one place a request can be: the moves from Received that get
// it there, and the moves that must be legal from there. Everything else
// must be refused. The table is DESIGN.md's diagrams copied by hand plus the
// documented preemption moves; it deliberately does not read the
// implementation's table.
type lcSituation struct {
	name  string
	path  []State
	legal []State
}

// lifecycleSituations builds the table inside a function so that its
// shorthand names stay out of the package.
func lifecycleSituations() map[Role][]lcSituation {
	// Shorthand for the table only.
	const (
		rcv  = StateReceived
		rej  = StateRejected
		adm  = StateAdmitted
		pre  = StatePrefilling
		snd  = StateSending
		sent = StateSent
		res  = StateReserved
		rcvg = StateReceiving
		com  = StateCommitted
		dec  = StateDecoding
		fin  = StateFinished
		abt  = StateAborting
		drn  = StateDraining
		abd  = StateAborted
		drd  = StateDrained
		pmt  = StatePreempted
		vfy  = StateVerifying
		lnd  = StateSealed
		abn  = StateAbandoned
	)
	p := func(s ...State) []State { return s }
	return map[Role][]lcSituation{
		RoleStandalone: {
			{"Received", p(), p(rej, adm, abt)},
			{"Rejected", p(rej), p()},
			{"Admitted", p(adm), p(pre, abt)},
			{"Prefilling", p(adm, pre), p(dec, pmt, abt)},
			{"Decoding", p(adm, pre, dec), p(fin, pmt, abt)},
			{"Finished", p(adm, pre, dec, fin), p()},
			{"Aborting from Received", p(abt), p(abd)},
			{"Aborting from Admitted", p(adm, abt), p(abd)},
			{"Aborting from Prefilling", p(adm, pre, abt), p(abd)},
			{"Aborting from Decoding", p(adm, pre, dec, abt), p(abd)},
			{"Aborted", p(adm, pre, dec, abt, abd), p()},
			// Preemption: wait, then back through admission; never a reject.
			{"Preempted from Prefilling", p(adm, pre, pmt), p(adm, abt)},
			{"Preempted from Decoding", p(adm, pre, dec, pmt), p(adm, abt)},
			{"Admitted again", p(adm, pre, dec, pmt, adm), p(pre, abt)},
			{"Prefilling again", p(adm, pre, dec, pmt, adm, pre), p(dec, pmt, abt)},
			{"Decoding again", p(adm, pre, pmt, adm, pre, dec), p(fin, pmt, abt)},
			{"Preempted twice", p(adm, pre, pmt, adm, pre, dec, pmt), p(adm, abt)},
			{"Aborting from Preempted", p(adm, pre, dec, pmt, abt), p(abd)},
			{"Aborted after preemption", p(adm, pre, dec, pmt, abt, abd), p()},
			{"Finished after preemption", p(adm, pre, dec, pmt, adm, pre, dec, fin), p()},
		},
		RolePrefill: {
			{"Received", p(), p(rej, adm, abt)},
			{"Rejected", p(rej), p()},
			{"Admitted", p(adm), p(pre, abt)},
			{"Prefilling", p(adm, pre), p(snd, abt)},
			{"Sending", p(adm, pre, snd), p(sent, abt)},
			{"Sent", p(adm, pre, snd, sent), p()},
			{"Aborting from Received", p(abt), p(drd)},
			{"Aborting from Admitted", p(adm, abt), p(drd)},
			{"Aborting from Prefilling", p(adm, pre, abt), p(drd)},
			{"Aborting from Sending", p(adm, pre, snd, abt), p(drd)},
			{"Drained", p(adm, pre, snd, abt, drd), p()},
		},
		RoleDecode: {
			{"Received", p(), p(rej, res, abt)},
			{"Rejected", p(rej), p()},
			{"Reserved", p(res), p(rcvg, vfy, abn, abt)},
			{"Receiving", p(res, rcvg), p(vfy, lnd, abn, abt)},
			{"Sealed", p(res, rcvg, lnd), p(vfy, abn, abt)},
			{"Abandoned", p(res, rcvg, abn), p(abt)},
			{"Aborting from Abandoned", p(res, abn, abt), p(drn, abd)},
			{"Verifying after the session closed", p(res, rcvg, lnd, vfy), p(com, abt)},
			{"Aborting from Sealed", p(res, rcvg, lnd, abt), p(drn, abd)},
			{"Verifying", p(res, rcvg, vfy), p(com, abt)},
			{"Verifying without a frame", p(res, vfy), p(com, abt)},
			{"Committed", p(res, rcvg, vfy, com), p(dec, abt)},
			{"Decoding", p(res, rcvg, vfy, com, dec), p(fin, abt)},
			{"Finished", p(res, rcvg, vfy, com, dec, fin), p()},
			{"Aborting from Received", p(abt), p(drn, abd)},
			{"Aborting from Reserved", p(res, abt), p(drn, abd)},
			{"Aborting from Receiving", p(res, rcvg, abt), p(drn, abd)},
			{"Aborting from Verifying", p(res, rcvg, vfy, abt), p(drn, abd)},
			{"Aborting from Committed", p(res, rcvg, vfy, com, abt), p(drn, abd)},
			{"Aborting from Decoding", p(res, rcvg, vfy, com, dec, abt), p(drn, abd)},
			{"Draining", p(res, rcvg, abt, drn), p(abd)},
			{"Aborted after draining", p(res, rcvg, abt, drn, abd), p()},
			{"Aborted directly", p(res, abt, abd), p()},
		},
	}
}

// lcReach drives a new lifecycle along path; every step must be legal.
func lcReach(t *testing.T, role Role, path []State) *Lifecycle {
	t.Helper()
	l := NewLifecycle(role)
	for i, s := range path {
		if err := l.To(s, "test reason"); err != nil {
			t.Fatalf("%s: step %d of %v: %v", role, i, path, err)
		}
	}
	return l
}

// TestTransitionTable tries every (lcSituation, next state) pair of every
// role, and for states a role never reaches, puts the request there by hand
// and checks that no move leads out: the full cross product of states.
func TestTransitionTable(t *testing.T) {
	for _, role := range lcAllRoles {
		reached := map[State]bool{}
		for _, sit := range lcSituations[role] {
			for _, to := range lcAllStates {
				l := lcReach(t, role, sit.path)
				from := l.State()
				reached[from] = true
				err := l.To(to, "test reason")
				want := slices.Contains(sit.legal, to)
				switch {
				case want && err != nil:
					t.Errorf("%s %s → %s: refused: %v", role, sit.name, to, err)
				case want && l.State() != to:
					t.Errorf("%s %s → %s: accepted but state is %s", role, sit.name, to, l.State())
				case !want && err == nil:
					t.Errorf("%s %s → %s: accepted an illegal move", role, sit.name, to)
				case !want:
					lcCheckRefusal(t, l, err, from, to)
				}
			}
		}
		for _, from := range lcAllStates {
			if reached[from] {
				continue
			}
			for _, to := range lcAllStates {
				l := NewLifecycle(role)
				l.state = from // not reachable through To in this role
				err := l.To(to, "test reason")
				if err == nil {
					t.Errorf("%s: unreachable state %s moved to %s", role, from, to)
					continue
				}
				lcCheckRefusal(t, l, err, from, to)
			}
		}
	}
}

func lcCheckRefusal(t *testing.T, l *Lifecycle, err error, from, to State) {
	t.Helper()
	if l.State() != from {
		t.Errorf("%s %s → %s: refused move changed state to %s", l.Role(), from, to, l.State())
	}
	if !errors.Is(err, ErrIllegalTransition) {
		t.Errorf("%s %s → %s: error %v does not match ErrIllegalTransition", l.Role(), from, to, err)
	}
	var te *TransitionError
	if !errors.As(err, &te) || te.From != from || te.To != to || te.Role != l.Role() {
		t.Errorf("%s %s → %s: error %#v", l.Role(), from, to, err)
	}
	if msg := err.Error(); !strings.Contains(msg, from.String()) || !strings.Contains(msg, to.String()) {
		t.Errorf("error %q does not name both states", msg)
	}
}

func TestTerminalAcceptsNothing(t *testing.T) {
	for _, role := range lcAllRoles {
		terminals := 0
		for _, sit := range lcSituations[role] {
			l := lcReach(t, role, sit.path)
			if !l.Terminal() {
				continue
			}
			terminals++
			if len(sit.legal) != 0 {
				t.Errorf("%s: table lists moves out of terminal %s", role, sit.name)
			}
			for _, to := range lcAllStates {
				if err := l.To(to, "again"); err == nil {
					t.Errorf("%s: terminal %s moved to %s", role, sit.name, to)
				}
			}
		}
		if terminals < 3 {
			t.Errorf("%s: only %d terminal situations tried", role, terminals)
		}
	}
}

func TestRejectedOnlyFromReceived(t *testing.T) {
	for _, role := range lcAllRoles {
		for _, sit := range lcSituations[role] {
			l := lcReach(t, role, sit.path)
			from := l.State()
			err := l.To(StateRejected, "too long")
			if (err == nil) != (from == StateReceived) {
				t.Errorf("%s %s → Rejected: err %v", role, sit.name, err)
			}
		}
	}
	// A preempted request is never a reject, whatever it holds.
	l := lcReach(t, RoleStandalone, lcPath(StateAdmitted, StatePrefilling, StateDecoding, StatePreempted))
	if err := l.To(StateRejected, "no room"); err == nil {
		t.Error("preempted request rejected")
	}
}

func TestLiveAndTerminal(t *testing.T) {
	terminal := []State{StateRejected, StateSent, StateFinished, StateAborted, StateDrained}
	notLive := []State{StateRejected, StateSent, StateFinished, StateAborting, StateDraining, StateAborted, StateDrained}
	for _, s := range lcAllStates {
		if got, want := s.Terminal(), slices.Contains(terminal, s); got != want {
			t.Errorf("%s.Terminal() = %v", s, got)
		}
		if got, want := s.Live(), !slices.Contains(notLive, s); got != want {
			t.Errorf("%s.Live() = %v", s, got)
		}
	}
	for _, s := range []State{0, -1, 99} {
		if s.Live() || s.Terminal() {
			t.Errorf("invalid state %d is live or terminal", s)
		}
	}
}

func TestPreemption(t *testing.T) {
	l := lcReach(t, RoleStandalone, lcPath(StateAdmitted, StatePrefilling, StateDecoding))
	if l.Requeued() || l.Preemptions() != 0 {
		t.Fatal("requeued before any preemption")
	}
	lcMust(t, l.To(StatePreempted, ""))
	if !l.Requeued() || l.Preemptions() != 1 || !l.Live() {
		t.Fatalf("after preemption: requeued %v, preemptions %d, live %v", l.Requeued(), l.Preemptions(), l.Live())
	}
	// Re-admission goes through Admitted like a new request, not straight
	// back to where it was.
	if err := l.To(StateDecoding, ""); err == nil {
		t.Fatal("Preempted → Decoding skipped admission")
	}
	lcMust(t, l.To(StateAdmitted, ""))
	if l.Requeued() {
		t.Fatal("still requeued after re-admission")
	}
	lcMust(t, l.To(StatePrefilling, ""))
	lcMust(t, l.To(StatePreempted, ""))
	lcMust(t, l.To(StateAborting, "client went away"))
	if l.Requeued() || l.Preemptions() != 2 || l.Reason() != "client went away" {
		t.Fatalf("after abort: requeued %v, preemptions %d, reason %q", l.Requeued(), l.Preemptions(), l.Reason())
	}
	// Only standalone preempts.
	for _, tc := range []struct {
		role Role
		path []State
	}{
		{RolePrefill, lcPath(StateAdmitted, StatePrefilling)},
		{RoleDecode, lcPath(StateReserved, StateReceiving, StateVerifying, StateCommitted, StateDecoding)},
	} {
		if err := lcReach(t, tc.role, tc.path).To(StatePreempted, ""); err == nil {
			t.Errorf("%s request preempted", tc.role)
		}
	}
}

func TestReason(t *testing.T) {
	l := NewLifecycle(RoleDecode)
	if err := l.To(StateRejected, ""); !errors.Is(err, ErrNoReason) {
		t.Fatalf("reject without reason: %v", err)
	}
	if l.State() != StateReceived {
		t.Fatalf("state %s after refused reject", l.State())
	}
	lcMust(t, l.To(StateRejected, "prompt of 2000 tokens exceeds pool of 1024"))
	if l.Reason() != "prompt of 2000 tokens exceeds pool of 1024" {
		t.Fatalf("reason %q", l.Reason())
	}

	l = lcReach(t, RoleDecode, lcPath(StateReserved, StateReceiving))
	if err := l.To(StateAborting, ""); !errors.Is(err, ErrNoReason) {
		t.Fatalf("abort without reason: %v", err)
	}
	lcMust(t, l.To(StateAborting, "commit checksum mismatch on page 3"))
	lcMust(t, l.To(StateDraining, "later reason"))
	lcMust(t, l.To(StateAborted, "later reason"))
	if l.Reason() != "commit checksum mismatch on page 3" {
		t.Fatalf("abort reason overwritten: %q", l.Reason())
	}
	if lcReach(t, RoleDecode, lcPath(StateReserved)).Reason() != "" {
		t.Fatal("reason on a request never rejected or aborted")
	}
}

func TestZeroLifecycleRefusesAll(t *testing.T) {
	for _, to := range lcAllStates {
		var l Lifecycle
		if err := l.To(to, "x"); err == nil {
			t.Errorf("zero Lifecycle moved to %s", to)
		}
	}
	for _, to := range lcAllStates {
		l := &Lifecycle{role: Role(7), state: StateReceived}
		if err := l.To(to, "x"); err == nil {
			t.Errorf("unknown role moved to %s", to)
		}
	}
}

func TestStrings(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range lcAllStates {
		name := s.String()
		if name == "" || strings.HasPrefix(name, "State(") || seen[name] {
			t.Errorf("state %d named %q", int(s), name)
		}
		seen[name] = true
	}
	if State(0).String() != "State(0)" || Role(9).String() != "role(9)" {
		t.Error("unknown values not named by number")
	}
	if RoleDecode.String() != "decode" || RolePrefill.String() != "prefill" || RoleStandalone.String() != "standalone" {
		t.Error("role names")
	}
}

// The engine moves the state while handlers read it; -race checks the lock.
func TestConcurrentReads(t *testing.T) {
	l := NewLifecycle(RoleStandalone)
	var wg, started sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			started.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = l.State()
				_ = l.Live()
				_ = l.Terminal()
				_ = l.Reason()
				_ = l.Requeued()
				_ = l.Preemptions()
			}
		}()
	}
	started.Wait()
	lcMust(t, l.To(StateAdmitted, ""))
	// Many preemption cycles so that moves and reads overlap.
	for range 1000 {
		lcMust(t, l.To(StatePrefilling, ""))
		lcMust(t, l.To(StatePreempted, ""))
		lcMust(t, l.To(StateAdmitted, ""))
	}
	lcMust(t, l.To(StatePrefilling, ""))
	lcMust(t, l.To(StateDecoding, ""))
	lcMust(t, l.To(StateFinished, ""))
	close(stop)
	wg.Wait()
	if l.State() != StateFinished || l.Preemptions() != 1000 {
		t.Fatalf("state %s, preemptions %d", l.State(), l.Preemptions())
	}
}

func lcMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func lcPath(s ...State) []State { return s }

// Move is compare-and-move: of many goroutines that all saw Receiving and
// race to leave it, one moves and every other is refused, and a Move from
// a state the request is not in changes nothing.
func TestMoveComparesAndMoves(t *testing.T) {
	for range 50 {
		l := lcReach(t, RoleDecode, lcPath(StateReserved, StateReceiving))
		var wg sync.WaitGroup
		var won sync.Map
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				next := StateVerifying
				if i%2 == 0 {
					next = StateAborting
				}
				if l.Move([]State{StateReserved, StateReceiving}, next, "race") == nil {
					won.Store(i, next)
				}
			}()
		}
		wg.Wait()
		n := 0
		won.Range(func(_, _ any) bool { n++; return true })
		if n != 1 {
			t.Fatalf("%d goroutines moved out of Receiving, want exactly 1", n)
		}
	}
	l := lcReach(t, RoleDecode, lcPath(StateReserved, StateReceiving, StateVerifying, StateCommitted))
	if err := l.Move([]State{StateReserved, StateReceiving, StateVerifying}, StateAborting, "late"); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("Move from states the request left: %v", err)
	}
	if l.State() != StateCommitted || l.Reason() != "" {
		t.Fatalf("a refused Move changed the request: %s %q", l.State(), l.Reason())
	}
}

// OnEnd runs once, on the move into a terminal state, and at once for a
// request that has already ended; a refused move never runs it.
func TestOnEndRunsOnceAtTheEnd(t *testing.T) {
	l := lcReach(t, RoleDecode, lcPath(StateReserved, StateReceiving))
	n := 0
	l.OnEnd(func() { n++ })
	lcMust(t, l.To(StateAborting, "test"))
	lcMust(t, l.To(StateDraining, ""))
	if n != 0 {
		t.Fatalf("OnEnd ran %d times before the end", n)
	}
	lcMust(t, l.To(StateAborted, ""))
	if err := l.To(StateAborted, ""); err == nil {
		t.Fatal("a terminal request moved again")
	}
	if n != 1 {
		t.Fatalf("OnEnd ran %d times, want 1", n)
	}
	late := 0
	l.OnEnd(func() { late++ })
	if late != 1 {
		t.Fatalf("OnEnd on an ended request ran %d times, want 1", late)
	}
}

// Whether a decode writer holds the prompt pages is read off the state.
func TestWriterHolds(t *testing.T) {
	holds := map[State]bool{StateReserved: true, StateReceiving: true, StateSealed: true, StateDraining: true}
	// Abandoned: the writer's Drained ended its hold.
	for _, s := range lcAllStates {
		if s.WriterHolds() != holds[s] {
			t.Errorf("%s: WriterHolds %v, want %v", s, s.WriterHolds(), holds[s])
		}
	}
}
