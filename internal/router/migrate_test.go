package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/request"
)

// migrationPrompt is the prompt every migration test sends (cluster.generate
// numbers a prompt's tokens from 1).
const migrationPrompt = 4

// greedyToken is the token a deterministic model generates at output
// position i: a continuation that starts one position off shows as a
// repeated or a missing number.
func greedyToken(i int) int32 { return int32(1000 + i) }

// greedyRun is the uninterrupted output of max tokens.
func greedyRun(max int) []int32 {
	out := make([]int32, max)
	for i := range out {
		out[i] = greedyToken(i)
	}
	return out
}

// breaking makes fake decode workers behave like a deterministic model
// that fails mid-stream: each attempt (in the order the router makes them)
// reads where the output stands from the prompt it was reserved with (the
// tokens past the request's own prompt are output the client has), checks
// that they are the output so far, and generates from there until
// max_tokens, unless its entry in fails says to break after that many
// tokens, and how.
type breaking struct {
	t     *testing.T
	mu    sync.Mutex
	fails []breakAfter // per attempt; past the end, attempts finish
	next  int
	// starts records where each attempt's output began.
	starts []int
	// skew moves where every attempt after the first takes the output to
	// stand (a mutation: -1 repeats a token, +1 drops one).
	skew int
}

type breakAfter struct {
	n   int
	how func(d *fake, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error
}

// The ways a decode worker fails a request mid-stream.
var (
	// unavailable: the connection to the worker is lost (gRPC Unavailable).
	unavailable = func(*fake, grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		return status.Error(codes.Unavailable, "decode at 127.0.0.1:40113 went away")
	}
	// internalEvent: decode reports a failure of its own.
	internalEvent = func(_ *fake, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		return srv.Send(&pdv1.TokenEvent{Error: "NaN logits (room 4 epoch 1)", Code: 500})
	}
	// killed: the worker's gRPC server stops, cutting every connection,
	// as a process that exits does, once the client read what was sent
	// (tokens still in flight when a connection is cut are lost, and a
	// request with none delivered is retried from its start instead).
	killed = func(d *fake, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		<-d.readSoFar
		go d.stopGRPC()
		<-srv.Context().Done()
		return srv.Context().Err()
	}
	// handBack: decode, draining, hands the request back (roles'
	// Decode.HandBack): finish drain, code 503.
	handBack = func(_ *fake, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		return srv.Send(&pdv1.TokenEvent{Finish: request.FinishDrain, Error: "decode worker draining: the request is handed back to the router", Code: 503})
	}
	// clientFault: decode refuses the request for its own content (a
	// constraint that admits nothing), which no other worker would take.
	clientFault = func(_ *fake, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		return srv.Send(&pdv1.TokenEvent{Error: "the constraint admits no token here", Code: 400})
	}
)

func (b *breaking) install(c *cluster) {
	for _, d := range c.decode {
		d := d
		d.streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
			return b.stream(d, rm, srv)
		}
	}
}

func (b *breaking) stream(d *fake, rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
	select {
	case <-rm.committed:
	case <-srv.Context().Done():
		return nil
	}
	req := d.reservedFor(rm.room)
	b.mu.Lock()
	i := b.next
	b.next++
	b.mu.Unlock()
	start := len(req.Prompt) - migrationPrompt
	if i > 0 {
		start += b.skew
	}
	b.mu.Lock()
	b.starts = append(b.starts, start)
	b.mu.Unlock()
	for j, id := range req.Prompt[migrationPrompt:] {
		if id != greedyToken(j) {
			b.t.Errorf("attempt %d: prompt carries output %v, not the output so far", i, req.Prompt[migrationPrompt:])
			break
		}
	}
	remaining := int(req.Sampling.MaxTokens)
	for k := range remaining {
		if i < len(b.fails) && k == b.fails[i].n {
			return b.fails[i].how(d, srv)
		}
		ev := &pdv1.TokenEvent{Token: &pdv1.Token{Id: greedyToken(start + k), Logprob: -0.25}}
		if k == remaining-1 {
			ev.Finish = request.FinishLength
		}
		if err := srv.Send(ev); err != nil {
			return err
		}
	}
	return nil
}

// reservedFor is the Reserve that made room id.
func (f *fake) reservedFor(room uint64) *pdv1.ReserveRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.resv {
		if r.Room == room {
			return f.reserves[i]
		}
	}
	f.t.Errorf("no reservation for room %d", room)
	return &pdv1.ReserveRequest{Sampling: &pdv1.SamplingParams{}}
}

// reservedInOrder is every Reserve of the cluster's decode workers, in the
// order they were made (rooms are numbered across the cluster).
func reservedInOrder(c *cluster) []*pdv1.ReserveRequest {
	type made struct {
		room uint64
		req  *pdv1.ReserveRequest
	}
	var all []made
	for _, d := range c.decode {
		d.mu.Lock()
		for i, r := range d.resv {
			all = append(all, made{r.Room, d.reserves[i]})
		}
		d.mu.Unlock()
	}
	slices.SortFunc(all, func(a, b made) int { return int(a.room) - int(b.room) })
	out := make([]*pdv1.ReserveRequest, len(all))
	for i, m := range all {
		out[i] = m.req
	}
	return out
}

func migrations(c *cluster) map[string]float64 {
	out := map[string]float64{}
	for _, why := range migrateReasons {
		out[why] = value(c.r.rm.migrations.WithLabelValues(why))
	}
	return out
}

// A request whose decode worker fails after some tokens goes on on the
// other pair from the tokens the client has: the client reads the
// uninterrupted output, each token once, and the last event is the
// request's own finish. Each continuation is reserved with the request's
// prompt and the output so far, max_tokens and min_tokens less what was
// sent, and the request's own sampling parameters; each move is counted
// under its reason.
func TestMigrationContinuesTheStream(t *testing.T) {
	const max, killAt = 10, 4
	for _, tc := range []struct {
		name   string
		fails  []breakAfter
		counts map[string]float64
		starts []int
	}{
		{"worker gone", []breakAfter{{3, unavailable}}, map[string]float64{migrateDecodeGone: 1}, []int{0, 3}},
		{"worker killed", []breakAfter{{killAt, killed}}, map[string]float64{migrateDecodeGone: 1}, []int{0, killAt}},
		{"decode's own failure", []breakAfter{{5, internalEvent}}, map[string]float64{migrateDecodeError: 1}, []int{0, 5}},
		{"worker draining", []breakAfter{{4, handBack}}, map[string]float64{migrateDrain: 1}, []int{0, 4}},
		{"drained twice", []breakAfter{{2, handBack}, {3, handBack}}, map[string]float64{migrateDrain: 2}, []int{0, 2, 5}},
		{"twice", []breakAfter{{2, unavailable}, {3, internalEvent}}, map[string]float64{migrateDecodeGone: 1, migrateDecodeError: 1}, []int{0, 2, 5}},
		// The continuation's own attempt fails before its first token: that
		// is a retry, not a second migration.
		{"before the continuation's first token", []breakAfter{{1, unavailable}, {0, unavailable}}, map[string]float64{migrateDecodeGone: 1}, []int{0, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 1, 3, nil)
			c.refresh()
			read := make(chan struct{})
			for _, d := range c.decode {
				d.readSoFar = read
			}
			b := &breaking{t: t, fails: tc.fails}
			b.install(c)
			seed := uint64(7)
			p := request.Params{MaxTokens: max, MinTokens: 6, Seed: &seed, PromptLogprobs: true,
				Sampling: request.Sampling{Temperature: 0.7, TopK: 5, TopLogprobs: 2, PresencePenalty: 0.5}}
			st, err := c.generate("moved", migrationPrompt, p)
			if err != nil {
				t.Fatal(err)
			}
			var toks []int32
			var last request.Event
			for {
				ev, ok := st.Next(context.Background())
				if !ok {
					t.Fatal("no event")
				}
				if ev.Token != nil {
					toks = append(toks, ev.Token.ID)
					if len(toks) == killAt {
						close(read)
					}
					if ev.Token.Logprob != -0.25 {
						t.Errorf("token %d's logprob %v", ev.Token.ID, ev.Token.Logprob)
					}
				}
				if ev.Finish != "" {
					last = ev
					break
				}
			}
			if want := greedyRun(max); !slices.Equal(toks, want) {
				t.Fatalf("the client read %v, want %v", toks, want)
			}
			if last.Finish != request.FinishLength || last.Err != nil {
				t.Fatalf("last event %+v", last)
			}
			if !slices.Equal(b.starts, tc.starts) {
				t.Errorf("attempts started at outputs %v, want %v", b.starts, tc.starts)
			}
			res := reservedInOrder(c)
			if len(res) != len(tc.starts) {
				t.Fatalf("%d reservations, want %d", len(res), len(tc.starts))
			}
			for i, r := range res[1:] {
				sent := tc.starts[i+1]
				want := append([]int32{1, 2, 3, 4}, greedyRun(sent)...)
				sp := r.Sampling
				if !slices.Equal(r.Prompt, want) || sp.MaxTokens != uint32(max-sent) || sp.MinTokens != uint32(6-sent) || sp.PromptLogprobs {
					t.Errorf("continuation %d reserved prompt %v max_tokens %d min_tokens %d prompt_logprobs %v; want prompt %v max_tokens %d min_tokens %d",
						i+1, r.Prompt, sp.MaxTokens, sp.MinTokens, sp.PromptLogprobs, want, max-sent, 6-sent)
				}
				if sp.Seed == nil || *sp.Seed != seed || sp.Temperature != 0.7 || sp.TopK != 5 || sp.TopLogprobs != 2 || sp.PresencePenalty != 0.5 {
					t.Errorf("continuation %d sampled with %+v, not the request's parameters", i+1, sp)
				}
			}
			if got := migrations(c); fmt.Sprint(got) != fmt.Sprint(withZeros(tc.counts)) {
				t.Errorf("migrations %v, want %v", got, withZeros(tc.counts))
			}
			eventually(t, "the request to end", func() bool { return c.r.InFlight() == 0 })
			if n := value(c.m.Requests.WithLabelValues("router", "finished")); n != 1 {
				t.Errorf("finished outcomes %v", n)
			}
			if got := st.trail; !slices.Contains(got, phaseMigrating) || got[len(got)-1] != phaseDone {
				t.Errorf("phases %v", got)
			}
		})
	}
}

func withZeros(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for _, why := range migrateReasons {
		out[why] = m[why]
	}
	return out
}

// A request is moved at most MaxMigrations times: past that the client
// gets the tokens it has, each once, then an error event saying how many
// workers failed it, and the workers' words stay in the log.
func TestMigrationBound(t *testing.T) {
	for _, tc := range []struct {
		name string
		max  int // Options.MaxMigrations
		want int // migrations made
	}{{"default", 0, DefaultMaxMigrations}, {"one", 1, 1}, {"off", -1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 1, 2, func(o *Options) { o.MaxMigrations = tc.max })
			c.refresh()
			c.warm()
			done := leakCheck(t)
			var fails []breakAfter
			for range 5 {
				fails = append(fails, breakAfter{2, unavailable})
			}
			b := &breaking{t: t, fails: fails}
			b.install(c)
			st, err := c.generate("doomed", migrationPrompt, request.Params{MaxTokens: 20})
			if err != nil {
				t.Fatal(err)
			}
			toks, last := readAll(t, st)
			if want := greedyRun(2 * (tc.want + 1)); !slices.Equal(toks, want) {
				t.Fatalf("the client read %v, want %v", toks, want)
			}
			var e *Error
			if last.Finish != request.FinishError || !errors.As(last.Err, &e) || e.Status != 502 {
				t.Fatalf("last event %+v", last)
			}
			wantMsg := msgInterrupted
			if tc.want > 0 {
				wantMsg = fmt.Sprintf(msgMigrations, tc.want+1)
			}
			if e.Message != wantMsg || leakInMessage.MatchString(e.Message) {
				t.Errorf("message %q, want %q", e.Message, wantMsg)
			}
			if got := migrations(c)[migrateDecodeGone]; got != float64(tc.want) {
				t.Errorf("%v migrations, want %d", got, tc.want)
			}
			if n := len(reserved(c)); n != tc.want+2 { // the warm-up's and each attempt's
				t.Errorf("%d reservations, want %d", n, tc.want+2)
			}
			eventually(t, "the request to end", func() bool { return c.r.InFlight() == 0 })
			if n := value(c.m.Requests.WithLabelValues("router", "error")); n != 1 {
				t.Errorf("error outcomes %v", n)
			}
			done()
		})
	}
}

// A client that leaves mid-stream is no worker's failure: decode is told
// to abort and the request is not continued anywhere, even when the
// stream then breaks. Nor is a 4xx error event after tokens (the request's
// own fault), nor a stream the router itself cut while shutting down.
func TestMigrationNotOnClientOrRequestFault(t *testing.T) {
	t.Run("client cancel", func(t *testing.T) {
		c := newCluster(t, 1, 2, nil)
		c.refresh()
		c.warm()
		done := leakCheck(t)
		for _, d := range c.decode {
			d.streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				<-rm.committed
				for i := range 2 {
					if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: greedyToken(i)}}); err != nil {
						return err
					}
				}
				// The abort the cancel sends, then the worker's stream breaks.
				select {
				case <-rm.ended:
				case <-srv.Context().Done():
				}
				return status.Error(codes.Unavailable, "gone")
			}
		}
		st, err := c.generate("leaver", migrationPrompt, request.Params{MaxTokens: 20})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for range 2 {
			if ev, ok := st.Next(ctx); !ok || ev.Token == nil {
				t.Fatal("no token")
			}
		}
		st.Cancel()
		eventually(t, "the request to end", func() bool { return c.r.InFlight() == 0 })
		if n := len(reserved(c)); n != 2 { // the warm-up's and this one's
			t.Errorf("%d reservations: a client that left was continued elsewhere", n)
		}
		if got := migrations(c); got[migrateDecodeGone]+got[migrateDecodeError] != 0 {
			t.Errorf("migrations %v", got)
		}
		if n := value(c.m.Requests.WithLabelValues("router", "aborted")); n != 1 {
			t.Errorf("aborted outcomes %v", n)
		}
		if st.trail[len(st.trail)-1] != phaseCancelled || slices.Contains(st.trail, phaseMigrating) {
			t.Errorf("phases %v", st.trail)
		}
		done()
	})
	t.Run("4xx after tokens", func(t *testing.T) {
		c := newCluster(t, 1, 2, nil)
		c.refresh()
		b := &breaking{t: t, fails: []breakAfter{{3, clientFault}}}
		b.install(c)
		st, err := c.generate("bad", migrationPrompt, request.Params{MaxTokens: 20})
		if err != nil {
			t.Fatal(err)
		}
		toks, last := readAll(t, st)
		var e *Error
		if !slices.Equal(toks, greedyRun(3)) || last.Finish != request.FinishError || !errors.As(last.Err, &e) || e.Status != 400 {
			t.Fatalf("tokens %v, last %+v", toks, last)
		}
		if n := len(reserved(c)); n != 1 {
			t.Errorf("%d reservations: a request's own fault was continued elsewhere", n)
		}
	})
	t.Run("router shutting down", func(t *testing.T) {
		c := newCluster(t, 1, 2, nil)
		c.refresh()
		release := make(chan struct{})
		for _, d := range c.decode {
			d.streamFn = func(rm *fakeRoom, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
				<-rm.committed
				if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: greedyToken(0)}}); err != nil {
					return err
				}
				<-release
				return status.Error(codes.Unavailable, "gone")
			}
		}
		st, err := c.generate("closing", migrationPrompt, request.Params{MaxTokens: 20})
		if err != nil {
			t.Fatal(err)
		}
		if ev, ok := st.Next(context.Background()); !ok || ev.Token == nil {
			t.Fatal("no token")
		}
		c.r.Close()
		close(release)
		_, last := readAll(t, st)
		if last.Finish != request.FinishError {
			t.Fatalf("last event %+v", last)
		}
		if n := len(reserved(c)); n != 1 {
			t.Errorf("%d reservations: a router shutting down moved a request", n)
		}
	})
}

// A continuation says how much of its prompt is the request's own output
// (the tokens the client has), so that the new pair's penalties weigh them
// as generated and its constraint starts past them; the first attempt
// says none.
func TestMigrationMarksTheOutput(t *testing.T) {
	for _, kind := range []string{"regex", ""} {
		c := newCluster(t, 1, 2, nil)
		c.refresh()
		b := &breaking{t: t, fails: []breakAfter{{3, unavailable}}}
		b.install(c)
		st, err := c.generate("constrained", migrationPrompt, request.Params{MaxTokens: 6, Constraint: request.Constraint{Kind: kind, Spec: "x"},
			Sampling: request.Sampling{FrequencyPenalty: 0.5}})
		if err != nil {
			t.Fatal(err)
		}
		if toks, _ := readAll(t, st); !slices.Equal(toks, greedyRun(6)) {
			t.Fatalf("the client read %v", toks)
		}
		res := reservedInOrder(c)
		if len(res) != 2 {
			t.Fatalf("%d reservations", len(res))
		}
		if got := res[1].Sampling.GetContinued(); got != 3 || res[1].Sampling.ConstraintKind != kind || !slices.Equal(res[1].Prompt[len(res[1].Prompt)-3:], greedyRun(3)) {
			t.Errorf("constraint %q: continuation says %d of its prompt's tokens are output (want 3), prompt ends %v", kind, got, res[1].Prompt)
		}
		if got := res[0].Sampling.GetContinued(); got != 0 {
			t.Errorf("the first attempt says %d tokens are output", got)
		}
	}
}

// drainRun sends one greedy request of max tokens through a router with
// three decode workers; the first hands it back after 4 tokens, as a
// draining worker does. It returns what the client read and its last event.
func drainRun(t *testing.T, skew int) ([]int32, request.Event, *cluster) {
	c := newCluster(t, 1, 3, nil)
	c.refresh()
	b := &breaking{t: t, fails: []breakAfter{{4, handBack}}, skew: skew}
	b.install(c)
	st, err := c.generate("drained", migrationPrompt, request.Params{MaxTokens: 12})
	if err != nil {
		t.Fatal(err)
	}
	toks, last := readAll(t, st)
	eventually(t, "the request to end", func() bool { return c.r.InFlight() == 0 })
	return toks, last, c
}

// A request a draining decode worker hands back goes on on another pair:
// the client reads the uninterrupted run, each token once, with its own
// finish, and the move counts under drain, not as a failure. Its mutation
// proof: a continuation that goes on one token early (repeating one) or
// late (dropping one) is caught by the same check.
func TestDrainHandBackContinues(t *testing.T) {
	toks, last, c := drainRun(t, 0)
	if want := greedyRun(12); !slices.Equal(toks, want) || last.Finish != request.FinishLength || last.Err != nil {
		t.Fatalf("the client read %v and %+v, want %v and finish length", toks, last, want)
	}
	if got, want := migrations(c), withZeros(map[string]float64{migrateDrain: 1}); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("migrations %v, want %v", got, want)
	}
	for _, skew := range []int{-1, 1} {
		toks, _, _ := drainRun(t, skew)
		if slices.Equal(toks, greedyRun(12)) {
			t.Errorf("a continuation %d token(s) off reads as the uninterrupted run: the check proves nothing", skew)
		}
	}
}
