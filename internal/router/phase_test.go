package router

import (
	"context"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
)

// trailOf is a finished request's moves, read once run has returned.
func trailOf(t *testing.T, c *cluster, s *stream) []phase {
	t.Helper()
	eventually(t, "the request to end", func() bool { return c.r.InFlight() == 0 })
	return s.trail
}

// A request's phases follow its way through the router: a plain one is
// reserved, relayed, streamed and done; one whose first attempt fails
// before a token goes back to picking and through again; one the caller
// leaves ends cancelled.
func TestPhaseTrails(t *testing.T) {
	plain := []phase{phaseReserved, phaseRelaying, phaseStreaming, phaseDone}
	t.Run("plain", func(t *testing.T) {
		c := newCluster(t, 1, 1, nil)
		c.refresh()
		st, err := c.generate("plain", 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, st)
		if got := trailOf(t, c, st); !slices.Equal(got, plain) {
			t.Errorf("phases %v, want %v", got, plain)
		}
	})
	t.Run("retried", func(t *testing.T) {
		c := newCluster(t, 2, 2, nil)
		c.refresh()
		c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
			return status.Error(codes.Unavailable, "worker went away")
		}
		st, err := c.generate("retried", 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, st)
		got := trailOf(t, c, st)
		want := append([]phase{phaseReserved, phaseRelaying, phasePicking}, plain...)
		if !slices.Equal(got, want) {
			t.Errorf("phases %v, want %v", got, want)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		c := newCluster(t, 1, 1, nil)
		c.refresh()
		st, err := c.generate("left", 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		if ev, ok := st.Next(context.Background()); !ok || ev.Token == nil {
			t.Fatal("no first token")
		}
		st.Cancel()
		got := trailOf(t, c, st)
		if len(got) == 0 || got[len(got)-1] != phaseCancelled || !slices.Contains(got, phaseStreaming) {
			t.Errorf("phases %v, want a streamed request ending cancelled", got)
		}
	})
	t.Run("refused", func(t *testing.T) {
		c := newCluster(t, 1, 1, nil)
		c.refresh()
		c.decode[0].reserveErr = func() error { return status.Error(codes.InvalidArgument, "prompt too long") }
		if _, err := c.generate("refused", 4, request.Params{}); err == nil {
			t.Fatal("decode's refusal did not reach the caller")
		}
		eventually(t, "the request to end", func() bool { return c.r.InFlight() == 0 })
		if logs := c.logs.String(); !strings.Contains(logs, "phases=picking") || !strings.Contains(logs, "picking > failed") {
			t.Errorf("the failed request's log does not give its phases:\n%s", logs)
		}
	})
}

// Every move the table does not list is refused by may.
func TestPhaseMoves(t *testing.T) {
	for from := phasePicking; from <= phaseCancelled; from++ {
		for to := phasePicking; to <= phaseCancelled; to++ {
			if from.terminal() && from.may(to) {
				t.Errorf("%s is terminal but may move to %s", from, to)
			}
		}
	}
	for _, bad := range [][2]phase{{phaseQueued, phaseReserved}, {phaseReserved, phaseStreaming}, {phasePicking, phaseStreaming}, {phaseDone, phasePicking}} {
		if bad[0].may(bad[1]) {
			t.Errorf("%s may move to %s", bad[0], bad[1])
		}
	}
}
