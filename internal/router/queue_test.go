package router

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
)

func gauge(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}

// oneAtATime makes c's only decode worker hold one reservation at most,
// as a pool that one request fills: a second Reserve is refused for want
// of room until the first request ended on decode.
func oneAtATime(c *cluster) {
	var live atomic.Int64
	d := c.decode[0]
	d.reserveErr = func() error {
		if !live.CompareAndSwap(0, 1) {
			return status.Error(codes.ResourceExhausted, "no room for 20 tokens in the KV pool now; retry later")
		}
		return nil
	}
	holdAfterOne(c)
	held := d.streamFn
	d.streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		defer live.Store(0) // the room is free once decode ended the stream
		return held(rm, srv)
	}
}

// A request that finds the only decode worker full waits in the router's
// queue and runs when the request holding the pool ends, instead of being
// refused; the queue is counted while it waits.
func TestQueueWaitsForRoom(t *testing.T) {
	c := newCluster(t, 1, 1, nil)
	c.refresh()
	c.warm()
	done := leakCheck(t)
	oneAtATime(c)
	first, err := c.generate("first", 4, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	if ev, ok := first.Next(context.Background()); !ok || ev.Token == nil {
		t.Fatal("no first token")
	}
	type result struct {
		st  *stream
		err error
	}
	second := make(chan result, 1)
	go func() {
		st, err := c.generate("second", 4, request.Params{})
		second <- result{st, err}
	}()
	eventually(t, "the second request to queue", func() bool { return gauge(c.m.Queued) == 1 })
	select {
	case r := <-second:
		t.Fatalf("the second request did not wait: %v", r.err)
	default:
	}
	first.Stop() // decode ends the stream after Finish, which frees the room
	r := <-second
	if r.err != nil {
		t.Fatalf("the queued request was refused: %v", r.err)
	}
	r.st.Stop()
	eventually(t, "both requests to end", func() bool { return c.r.InFlight() == 0 })
	if n := value(c.m.QueuedTotal); n != 1 {
		t.Errorf("baton_requests_queued_total = %v, want 1", n)
	}
	if q := gauge(c.m.Queued); q != 0 {
		t.Errorf("baton_num_queue_reqs = %v after the queue emptied", q)
	}
	if got := reservedBy(c.decode); len(got[0]) < 3 || got[0][len(got[0])-1] != "second" {
		t.Errorf("reservations %v", got)
	}
	done()
}

// The queue is bounded: beyond --max-queued-requests a request gets 429
// with Retry-After at once, and a queued request that finds no room
// within the queue timeout gets 429 too.
func TestQueueFullAndTimeout(t *testing.T) {
	c := newCluster(t, 1, 1, func(o *Options) { o.MaxQueued, o.QueueTimeout = 1, 300*time.Millisecond })
	c.refresh()
	c.decode[0].reserveErr = func() error { return status.Error(codes.ResourceExhausted, "no room") }
	waiting := make(chan error, 1)
	go func() {
		_, err := c.generate("waits", 4, request.Params{})
		waiting <- err
	}()
	eventually(t, "the first request to queue", func() bool { return gauge(c.m.Queued) == 1 })
	_, err := c.generate("turned-away", 4, request.Params{})
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Status != 429 || rej.RetryAfter < 1 || rej.Reason != "queue_full" {
		t.Fatalf("past a full queue: %v, want 429 queue_full with Retry-After", err)
	}
	err = <-waiting
	if !errors.As(err, &rej) || rej.Status != 429 || rej.RetryAfter < 1 || rej.Reason != "queue_timeout" {
		t.Fatalf("after the queue timeout: %v, want 429 queue_timeout with Retry-After", err)
	}
	for _, reason := range []string{"queue_full", "queue_timeout"} {
		if n := value(c.m.Rejected.WithLabelValues("router", reason)); n != 1 {
			t.Errorf("rejected{reason=%s} = %v", reason, n)
		}
	}
	if q := gauge(c.m.Queued); q != 0 {
		t.Errorf("baton_num_queue_reqs = %v", q)
	}
}

// A client that leaves while its request waits in the queue takes it out,
// and no worker hears of it again.
func TestQueuedClientLeaves(t *testing.T) {
	c := newCluster(t, 1, 1, nil)
	c.refresh()
	c.warm()
	done := leakCheck(t)
	c.decode[0].reserveErr = func() error { return status.Error(codes.ResourceExhausted, "no room") }
	prefills := c.prefill[0].work()
	ctx, leave := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := c.r.GenerateContext(ctx, "leaver", []int32{1, 2, 3, 4}, request.Params{})
		errc <- err
	}()
	eventually(t, "the request to queue", func() bool { return gauge(c.m.Queued) == 1 })
	leave()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Generate: %v", err)
	}
	eventually(t, "the queue to empty", func() bool { return gauge(c.m.Queued) == 0 && c.r.InFlight() == 0 })
	if n := c.decode[0].count("Abort") + c.prefill[0].work() - prefills; n != 0 {
		t.Errorf("%d calls about a request that never held a reservation", n)
	}
	done()
	if n := value(c.m.Requests.WithLabelValues("router", "aborted")); n != 1 {
		t.Errorf("aborted outcomes %v", n)
	}
}

// A queued request tries every decode worker when its turn comes, and
// takes the first with room; looking for room while queued is not counted
// as retries.
func TestQueuedRequestTriesEveryDecode(t *testing.T) {
	c := newCluster(t, 1, 2, nil)
	c.refresh()
	var free atomic.Bool
	c.decode[0].reserveErr = func() error { return status.Error(codes.ResourceExhausted, "no room") }
	c.decode[1].reserveErr = func() error {
		if !free.Load() {
			return status.Error(codes.ResourceExhausted, "no room")
		}
		return nil
	}
	got := make(chan error, 1)
	go func() {
		st, err := c.generate("patient", 4, request.Params{})
		if err == nil {
			readAll(t, st)
		}
		got <- err
	}()
	eventually(t, "the request to queue and poll both workers", func() bool {
		return gauge(c.m.Queued) == 1 && c.decode[0].count("Reserve") >= 3 && c.decode[1].count("Reserve") >= 3
	})
	free.Store(true)
	c.r.queue.kick()
	if err := <-got; err != nil {
		t.Fatalf("the queued request: %v", err)
	}
	if n := value(c.r.rm.retries.WithLabelValues("reserve")); n != 1 {
		t.Errorf("retries{stage=reserve} = %v, want 1 (the first pass, before the queue)", n)
	}
}

// Decode refusing the router's share of its pool is worth waiting for
// only while the router holds other reservations there: alone, the request
// is over the share for good, and gets its 429 at once.
func TestOverTheShareAloneIsNotQueued(t *testing.T) {
	c := newCluster(t, 1, 1, nil)
	c.refresh()
	c.decode[0].reserveErr = func() error {
		return status.Error(codes.ResourceExhausted, "too many reservations held by this caller")
	}
	_, err := c.generate("greedy", 4, request.Params{})
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Status != 429 || rej.Reason != "decode_full" {
		t.Fatalf("got %v, want 429 decode_full at once", err)
	}
	if n := value(c.m.QueuedTotal); n != 0 {
		t.Errorf("queued %v times", n)
	}
}
