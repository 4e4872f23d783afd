package router

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
)

// tripping streams: each attempt (in the order the router makes them)
// sends its tokens, then either the guard's spec_anomaly or a normal end,
// with that attempt's speculation counts.
type tripping struct {
	mu       sync.Mutex
	attempts [][]int32 // tokens of each attempt
	trips    []bool    // whether each attempt ends with spec_anomaly
	next     int
}

func (tr *tripping) stream(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
	<-rm.committed
	tr.mu.Lock()
	i := tr.next
	tr.next++
	tr.mu.Unlock()
	for _, id := range tr.attempts[i] {
		if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: id}}); err != nil {
			return err
		}
	}
	last := &pdv1.TokenEvent{Finish: request.FinishLength, SpecDraftTokens: 10, SpecAcceptedTokens: 4, SpecVerifySteps: 5}
	if tr.trips[i] {
		last.Finish, last.Error, last.Code = request.FinishSpecAnomaly, "spec_anomaly: accept rate 1.000 above 0.960", 503
	}
	return srv.Send(last)
}

func reserved(c *cluster) []*pdv1.ReserveRequest {
	var all []*pdv1.ReserveRequest
	for _, d := range c.decode {
		d.mu.Lock()
		all = append(all, d.reserves...)
		d.mu.Unlock()
	}
	return all
}

// A request decode's spec guard stopped goes on on the other pair, with
// the tokens the client took joined to its prompt and taken off
// max_tokens and min_tokens: the client reads one stream without repeats
// and the figures of both attempts. With one decode worker, or on a
// second trip, the client gets an error after the tokens it has, and
// nothing else.
func TestSpecAnomalyContinuesOnAnotherPair(t *testing.T) {
	for _, tc := range []struct {
		name     string
		decodes  int
		attempts [][]int32
		trips    []bool
		want     []int32
		ok       bool
	}{
		{"continued", 2, [][]int32{{10, 11, 12}, {13, 14}}, []bool{true, false}, []int32{10, 11, 12, 13, 14}, true},
		{"one decode worker", 1, [][]int32{{10, 11, 12}}, []bool{true}, []int32{10, 11, 12}, false},
		{"second trip", 2, [][]int32{{10, 11, 12}, {13}}, []bool{true, true}, []int32{10, 11, 12, 13}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2, tc.decodes, nil)
			c.refresh()
			done := leakCheck(t)
			tr := &tripping{attempts: tc.attempts, trips: tc.trips}
			for _, d := range c.decode {
				d.streamFn = tr.stream
			}
			st, err := c.generate("loop", 4, request.Params{MaxTokens: 8, MinTokens: 4, PromptLogprobs: true})
			if err != nil {
				t.Fatal(err)
			}
			toks, last := readAll(t, st)
			if !slices.Equal(toks, tc.want) {
				t.Fatalf("tokens %v, want %v", toks, tc.want)
			}
			res := reserved(c)
			if tc.ok {
				if last.Finish != request.FinishLength || last.Spec == nil || *last.Spec != (request.SpecCounts{Drafted: 20, Accepted: 8, Steps: 10}) {
					t.Fatalf("last event %+v, counts %+v", last, last.Spec)
				}
				if len(res) != 2 {
					t.Fatalf("%d reservations", len(res))
				}
				r := res[1]
				if fmt.Sprint(r.Prompt) != "[1 2 3 4 10 11 12]" || r.Sampling.MaxTokens != 5 || r.Sampling.MinTokens != 1 || r.Sampling.PromptLogprobs {
					t.Fatalf("retry reserved prompt %v, max_tokens %d, min_tokens %d, prompt logprobs %v", r.Prompt, r.Sampling.MaxTokens, r.Sampling.MinTokens, r.Sampling.PromptLogprobs)
				}
				if c.decode[0].count("Reserve") != 1 || c.decode[1].count("Reserve") != 1 {
					t.Fatalf("reservations per decode worker: %d, %d", c.decode[0].count("Reserve"), c.decode[1].count("Reserve"))
				}
			} else {
				var e *Error
				if last.Finish != request.FinishError || !errors.As(last.Err, &e) || e.Status != 502 || e.Message != msgAnomaly {
					t.Fatalf("last event %+v", last)
				}
				if len(res) != tc.decodes {
					t.Fatalf("%d reservations on %d decode workers", len(res), tc.decodes)
				}
			}
			if n := value(c.r.rm.retries.WithLabelValues("spec_anomaly")); n != float64(len(res)-1) {
				t.Errorf("spec_anomaly retries %v", n)
			}
			for _, d := range c.decode {
				if d.count("Abort") != 0 {
					t.Errorf("decode told to abort a request its guard ended")
				}
			}
			done()
		})
	}
}
