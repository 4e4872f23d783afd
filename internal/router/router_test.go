package router

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
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

// reservedBy lists the request ids each fake decode reserved for.
func reservedBy(fs []*fake) [][]string {
	out := make([][]string, len(fs))
	for i, f := range fs {
		f.mu.Lock()
		for _, r := range f.reserves {
			out[i] = append(out[i], r.RequestId)
		}
		f.mu.Unlock()
	}
	return out
}

func prefilledBy(fs []*fake) [][]string {
	out := make([][]string, len(fs))
	for i, f := range fs {
		f.mu.Lock()
		for _, r := range f.prefills {
			out[i] = append(out[i], r.RequestId)
		}
		f.mu.Unlock()
	}
	return out
}

// value reads a counter (prometheus/testutil would need a module this
// repository does not require).
func value(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// leakCheck returns a function that fails the test unless the number of
// goroutines settles back to what it is now.
func leakCheck(t *testing.T) func() {
	t.Helper()
	base := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("goroutines: %d now, %d before\n%s", runtime.NumGoroutine(), base, buf[:n])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// warm runs one request so that connections and their goroutines exist
// before a leak baseline is taken.
func (c *cluster) warm() {
	c.t.Helper()
	st, err := c.generate("warm", 4, request.Params{})
	if err != nil {
		c.t.Fatal(err)
	}
	readAll(c.t, st)
}

func TestRoundRobinAndRelay(t *testing.T) {
	c := newCluster(t, 2, 2, nil)
	c.refresh()
	if !c.r.Ready() {
		t.Fatalf("not ready: %+v", c.r.Workers())
	}
	for i := range 4 {
		id := fmt.Sprintf("req-%d", i)
		st, err := c.generate(id, 5, request.Params{MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		first, ok := st.Next(ctx)
		cancel()
		if !ok || first.Token == nil {
			t.Fatalf("no first token: %+v", first)
		}
		if first.Token.ID != 100 || first.Token.Logprob != -0.5 || len(first.Token.Top) != 2 || first.Token.Top[1].ID != 7 || first.Token.Top[1].Logprob != -2 {
			t.Fatalf("token not converted: %+v", first.Token)
		}
		toks, last := readAll(t, st)
		if fmt.Sprint(toks) != "[101 102]" || last.Finish != request.FinishLength || last.Err != nil {
			t.Fatalf("rest %v, last %+v", toks, last)
		}
	}
	if got, want := fmt.Sprint(reservedBy(c.decode)), "[[req-0 req-2] [req-1 req-3]]"; got != want {
		t.Errorf("decode choices %s, want %s", got, want)
	}
	if got, want := fmt.Sprint(prefilledBy(c.prefill)), "[[req-0 req-2] [req-1 req-3]]"; got != want {
		t.Errorf("prefill choices %s, want %s", got, want)
	}
	// One request id, in the messages and as metadata on every call.
	for _, f := range append(append([]*fake(nil), c.prefill...), c.decode...) {
		f.mu.Lock()
		for i, id := range f.ids {
			if !strings.HasPrefix(id, "req-") {
				t.Errorf("%s call %d carried x-request-id %q", f.role, i, id)
			}
		}
		f.mu.Unlock()
	}
	d := c.decode[0]
	d.mu.Lock()
	r := d.reserves[0]
	if r.Writer != c.prefill[0].grpcAddr || r.Layout.GetPageSize() != 16 || r.Sampling.GetMaxTokens() != 3 || len(r.Prompt) != 5 {
		t.Errorf("reserve request %v", r)
	}
	d.mu.Unlock()
	p := c.prefill[0]
	p.mu.Lock()
	if pr := p.prefills[0]; pr.Reservation.GetRoom() != d.resv[0].Room || pr.Reservation.GetEpoch() != d.resv[0].Epoch {
		t.Errorf("prefill got reservation %v, decode made %v", pr.Reservation, d.resv[0])
	}
	p.mu.Unlock()
	// The outcome is counted just after the last event is handed over.
	eventually(t, "4 finished outcomes", func() bool { return value(c.m.Requests.WithLabelValues("router", "finished")) == 4 })
	var h dto.Metric
	if err := c.m.TTFT.Write(&h); err != nil || h.GetHistogram().GetSampleCount() != 4 {
		t.Errorf("TTFT samples %d, want 4 (%v)", h.GetHistogram().GetSampleCount(), err)
	}
}

func TestLeastLoad(t *testing.T) {
	c := newCluster(t, 3, 3, func(o *Options) { o.Policy = PolicyLeastLoad })
	for i, l := range [][2]uint32{{3, 2}, {1, 0}, {2, 0}} { // running, queued
		c.prefill[i].setInfo(func(w *pdv1.WorkerInfo) { w.Running, w.Queued = l[0], l[1] })
	}
	for i, l := range [][2]uint32{{10, 0}, {50, 5}, {50, 2}} { // free pages, running
		c.decode[i].setInfo(func(w *pdv1.WorkerInfo) { w.FreePages, w.Running = l[0], l[1] })
	}
	c.refresh()
	st, err := c.generate("a", 20, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, st)
	if got := fmt.Sprint(reservedBy(c.decode)); got != "[[] [] [a]]" {
		t.Errorf("decode choice %s: want the most free pages, ties by fewest running", got)
	}
	if got := fmt.Sprint(prefilledBy(c.prefill)); got != "[[] [a] []]" {
		t.Errorf("prefill choice %s: want the fewest running+queued", got)
	}
	// The first request's 2 pages count against decode 2 until the next
	// probe, so a burst does not pile onto one worker.
	st, err = c.generate("b", 20, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, st)
	if got := fmt.Sprint(reservedBy(c.decode)); got != "[[] [b] [a]]" {
		t.Errorf("second decode choice %s", got)
	}
}

func TestCapacityGateTouchesNoWorker(t *testing.T) {
	c := newCluster(t, 1, 2, nil)
	c.prefill[0].setInfo(func(w *pdv1.WorkerInfo) { w.MaxSequenceTokens = 100 })
	c.decode[0].setInfo(func(w *pdv1.WorkerInfo) { w.MaxSequenceTokens = 80 })
	c.decode[1].setInfo(func(w *pdv1.WorkerInfo) { w.MaxSequenceTokens = 200 })
	c.refresh()
	if mp, ms := c.r.Capacity(); mp != 79 || ms != 80 {
		t.Errorf("Capacity %d, %d; want 79, 80", mp, ms)
	}
	for _, tc := range []struct {
		prompt, maxTokens int
		want              []string
	}{
		{80, 0, []string{"80 tokens", "prefill 100", "decode 80", "no room to generate"}},
		{500, 0, []string{"500 tokens"}},
		{50, 31, []string{"81 tokens", "50 in the prompt", "31 for the completion"}},
	} {
		_, err := c.generate("long", tc.prompt, request.Params{MaxTokens: tc.maxTokens})
		var rej *request.RejectError
		if !errors.As(err, &rej) || rej.Status != 400 || rej.Reason != "too_long" {
			t.Fatalf("prompt %d max %d: %v, want a 400 too_long", tc.prompt, tc.maxTokens, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(rej.Message, w) {
				t.Errorf("message %q lacks %q", rej.Message, w)
			}
		}
	}
	if _, err := c.generate("empty", 0, request.Params{}); err == nil {
		t.Error("empty prompt accepted")
	}
	for _, f := range append(append([]*fake(nil), c.prefill...), c.decode...) {
		if n := f.work(); n != 0 {
			t.Errorf("%s worker got %d calls for rejected requests", f.role, n)
		}
	}
	if n := value(c.m.Rejected.WithLabelValues("router", "too_long")); n != 3 {
		t.Errorf("too_long rejections %v, want 3", n)
	}
	// What fits goes through.
	for _, tc := range [][2]int{{79, 0}, {50, 30}} {
		st, err := c.generate("fits", tc[0], request.Params{MaxTokens: tc[1]})
		if err != nil {
			t.Fatalf("prompt %d max %d: %v", tc[0], tc[1], err)
		}
		readAll(t, st)
	}
}

func TestNoHealthyWorkers(t *testing.T) {
	c := newCluster(t, 1, 1, nil)
	c.prefill[0].health.Store(http.StatusServiceUnavailable)
	c.refresh()
	if c.r.Ready() {
		t.Fatal("ready without a healthy prefill worker")
	}
	_, err := c.generate("x", 4, request.Params{})
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Status != 503 || rej.Reason != "no_workers" || rej.RetryAfter != 1 {
		t.Fatalf("got %v, want a 503 no_workers with Retry-After", err)
	}
	if !strings.Contains(rej.Message, "prefill") {
		t.Errorf("message %q does not say which role is missing", rej.Message)
	}
	if c.decode[0].work() != 0 {
		t.Error("decode was contacted")
	}
	if mp, ms := c.r.Capacity(); mp != 0 || ms != 0 {
		t.Errorf("Capacity %d, %d without workers", mp, ms)
	}
}

func TestUnhealthyWorkerSkippedAndRecovered(t *testing.T) {
	c := newCluster(t, 1, 2, func(o *Options) { o.HealthInterval = 20 * time.Millisecond })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c.r.Start(ctx)
	if !c.r.Ready() {
		t.Fatal("not ready after Start")
	}
	healthy := func(f *fake) func() bool {
		return func() bool {
			for _, w := range c.r.Workers() {
				if w.URL == f.url() {
					return w.Healthy
				}
			}
			return false
		}
	}
	sick := c.decode[0]
	run := func(n int, prefix string) {
		t.Helper()
		for i := range n {
			st, err := c.generate(fmt.Sprintf("%s-%d", prefix, i), 4, request.Params{})
			if err != nil {
				t.Fatal(err)
			}
			if _, last := readAll(t, st); last.Finish != request.FinishLength {
				t.Fatalf("%s-%d: %+v", prefix, i, last)
			}
		}
	}

	// /health 503: skipped.
	sick.health.Store(http.StatusServiceUnavailable)
	eventually(t, "decode 0 unhealthy", func() bool { return !healthy(sick)() })
	before := sick.count("Reserve")
	run(3, "h503")
	if sick.count("Reserve") != before {
		t.Error("a worker answering /health 503 got requests")
	}
	sick.health.Store(http.StatusOK)
	eventually(t, "decode 0 healthy", healthy(sick))
	run(2, "back")
	if sick.count("Reserve") == before {
		t.Error("a recovered worker got no requests")
	}

	// Killed: skipped; restarted on the same URL with a new gRPC port:
	// picked up again on the new port.
	oldGRPC := sick.grpcAddr
	sick.stop()
	eventually(t, "killed decode 0 unhealthy", func() bool { return !healthy(sick)() })
	run(3, "dead")
	sick.startGRPC()
	sick.startHTTP(strings.TrimPrefix(sick.url(), "http://"))
	if sick.grpcAddr == oldGRPC {
		t.Fatal("test setup: the restarted worker kept its gRPC port")
	}
	eventually(t, "restarted decode 0 healthy", healthy(sick))
	for _, w := range c.r.Workers() {
		if w.URL == sick.url() && w.GRPCAddr != sick.grpcAddr {
			t.Errorf("router dials %s, the worker now listens on %s", w.GRPCAddr, sick.grpcAddr)
		}
	}
	// The restarted process's counters start over: any Reserve it records
	// came through the new address.
	sick.mu.Lock()
	sick.calls = map[string]int{}
	sick.mu.Unlock()
	run(2, "restarted")
	if sick.count("Reserve") == 0 {
		t.Error("the restarted worker got no requests")
	}

	// Without any healthy prefill worker the router is not ready.
	c.prefill[0].stop()
	eventually(t, "not ready", func() bool { return !c.r.Ready() })
	c.r.Close()
	c.r.Close()
}

func TestLayoutMismatchRefused(t *testing.T) {
	c := newCluster(t, 1, 2, nil)
	c.decode[0].setInfo(func(w *pdv1.WorkerInfo) { w.Layout.PageSize = 32 })
	c.refresh()
	if !c.r.Ready() {
		t.Fatal("one compatible pair should make the router ready")
	}
	logs := c.logs.String()
	if !strings.Contains(logs, "page_size (prefill 16, decode 32)") || !strings.Contains(logs, c.decode[0].url()) {
		t.Errorf("the refusal does not name the field and the worker:\n%s", logs)
	}
	c.refresh()
	if n := strings.Count(c.logs.String(), "refusing prefill/decode pair"); n != 1 {
		t.Errorf("refusal logged %d times over two probes, want once", n)
	}
	for i := range 3 {
		st, err := c.generate(fmt.Sprintf("r%d", i), 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, st)
	}
	if n := c.decode[0].work(); n != 0 {
		t.Errorf("the mismatched decode worker got %d calls", n)
	}
	c.decode[1].setInfo(func(w *pdv1.WorkerInfo) { w.Layout.Dtype = "f16" })
	c.refresh()
	if c.r.Ready() {
		t.Fatal("ready with no compatible pair")
	}
	_, err := c.generate("none", 4, request.Params{})
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Status != 503 || !strings.Contains(rej.Message, "KV layout") {
		t.Fatalf("got %v, want a 503 naming the layout", err)
	}
}

func TestLayoutDiff(t *testing.T) {
	for _, tc := range []struct {
		field string
		edit  func(*pdv1.KVLayout)
	}{
		{"model", func(l *pdv1.KVLayout) { l.Model = "other" }},
		{"page_size", func(l *pdv1.KVLayout) { l.PageSize = 8 }},
		{"dtype", func(l *pdv1.KVLayout) { l.Dtype = "f16" }},
		{"layers", func(l *pdv1.KVLayout) { l.Layers = 3 }},
		{"kv_heads", func(l *pdv1.KVLayout) { l.KvHeads = 4 }},
		{"head_dim", func(l *pdv1.KVLayout) { l.HeadDim = 16 }},
	} {
		d := testLayout()
		tc.edit(d)
		if got := pdv1.LayoutDiff(testLayout(), d, "prefill", "decode"); !strings.HasPrefix(got, tc.field+" (") {
			t.Errorf("%s: diff %q", tc.field, got)
		}
	}
	if got := pdv1.LayoutDiff(testLayout(), testLayout(), "prefill", "decode"); got != "" {
		t.Errorf("equal layouts differ: %q", got)
	}
	if got := pdv1.LayoutDiff(testLayout(), nil, "prefill", "decode"); got == "" {
		t.Error("a missing layout passed")
	}
}

func TestRetryBeforeFirstToken(t *testing.T) {
	unavailable := status.Error(codes.Unavailable, "worker went away")
	for _, tc := range []struct {
		name, stage string
		setup       func(c *cluster)
		cancels     bool // the first reservation must be cancelled
	}{
		{"prefill unavailable", "prefill", func(c *cluster) {
			c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error { return unavailable }
		}, true},
		{"stream broke", "stream", func(c *cluster) {
			c.decode[0].streamFn = func(*fakeRoom, grpc.ServerStreamingServer[pdv1.TokenEvent]) error { return unavailable }
		}, true},
		{"decode error event", "decode", func(c *cluster) {
			c.decode[0].streamFn = func(_ *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				return srv.Send(&pdv1.TokenEvent{Error: "commit checksum mismatch", Code: 502})
			}
		}, true},
		{"reserve exhausted", "reserve", func(c *cluster) {
			c.decode[0].reserveErr = func() error { return status.Error(codes.ResourceExhausted, "pool full") }
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 2, 2, nil)
			c.refresh()
			done := leakCheck(t)
			tc.setup(c)
			st, err := c.generate("retry-me", 4, request.Params{})
			if err != nil {
				t.Fatal(err)
			}
			toks, last := readAll(t, st)
			if len(toks) != 3 || last.Finish != request.FinishLength {
				t.Fatalf("got %v %+v", toks, last)
			}
			if c.decode[0].count("Reserve") != 1 || fmt.Sprint(reservedBy(c.decode[1:])) != "[[retry-me]]" {
				t.Errorf("reservations %v: want one try on each decode worker", reservedBy(c.decode))
			}
			d0 := c.decode[0]
			d0.mu.Lock()
			if tc.cancels {
				if len(d0.aborts) != 1 || len(d0.resv) != 1 || d0.aborts[0].Room != d0.resv[0].Room || d0.aborts[0].Epoch != d0.resv[0].Epoch {
					t.Errorf("aborts %v for reservations %v", d0.aborts, d0.resv)
				}
			} else if len(d0.aborts) != 0 {
				t.Errorf("aborted %v though nothing was reserved", d0.aborts)
			}
			d0.mu.Unlock()
			if tc.stage == "prefill" {
				if got := fmt.Sprint(prefilledBy(c.prefill)); got != "[[retry-me] [retry-me]]" {
					t.Errorf("prefills %s: the retry should go to the other prefill worker", got)
				}
			}
			if n := value(c.r.rm.retries.WithLabelValues(tc.stage)); n != 1 {
				t.Errorf("retries{stage=%s} = %v", tc.stage, n)
			}
			done()
		})
	}
}

func TestRetriesExhausted(t *testing.T) {
	c := newCluster(t, 2, 2, nil)
	c.refresh()
	for _, p := range c.prefill {
		p.prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
			return status.Error(codes.Unavailable, "down")
		}
	}
	// Nothing reached the client: the answer is a status that says to
	// retry, not a 200 whose stream holds only an error.
	_, err := c.generate("doomed", 4, request.Params{})
	var rej *request.RejectError
	if !errors.As(err, &rej) || rej.Status != 503 || rej.RetryAfter < 1 || rej.Reason != "workers_unavailable" {
		t.Fatalf("got %v, want a 503 with Retry-After", err)
	}
	if n := c.decode[0].count("Reserve") + c.decode[1].count("Reserve"); n != 3 {
		t.Errorf("%d reservations, want 3 (one try and 2 retries)", n)
	}
	if n := c.decode[0].count("Abort") + c.decode[1].count("Abort"); n != 3 {
		t.Errorf("%d reservations aborted, want 3", n)
	}
}

// With migrations off (--max-migrations 0), a stream that breaks after
// its first token ends with an error after the tokens the client has, and
// is not tried again.
func TestNoRetryAfterFirstToken(t *testing.T) {
	c := newCluster(t, 2, 2, func(o *Options) { o.MaxMigrations = -1 })
	c.refresh()
	c.warm()
	done := leakCheck(t)
	for _, d := range c.decode {
		d.streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
			<-rm.committed
			if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: 42}}); err != nil {
				return err
			}
			return status.Error(codes.Unavailable, "decode died")
		}
	}
	st, err := c.generate("once", 4, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	toks, last := readAll(t, st)
	var e *Error
	if fmt.Sprint(toks) != "[42]" || last.Finish != request.FinishError || !errors.As(last.Err, &e) || e.Status != 502 {
		t.Fatalf("tokens %v, last %+v", toks, last)
	}
	if n := c.decode[0].count("Reserve") + c.decode[1].count("Reserve"); n != 2 { // warm-up and this one
		t.Errorf("%d reservations: a failure after the first token must not be retried", n)
	}
	if n := value(c.r.rm.retries.WithLabelValues("stream")); n != 0 {
		t.Errorf("retried %v times", n)
	}
	done()
}

func TestNonRetryableFailures(t *testing.T) {
	t.Run("prefill rejects at its door", func(t *testing.T) {
		c := newCluster(t, 2, 2, nil)
		c.refresh()
		for _, p := range c.prefill {
			p.prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
				return status.Error(codes.InvalidArgument, "token id 9999 is outside the vocabulary (0..511)")
			}
		}
		_, err := c.generate("bad", 4, request.Params{})
		var rej *request.RejectError
		if !errors.As(err, &rej) || rej.Status != 400 || rej.Message != "token id 9999 is outside the vocabulary (0..511)" {
			t.Fatalf("got %v", err)
		}
		if n := c.decode[0].count("Reserve") + c.decode[1].count("Reserve"); n != 1 {
			t.Errorf("%d reservations for a request prefill refused", n)
		}
		if n := c.decode[0].count("Abort"); n != 1 {
			t.Errorf("reservation aborted %d times", n)
		}
	})
	t.Run("layout refused by prefill", func(t *testing.T) {
		c := newCluster(t, 2, 2, nil)
		c.refresh()
		c.prefill[0].prefillFn = func(context.Context, *pdv1.PrefillRequest) error {
			return status.Error(codes.FailedPrecondition, "layout mismatch: page_size")
		}
		_, err := c.generate("bad", 4, request.Params{})
		var e *Error
		if !errors.As(err, &e) || e.Status != 500 || e.Message != msgMisconfig {
			t.Fatalf("got %v", err)
		}
		// What differs is for the operator, under the request id.
		if logs := c.logs.String(); !strings.Contains(logs, "layout mismatch: page_size") || !strings.Contains(logs, "request_id=bad") {
			t.Fatalf("the detail is not logged: %s", logs)
		}
	})
	t.Run("decode rejects at its door", func(t *testing.T) {
		c := newCluster(t, 1, 2, nil)
		c.refresh()
		for _, d := range c.decode {
			d.reserveErr = func() error { return status.Error(codes.InvalidArgument, "prompt exceeds the pool") }
		}
		_, err := c.generate("bad", 4, request.Params{})
		var rej *request.RejectError
		if !errors.As(err, &rej) || rej.Status != 400 || rej.Message != "prompt exceeds the pool" {
			t.Fatalf("got %v", err)
		}
		if n := c.decode[0].count("Reserve") + c.decode[1].count("Reserve"); n != 1 {
			t.Errorf("%d reservations", n)
		}
		if c.prefill[0].work() != 0 {
			t.Error("prefill was contacted")
		}
	})
	t.Run("every decode full, no queue", func(t *testing.T) {
		c := newCluster(t, 1, 2, func(o *Options) { o.MaxQueued = -1 })
		c.refresh()
		for _, d := range c.decode {
			d.reserveErr = func() error { return status.Error(codes.ResourceExhausted, "no free pages") }
		}
		_, err := c.generate("full", 4, request.Params{})
		var rej *request.RejectError
		if !errors.As(err, &rej) || rej.Status != 429 || rej.RetryAfter != 1 {
			t.Fatalf("got %v", err)
		}
		if n := c.decode[0].count("Reserve") + c.decode[1].count("Reserve"); n != 3 {
			t.Errorf("%d reservations, want 3", n)
		}
	})
}

// holdAfterOne makes decode streams send one token and then wait until the
// request is ended by the router.
func holdAfterOne(c *cluster) {
	for _, d := range c.decode {
		d.streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
			select {
			case <-rm.committed:
			case <-srv.Context().Done():
				return nil
			}
			if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: 1}}); err != nil {
				return err
			}
			select {
			case <-rm.ended:
			case <-srv.Context().Done():
				return nil
			}
			// Like decode: the last event follows Finish or Abort, after the
			// engine got round to it. A router that cut the stream instead
			// of waiting for it is seen here.
			time.Sleep(50 * time.Millisecond)
			if srv.Context().Err() != nil {
				return nil
			}
			if err := srv.Send(&pdv1.TokenEvent{Finish: request.FinishStop}); err != nil {
				return err
			}
			rm.closedClean.Store(true)
			return nil
		}
	}
}

// heldAfterFirstToken starts request id on a warm 1x1 cluster whose
// decode worker sends one token and then holds the stream; it returns the
// cluster, the stream past its first token, and the leak check to end with.
func heldAfterFirstToken(t *testing.T, id string) (*cluster, *stream, func()) {
	t.Helper()
	c := newCluster(t, 1, 1, nil)
	c.refresh()
	c.warm()
	done := leakCheck(t)
	holdAfterOne(c)
	st, err := c.generate(id, 4, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ev, ok := st.Next(ctx); !ok || ev.Token == nil {
		t.Fatal("no first token")
	}
	return c, st, done
}

func TestCancelAbortsOnDecode(t *testing.T) {
	t.Run("after the first token", func(t *testing.T) {
		c, st, done := heldAfterFirstToken(t, "leaver")
		st.Cancel()
		st.Cancel()
		d := c.decode[0]
		eventually(t, "Abort", func() bool { return d.count("Abort") == 1 })
		d.mu.Lock()
		a, res := d.aborts[0], d.resv[len(d.resv)-1]
		if a.Room != res.Room || a.Epoch != res.Epoch || a.RequestId != "leaver" || a.Reason == "" {
			t.Errorf("abort %v for reservation %v", a, res)
		}
		if id := d.ids[len(d.ids)-1]; id != "leaver" {
			t.Errorf("abort carried x-request-id %q", id)
		}
		d.mu.Unlock()
		if d.count("Finish") != 0 || c.prefill[0].count("Abort") != 0 {
			t.Error("cancel must Abort on decode only (decode tells prefill)")
		}
		done()
		if n := value(c.m.Requests.WithLabelValues("router", "aborted")); n != 1 {
			t.Errorf("aborted outcomes %v", n)
		}
	})
	t.Run("during prefill", func(t *testing.T) {
		c := newCluster(t, 1, 1, nil)
		c.refresh()
		c.warm()
		done := leakCheck(t)
		entered, left := make(chan struct{}), make(chan struct{})
		c.prefill[0].prefillFn = func(ctx context.Context, req *pdv1.PrefillRequest) error {
			close(entered)
			// Like a real prefill worker: decode's Abort reaches it (here
			// through the room), or the router's call ends.
			select {
			case <-c.decode[0].room(req.Reservation.Room).ended:
			case <-ctx.Done():
			}
			close(left)
			return status.Error(codes.Canceled, "aborted")
		}
		// The client leaves while Generate waits for the first token.
		ctx, leave := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := c.r.GenerateContext(ctx, "impatient", []int32{1, 2, 3, 4}, request.Params{})
			errc <- err
		}()
		<-entered
		d := c.decode[0]
		reserved := d.count("Reserve")
		leave()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Generate: %v", err)
		}
		eventually(t, "Abort", func() bool { return d.count("Abort") == 1 })
		d.mu.Lock()
		if a, res := d.aborts[0], d.resv[len(d.resv)-1]; a.Room != res.Room || a.Epoch != res.Epoch {
			t.Errorf("abort %v for reservation %v", a, res)
		}
		d.mu.Unlock()
		select {
		case <-left:
		case <-time.After(5 * time.Second):
			t.Fatal("the prefill call was not cancelled")
		}
		if n := d.count("Reserve"); n != reserved {
			t.Errorf("a cancelled request is aborted, not retried: %d reservations after the cancel", n-reserved)
		}
		if n := d.count("Abort"); n != 1 {
			t.Errorf("a cancelled request is aborted once: %d Abort", n)
		}
		done()
	})
}

func TestStopFinishesOnDecode(t *testing.T) {
	c, st, done := heldAfterFirstToken(t, "stopper")
	st.Stop()
	d := c.decode[0]
	eventually(t, "Finish", func() bool { return d.count("Finish") == 1 })
	d.mu.Lock()
	if f, res := d.finishes[0], d.resv[len(d.resv)-1]; f.Room != res.Room || f.Epoch != res.Epoch || f.RequestId != "stopper" {
		t.Errorf("finish %v for reservation %v", f, res)
	}
	d.mu.Unlock()
	if d.count("Abort") != 0 {
		t.Error("Stop sent Abort")
	}
	// Decode ends its own stream after Finish; cutting it first would look
	// like a vanished router and turn the clean finish into an abort.
	eventually(t, "the stream to end on decode's side", func() bool {
		d.mu.Lock()
		res := d.resv[len(d.resv)-1]
		d.mu.Unlock()
		return d.room(res.Room).closedClean.Load()
	})
	done()
}

func TestNoGoroutineLeaks(t *testing.T) {
	c := newCluster(t, 2, 2, nil)
	c.refresh()
	c.warm()
	done := leakCheck(t)
	for round := range 3 {
		// Finished.
		st, err := c.generate(fmt.Sprintf("ok-%d", round), 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, st)
		// Abandoned without reading: Cancel must still clean up.
		st, err = c.generate(fmt.Sprintf("gone-%d", round), 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		st.Cancel()
		// Stopped right away.
		st, err = c.generate(fmt.Sprintf("stop-%d", round), 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		st.Stop()
		// Rejected at the gate.
		if _, err := c.generate("long", 5000, request.Params{}); err == nil {
			t.Fatal("over-long prompt accepted")
		}
	}
	// A reader that gives up (its context ends) and then cancels, as the
	// HTTP surface does when the client leaves.
	st, err := c.generate("reader", 4, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := st.Next(ctx); ok {
		// An event may win the race against the done context; either way
		// the reader leaves now.
		t.Log("an event arrived before the cancelled context")
	}
	st.Cancel()
	done()
}

func TestNewValidates(t *testing.T) {
	for _, o := range []Options{
		{Decode: []string{"http://a"}},
		{Prefill: []string{"http://a"}},
		{Prefill: []string{"http://a"}, Decode: []string{"http://b"}, Policy: "random"},
		{Prefill: []string{"http://a"}, Decode: []string{"http://a/"}},
		{Prefill: []string{"ftp://a"}, Decode: []string{"http://b"}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	r, err := New(Options{Prefill: []string{"127.0.0.1:1"}, Decode: []string{"http://127.0.0.1:2/"}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.retries != 2 || r.policy != PolicyRoundRobin || r.o.HealthInterval != time.Second {
		t.Errorf("defaults: retries %d policy %s interval %v", r.retries, r.policy, r.o.HealthInterval)
	}
	if r.prefill[0].url != "http://127.0.0.1:1" || r.decode[0].url != "http://127.0.0.1:2" {
		t.Errorf("urls %s %s", r.prefill[0].url, r.decode[0].url)
	}
	if r.Ready() {
		t.Error("ready before any probe")
	}
}

func TestWorkerOnEveryInterface(t *testing.T) {
	c := newCluster(t, 1, 1, nil)
	p := c.prefill[0]
	p.advertiseAny = true
	p.stopGRPC()
	p.startGRPC()
	c.refresh()
	if !c.r.Ready() {
		t.Fatalf("a worker advertising 0.0.0.0 was not reached: %+v", c.r.Workers())
	}
	st, err := c.generate("any", 4, request.Params{})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, st)
	d := c.decode[0]
	d.mu.Lock()
	defer d.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	// Decode matches the writer against prefill's own name for itself.
	if w := d.reserves[0].Writer; w != p.info.GrpcAddr || !strings.HasPrefix(w, "0.0.0.0:") {
		t.Errorf("writer %q, prefill calls itself %q", w, p.info.GrpcAddr)
	}
}

func TestDialAddr(t *testing.T) {
	for _, tc := range [][3]string{
		{"0.0.0.0:9000", "http://10.1.2.3:8100", "10.1.2.3:9000"},
		{"[::]:9000", "http://worker.local:8100", "worker.local:9000"},
		{":9000", "http://127.0.0.1:8100", "127.0.0.1:9000"},
		{"127.0.0.1:9000", "http://10.1.2.3:8100", "127.0.0.1:9000"},
	} {
		got, err := dialAddr(tc[0], tc[1])
		if err != nil || got != tc[2] {
			t.Errorf("dialAddr(%q, %q) = %q, %v; want %q", tc[0], tc[1], got, err, tc[2])
		}
	}
	if _, err := dialAddr("nonsense", "http://x"); err == nil {
		t.Error("bad address accepted")
	}
}

func TestPairDiffTransport(t *testing.T) {
	p := &pdv1.WorkerInfo{Layout: testLayout(), Transport: "ucx"}
	d := &pdv1.WorkerInfo{Layout: testLayout(), Transport: "tcp"}
	if got := pairDiff(p, d); !strings.Contains(got, "transport (prefill ucx, decode tcp)") {
		t.Fatalf("pairDiff = %q", got)
	}
	d.Transport = "ucx"
	if got := pairDiff(p, d); got != "" {
		t.Fatalf("same transport: %q", got)
	}
}
