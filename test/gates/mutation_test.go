package gates

import (
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/faults"
)

// guardGates maps each guard to the gate scenario that must fail without it.
var guardGates = []struct {
	guard    string
	scenario func(t *testing.T, guardsOff string) violations
}{
	{faults.GuardDoor, scenarioDoor},
	{faults.GuardCoverage, handoffScenario("short write")},
	{faults.GuardChecksum, handoffScenario("corrupt bytes")},
	{faults.GuardOwnerTag, handoffScenario("misdirected page")},
	{faults.GuardDrainWait, scenarioAbortDuringTransfer},
	{faults.GuardLateDrop, scenarioAbortDuringTransfer},
	{faults.GuardDrainWait, scenarioAbortDuringTransferIPC},
	{faults.GuardReadGate, scenarioReadGate},
	{faults.GuardCacheWrite, scenarioCacheWrite},
	{faults.GuardCacheComplete, scenarioCacheComplete},
	{faults.GuardCachePin, scenarioCachePin},
	{faults.GuardTenantSalt, scenarioTenantSalt},
	{faults.GuardHeldRecheck, scenarioHeldRecheck},
	{faults.GuardLoadWait, scenarioHiCache},
	{faults.GuardLoadReady, scenarioHiCacheNoReadGuard},
	{faults.GuardPeerAuth, scenarioAdversary},
	{faults.GuardCapability, scenarioAdversary},
	{faults.GuardSessionBind, scenarioAdversary},
	{faults.GuardDialKnown, scenarioAdversary},
	{faults.GuardPeerQuota, scenarioAdversary},
	{faults.GuardPeerAuth, scenarioAdversaryIdentity},
	{faults.GuardPeerQuota, scenarioAdversaryIdentity},
}

// handoffScenario is the transfer/read scenario of the named fault.
func handoffScenario(name string) func(*testing.T, string) violations {
	for _, f := range handoffFaults {
		if f.name == name {
			return func(t *testing.T, off string) violations { return scenarioHandoffFault(t, f, off) }
		}
	}
	panic("gates: no handoff fault named " + name)
}

// TestMutationProof switches each guard off in turn and requires its gate to
// fail: proof that the gate tests would notice the guard being deleted.
func TestMutationProof(t *testing.T) {
	covered := map[string]bool{}
	for _, g := range guardGates {
		name := g.guard
		if covered[name] {
			name += "_second_gate"
		}
		covered[g.guard] = true
		t.Run(name, func(t *testing.T) {
			v := g.scenario(t, g.guard)
			if len(v) == 0 {
				t.Fatalf("with the %s guard off, its gate still passes", g.guard)
			}
			t.Logf("with the %s guard off the gate fails with:\n- %s", g.guard, strings.Join(v, "\n- "))
		})
	}
	for _, g := range faults.AllGuards {
		if !covered[g] {
			t.Errorf("guard %s has no gate scenario", g)
		}
	}
}
