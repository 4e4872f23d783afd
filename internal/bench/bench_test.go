package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeServer streams completions the way an OpenAI-compatible server
// does, with set delays, and records what it was asked.
type fakeServer struct {
	t          *testing.T
	firstDelay time.Duration // before the first chunk
	gap        time.Duration // between chunks
	noUsage    bool          // omit the usage chunk
	failEvery  int           // answer every n-th request with HTTP 500
	midError   bool          // send an error event after the first chunk
	noFinish   bool          // end the stream with neither finish_reason nor [DONE]
	// tokenize serves /tokenize, counting three tokens a word and a BOS,
	// and reports usage the same way.
	tokenize bool
	cached   int // report this many cached prompt tokens in usage
	// specPerRequest, when set, makes /metrics count this many draft
	// tokens (and half as many accepted) per completion served.
	specPerRequest int
	// dropReused closes a connection, unanswered, when a completion
	// request arrives on it after an earlier one (a keep-alive limit of
	// one request, the way llama-server sometimes drops kept-alive ones).
	dropReused bool

	mu       sync.Mutex
	conns    int // connections opened to the server
	reqs     []completionBody
	auth     []string
	n        int
	inflight int
	peak     int
}

// completionBody is decoded strictly: a field the benchmark misspells
// fails the test rather than being ignored as a real server might.
type completionBody struct {
	Model         string   `json:"model"`
	Prompt        string   `json:"prompt"`
	MaxTokens     int      `json:"max_tokens"`
	Stream        bool     `json:"stream"`
	IgnoreEOS     bool     `json:"ignore_eos"`
	Temperature   *float64 `json:"temperature"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// prompts are the prompts of the completions received, in arrival order.
func (f *fakeServer) prompts() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, r := range f.reqs {
		out = append(out, r.Prompt)
	}
	return out
}

func (f *fakeServer) start() *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, `{"object":"list","data":[{"id":"fake-model","object":"model"},{"id":"other","object":"model"}]}`)
	})
	mux.HandleFunc("POST /v1/completions", f.complete)
	if f.specPerRequest > 0 {
		mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
			f.mu.Lock()
			d := f.n * f.specPerRequest
			f.mu.Unlock()
			fmt.Fprintf(w, "# TYPE baton_spec_draft_tokens_total counter\nbaton_spec_draft_tokens_total{model_name=\"m\",role=\"decode\"} %d\nbaton_spec_draft_tokens_total{model_name=\"m\",role=\"standalone\"} 0\nbaton_spec_accepted_tokens_total{model_name=\"m\",role=\"decode\"} %d\n", d+7, d/2+3)
		})
	}
	if f.tokenize {
		mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
			var body struct{ Model, Prompt string }
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model == "" {
				http.Error(w, `{"error":{"message":"bad body"}}`, http.StatusBadRequest)
				return
			}
			fmt.Fprintf(w, `{"count":%d,"tokens":[]}`, f.promptTokens(body.Prompt))
		})
	}
	s := httptest.NewUnstartedServer(mux)
	s.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		f.mu.Lock()
		f.conns++
		f.mu.Unlock()
		return context.WithValue(ctx, connServed{}, new(int))
	}
	s.Start()
	f.t.Cleanup(s.Close)
	return s
}

// connServed keys the count of completion requests a connection carried.
type connServed struct{}

func (f *fakeServer) promptTokens(prompt string) int {
	if f.tokenize {
		return 3*len(strings.Fields(prompt)) + 1
	}
	return len(strings.Fields(prompt)) + 1
}

func (f *fakeServer) complete(w http.ResponseWriter, r *http.Request) {
	served := r.Context().Value(connServed{}).(*int)
	f.mu.Lock()
	*served++
	drop := f.dropReused && *served > 1
	f.mu.Unlock()
	if drop {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			f.t.Errorf("hijack: %v", err)
			return
		}
		c.Close()
		return
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	var body completionBody
	if err := dec.Decode(&body); err != nil {
		http.Error(w, `{"error":{"message":"bad body: `+err.Error()+`"}}`, http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, body)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	f.n++
	n := f.n
	f.inflight++
	f.peak = max(f.peak, f.inflight)
	f.mu.Unlock()
	// The count drops before the last chunk a client may stop at is sent:
	// once a client has it, the client may start its next request, and
	// that must not be counted as overlapping this one.
	released := false
	release := func() {
		if !released {
			released = true
			f.mu.Lock()
			f.inflight--
			f.mu.Unlock()
		}
	}
	defer release()
	if f.failEvery > 0 && n%f.failEvery == 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, `{"error":{"message":"boom","type":"server_error"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(v string) {
		fmt.Fprintf(w, "data: %s\n\n", v)
		fl.Flush()
	}
	// A role-only first chunk with no text, as some servers send: it is not
	// the first token.
	send(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"","finish_reason":null}]}`)
	time.Sleep(f.firstDelay)
	for i := range body.MaxTokens {
		if i > 0 {
			time.Sleep(f.gap)
		}
		finish := "null"
		if i == body.MaxTokens-1 && !f.noFinish {
			finish = `"length"`
			release()
		}
		send(fmt.Sprintf(`{"id":"c","object":"text_completion","model":%q,"choices":[{"index":0,"text":" tok%d","logprobs":null,"finish_reason":%s}],"usage":null}`, body.Model, i, finish))
		if f.midError && i == 0 {
			release()
			send(`{"error":{"message":"decode failed","type":"server_error","code":502}}`)
			return
		}
	}
	if f.noFinish {
		return
	}
	if body.StreamOptions.IncludeUsage && !f.noUsage {
		p := f.promptTokens(body.Prompt)
		send(fmt.Sprintf(`{"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
			p, body.MaxTokens, p+body.MaxTokens, f.cached))
	}
	send("[DONE]")
	// The chunked terminator follows in a packet of its own, as from a
	// server still finishing up: a client that stops reading at [DONE]
	// has not seen the end of the body.
	time.Sleep(2 * time.Millisecond)
}

func TestRunMeasuresAStreamingServer(t *testing.T) {
	f := &fakeServer{t: t, firstDelay: 40 * time.Millisecond, gap: 10 * time.Millisecond}
	s := f.start()
	var progress []int
	rep, err := Run(context.Background(), Config{
		URL: s.URL, Model: "m", Concurrency: 4, NumPrompts: 12, InputLen: 20, OutputLen: 5, APIKey: "sekret", Seed: 7,
		Progress: func(done, total int) {
			if total != 12 {
				t.Errorf("progress total %d", total)
			}
			progress = append(progress, done)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 12 || rep.Failed != 0 {
		t.Fatalf("completed %d failed %d: %+v", rep.Completed, rep.Failed, rep.Errors)
	}
	if rep.TotalOutputTokens != 60 || rep.TotalInputTokens != 12*21 || !rep.UsageReported {
		t.Errorf("tokens in %d out %d usage %v; want the server's usage (252, 60)", rep.TotalInputTokens, rep.TotalOutputTokens, rep.UsageReported)
	}
	if !slices.Equal(progress, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}) {
		t.Errorf("progress %v", progress)
	}
	f.mu.Lock()
	peak := f.peak
	for i, r := range f.reqs {
		if r.Model != "m" || r.MaxTokens != 5 || !r.Stream || !r.IgnoreEOS || !r.StreamOptions.IncludeUsage {
			t.Errorf("request %d: %+v", i, r)
		}
		ws := strings.Fields(r.Prompt)
		if len(ws) != 20 {
			t.Errorf("request %d: prompt of %d words, want 20", i, len(ws))
		}
		for _, w := range ws {
			if !slices.Contains(words, w) {
				t.Errorf("prompt word %q is not from the list", w)
			}
		}
		if f.auth[i] != "Bearer sekret" {
			t.Errorf("request %d: Authorization %q", i, f.auth[i])
		}
	}
	f.mu.Unlock()
	if peak != 4 || rep.MaxConcurrentRequests != 4 {
		t.Errorf("peak in flight: server saw %d, report says %d; want 4", peak, rep.MaxConcurrentRequests)
	}
	// The server's delays bound what the client measures from below; the
	// upper bounds only catch gross errors (units, the wrong chunk).
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	check := func(name string, st Stats, n int, lo, hi time.Duration) {
		t.Helper()
		if st.N != n || st.P50 < ms(lo) || st.P50 > ms(hi) || st.P50 > st.P90 || st.P90 > st.P99 || st.P99 > st.Max || st.Mean <= 0 {
			t.Errorf("%s: %+v; want %d samples, p50 in [%v, %v]", name, st, n, lo, hi)
		}
	}
	check("TTFT", rep.TTFT, 12, 40*time.Millisecond, 400*time.Millisecond)
	check("ITL", rep.ITL, 12*4, 10*time.Millisecond, 200*time.Millisecond)
	check("TPOT", rep.TPOT, 12, 10*time.Millisecond, 200*time.Millisecond)
	check("E2E", rep.E2E, 12, 80*time.Millisecond, 800*time.Millisecond)
	// 12 requests, 4 at a time, each at least 80 ms: 3 waves.
	if rep.DurationS < 0.24 {
		t.Errorf("duration %.3fs is shorter than 3 waves of 80 ms", rep.DurationS)
	}
	if got, want := rep.RequestThroughput, 12/rep.DurationS; math.Abs(got-want) > 1e-9 {
		t.Errorf("request throughput %v, want %v", got, want)
	}
	if got, want := rep.OutputThroughput, 60/rep.DurationS; math.Abs(got-want) > 1e-9 {
		t.Errorf("output throughput %v, want %v", got, want)
	}

	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Successful requests:", " 12\n", "Output token throughput (tok/s):", "P99 TTFT (ms):", "P90 ITL (ms):", "P50 E2E Latency (ms):"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, text.String())
		}
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"request_throughput", "output_throughput", "ttft_ms", "itl_ms", "e2e_latency_ms"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON report lacks %q: %s", k, b)
		}
	}
}

// A server with /tokenize gets prompts of --input-len tokens as it counts
// them, not words: here three tokens a word and a BOS, so 20 tokens are 6
// words (19 tokens; a seventh word would make 22). The report gives the
// mean the server counted.
func TestInputLenIsTokens(t *testing.T) {
	f := &fakeServer{t: t, tokenize: true}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL, Concurrency: 2, NumPrompts: 5, InputLen: 20, OutputLen: 2, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !rep.PromptsMeasured || rep.MeanInputTokens != 19 || rep.TotalInputTokens != 5*19 {
		t.Errorf("measured %v, mean input tokens %v, total %d; want 19 a prompt", rep.PromptsMeasured, rep.MeanInputTokens, rep.TotalInputTokens)
	}
	f.mu.Lock()
	for i, r := range f.reqs {
		if n := len(strings.Fields(r.Prompt)); n != 6 {
			t.Errorf("request %d: %d words, want 6", i, n)
		}
	}
	f.mu.Unlock()
	var text bytes.Buffer
	_ = rep.WriteText(&text)
	if !strings.Contains(text.String(), "Mean input tokens:") || strings.Contains(text.String(), "no /tokenize") {
		t.Errorf("report:\n%s", text.String())
	}
	// Without /tokenize: words, and the report says so.
	g := &fakeServer{t: t}
	rep, err = Run(context.Background(), Config{URL: g.start().URL, Model: "m", Concurrency: 1, NumPrompts: 2, InputLen: 20, OutputLen: 1})
	if err != nil {
		t.Fatal(err)
	}
	text.Reset()
	_ = rep.WriteText(&text)
	if rep.PromptsMeasured || rep.MeanInputTokens != 21 || !strings.Contains(text.String(), "no /tokenize") {
		t.Errorf("measured %v, mean %v:\n%s", rep.PromptsMeasured, rep.MeanInputTokens, text.String())
	}
}

func TestFitBisects(t *testing.T) {
	ws := strings.Fields(strings.Repeat("w ", 50))
	for _, c := range []struct{ per, n, want int }{{1, 10, 10}, {3, 20, 6}, {3, 3, 1}, {2, 1000, 50}, {5, 2, 1}} {
		got, err := fit(ws, c.n, func(w []string) (int, error) { return c.per * len(w), nil })
		if err != nil || len(strings.Fields(got)) != c.want {
			t.Errorf("%d tokens a word, %d tokens: %d words (%v), want %d", c.per, c.n, len(strings.Fields(got)), err, c.want)
		}
	}
}

func TestSeedMakesPromptsRepeatable(t *testing.T) {
	prompts := func(seed uint64) []string {
		f := &fakeServer{t: t}
		s := f.start()
		if _, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 3, NumPrompts: 6, InputLen: 8, OutputLen: 1, Seed: seed}); err != nil {
			t.Fatal(err)
		}
		out := f.prompts()
		// Requests in flight together arrive in any order.
		slices.Sort(out)
		return out
	}
	a, b, c := prompts(1), prompts(1), prompts(2)
	if !slices.Equal(a, b) {
		t.Errorf("same seed, different prompts:\n%q\n%q", a, b)
	}
	if slices.Equal(a, c) {
		t.Error("different seeds, same prompts")
	}
	if len(slices.Compact(slices.Clone(a))) != len(a) {
		t.Errorf("prompts repeat within a run: %q", a)
	}
}

// Warm-up requests arrive before any measured one and stay out of the
// figures; the measured prompts are the ones a run without warm-up sends,
// and no warm-up prompt is one of them. A warm-up that fails fails the
// run before it starts.
func TestWarmupRequests(t *testing.T) {
	run := func(warm int) (*Report, []string) {
		f := &fakeServer{t: t, gap: time.Millisecond}
		s := f.start()
		rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 2, NumPrompts: 5, InputLen: 8, OutputLen: 3, Seed: 4, WarmupRequests: warm})
		if err != nil {
			t.Fatal(err)
		}
		return rep, f.prompts()
	}
	rep0, cold := run(0)
	rep, all := run(3)
	if len(all) != 8 || rep.Completed != 5 || rep.TotalOutputTokens != 15 || rep.TTFT.N != 5 || rep.WarmupRequests != 3 || rep0.WarmupRequests != 0 {
		t.Fatalf("%d requests, report %+v; want 3 warm-up and 5 measured", len(all), rep)
	}
	// Up to Concurrency warm-ups are in flight together, then the run's.
	warm, measured := slices.Clone(all[:3]), slices.Clone(all[3:])
	slices.Sort(cold)
	slices.Sort(measured)
	if !slices.Equal(measured, cold) {
		t.Errorf("the measured prompts changed with warm-up:\n%q\n%q", measured, cold)
	}
	for _, w := range warm {
		if slices.Contains(cold, w) {
			t.Errorf("warm-up prompt %q is also measured", w)
		}
	}

	f := &fakeServer{t: t, failEvery: 1}
	s := f.start()
	if rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", NumPrompts: 2, InputLen: 4, OutputLen: 1, WarmupRequests: 1}); err == nil || rep != nil || !strings.Contains(err.Error(), "warm-up") {
		t.Errorf("a failing warm-up: report %v, err %v", rep, err)
	}
}

func TestRequestRateSpacesArrivals(t *testing.T) {
	f := &fakeServer{t: t}
	s := f.start()
	cfg := Config{URL: s.URL, Model: "m", Concurrency: 8, NumPrompts: 8, InputLen: 4, OutputLen: 1, RequestRate: 40, Seed: 3}
	// The same draws Run makes: prompts first, then the gaps.
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x62_61_74_6f_6e))
	for range cfg.NumPrompts {
		Prompt(rng, cfg.InputLen)
	}
	var total time.Duration
	for _, g := range arrivals(rng, cfg.NumPrompts, cfg.RequestRate) {
		total += g
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.DurationS < total.Seconds() {
		t.Errorf("run took %.3fs, less than the %.3fs of arrival gaps", rep.DurationS, total.Seconds())
	}
	// Without a rate every request goes at once, up to the concurrency.
	f2 := &fakeServer{t: t, firstDelay: 50 * time.Millisecond}
	s2 := f2.start()
	if _, err := Run(context.Background(), Config{URL: s2.URL, Model: "m", Concurrency: 5, NumPrompts: 5, InputLen: 4, OutputLen: 1}); err != nil {
		t.Fatal(err)
	}
	f2.mu.Lock()
	defer f2.mu.Unlock()
	if f2.peak != 5 {
		t.Errorf("peak %d with no rate and concurrency 5", f2.peak)
	}
}

func TestConcurrencyIsABound(t *testing.T) {
	f := &fakeServer{t: t}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 2, NumPrompts: 300, InputLen: 2, OutputLen: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if rep.MaxConcurrentRequests != 2 || f.peak > 2 {
		t.Errorf("concurrency 2: the report counts %d in flight at most, the server saw %d", rep.MaxConcurrentRequests, f.peak)
	}
}

func TestArrivalsArePoisson(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gaps := arrivals(rng, 20001, 50)
	if gaps[0] != 0 {
		t.Errorf("first gap %v", gaps[0])
	}
	var sum time.Duration
	for _, g := range gaps[1:] {
		sum += g
	}
	mean := sum.Seconds() / 20000
	if math.Abs(mean-0.02) > 0.001 {
		t.Errorf("mean gap %.4fs at 50 req/s, want 0.02s", mean)
	}
	for _, rate := range []float64{0, math.Inf(1)} {
		for _, g := range arrivals(rng, 5, rate) {
			if g != 0 {
				t.Errorf("rate %v: gap %v", rate, g)
			}
		}
	}
}

func TestFailuresAreCountedNotFatal(t *testing.T) {
	f := &fakeServer{t: t, failEvery: 3}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 1, NumPrompts: 9, InputLen: 3, OutputLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 6 || rep.Failed != 3 || len(rep.Errors) != 1 || rep.Errors[0].Count != 3 || rep.Errors[0].Message != "HTTP 500: boom" {
		t.Fatalf("completed %d failed %d errors %+v", rep.Completed, rep.Failed, rep.Errors)
	}
	if rep.TotalOutputTokens != 12 || rep.TTFT.N != 6 {
		t.Errorf("failed requests counted in the figures: %d tokens, %d TTFT samples", rep.TotalOutputTokens, rep.TTFT.N)
	}
	var text bytes.Buffer
	_ = rep.WriteText(&text)
	if !strings.Contains(text.String(), "HTTP 500: boom") {
		t.Errorf("report does not show the error:\n%s", text.String())
	}

	f = &fakeServer{t: t, failEvery: 1}
	s = f.start()
	rep, err = Run(context.Background(), Config{URL: s.URL, Model: "m", NumPrompts: 2, InputLen: 3, OutputLen: 2})
	if err == nil || !strings.Contains(err.Error(), "boom") || rep == nil || rep.Failed != 2 {
		t.Errorf("all failed: err %v, report %+v", err, rep)
	}
}

// TestConnectionsAreReused: requests one after another share a connection,
// and a request whose kept-alive connection the server closes unanswered
// is sent again on a new one instead of counting as the server's failure.
func TestConnectionsAreReused(t *testing.T) {
	f := &fakeServer{t: t}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 1, NumPrompts: 6, InputLen: 3, OutputLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 6 || f.conns != 1 {
		t.Errorf("completed %d over %d connections, want 6 over 1", rep.Completed, f.conns)
	}

	f = &fakeServer{t: t, dropReused: true}
	s = f.start()
	rep, err = Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 1, NumPrompts: 6, InputLen: 3, OutputLen: 2})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Completed != 6 || rep.Failed != 0 || f.n != 6 {
		t.Errorf("server dropping kept-alive connections: completed %d, failed %d (%+v), served %d", rep.Completed, rep.Failed, rep.Errors, f.n)
	}
}

func TestBrokenStreamsFail(t *testing.T) {
	for name, f := range map[string]*fakeServer{
		"error event":          {midError: true},
		"no finish, no [DONE]": {noFinish: true},
	} {
		t.Run(name, func(t *testing.T) {
			f.t = t
			s := f.start()
			rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", NumPrompts: 2, InputLen: 3, OutputLen: 3})
			if err == nil || rep.Completed != 0 || rep.Failed != 2 {
				t.Errorf("err %v, report %+v", err, rep)
			}
			// The error event comes after the first chunk; the other
			// stream carries all three before it just stops.
			if want := map[bool]int{true: 2, false: 6}[f.midError]; rep.FailedStreamedChunks != want {
				t.Errorf("failed streams carried %d chunks, want %d", rep.FailedStreamedChunks, want)
			}
			t.Log(err)
		})
	}
}

func TestWithoutUsageCountsChunks(t *testing.T) {
	f := &fakeServer{t: t, noUsage: true}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL + "/v1", Model: "m", NumPrompts: 3, InputLen: 7, OutputLen: 4})
	if err != nil {
		t.Fatal(err)
	}
	if rep.UsageReported || rep.TotalOutputTokens != 12 || rep.TotalInputTokens != 21 {
		t.Errorf("usage %v, tokens in %d out %d; want estimates 21 and 12", rep.UsageReported, rep.TotalInputTokens, rep.TotalOutputTokens)
	}
	var text bytes.Buffer
	_ = rep.WriteText(&text)
	if !strings.Contains(text.String(), "reported no usage") {
		t.Errorf("the report does not say its token counts are estimates:\n%s", text.String())
	}
}

func TestModelFromServer(t *testing.T) {
	f := &fakeServer{t: t}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL + "/v1/completions", NumPrompts: 1, InputLen: 2, OutputLen: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if rep.Model != "fake-model" || f.reqs[0].Model != "fake-model" {
		t.Errorf("model %q, sent %q; want the first /v1/models entry", rep.Model, f.reqs[0].Model)
	}
}

func TestConfigChecks(t *testing.T) {
	for _, c := range []Config{
		{Model: "m", NumPrompts: 1, InputLen: 1, OutputLen: 1},
		{URL: "x", NumPrompts: 0, InputLen: 1, OutputLen: 1},
		{URL: "x", NumPrompts: 1, InputLen: 0, OutputLen: 1},
		{URL: "x", NumPrompts: 1, InputLen: 1, OutputLen: 0},
		{URL: "x", NumPrompts: 1, InputLen: 1, OutputLen: 1, Concurrency: -1},
		{URL: "x", NumPrompts: 1, InputLen: 1, OutputLen: 1, RequestRate: -1},
		{URL: "x", NumPrompts: 1, InputLen: 1, OutputLen: 1, WarmupRequests: -1},
	} {
		if _, err := Run(context.Background(), c); err == nil {
			t.Errorf("Run(%+v) accepted", c)
		}
	}
}

func TestEndpoints(t *testing.T) {
	for _, in := range []string{"http://h:1", "http://h:1/", "http://h:1/v1", "http://h:1/v1/", "http://h:1/v1/completions", "h:1"} {
		base, ep := endpoints(in)
		if base != "http://h:1" || ep != "http://h:1/v1/completions" {
			t.Errorf("endpoints(%q) = %q, %q", in, base, ep)
		}
	}
}

func TestPercentile(t *testing.T) {
	v := []float64{1, 2, 3, 4}
	for _, tc := range []struct{ p, want float64 }{{0, 1}, {50, 2.5}, {90, 3.7}, {99, 3.97}, {100, 4}} {
		if got := Percentile(v, tc.p); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", tc.p, got, tc.want)
		}
	}
	if Percentile([]float64{5}, 99) != 5 || Percentile(nil, 50) != 0 {
		t.Error("edge cases")
	}
}

// The shared-prefix workload: prompt i starts with prefix i mod K, the K
// prefixes differ, the suffixes follow, and the cached tokens the server
// reports are summed.
func TestSharedPrefixWorkload(t *testing.T) {
	f := &fakeServer{t: t, cached: 16}
	s := f.start()
	rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 1, NumPrompts: 6, InputLen: 4, OutputLen: 1,
		SharedPrefixLen: 20, NumPrefixes: 2})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.reqs) != 6 {
		t.Fatalf("%d requests", len(f.reqs))
	}
	prefix := func(p string) string { return strings.Join(strings.Fields(p)[:20], " ") }
	for i, r := range f.reqs {
		if n := len(strings.Fields(r.Prompt)); n != 24 {
			t.Fatalf("prompt %d has %d words, want 20 + 4", i, n)
		}
		if i >= 2 && prefix(r.Prompt) != prefix(f.reqs[i-2].Prompt) {
			t.Fatalf("prompts %d and %d start differently", i-2, i)
		}
	}
	if prefix(f.reqs[0].Prompt) == prefix(f.reqs[1].Prompt) {
		t.Fatal("the two prefixes are the same")
	}
	if rep.TotalCachedTokens != 6*16 || rep.NumPrefixes != 2 || rep.SharedPrefixLen != 20 {
		t.Fatalf("report %+v", rep)
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil || !strings.Contains(b.String(), "Total cached input tokens:") {
		t.Fatalf("text report: %v\n%s", err, b.String())
	}
}

// The echo workload asks for each prompt's text back and starts the
// answer; the report carries the server's speculative accept figures over
// the run (their /metrics counters' change), and none from a server
// without them.
func TestEchoWorkload(t *testing.T) {
	f := &fakeServer{t: t, specPerRequest: 10}
	s := f.start()
	zero := 0.0
	rep, err := Run(context.Background(), Config{URL: s.URL, Model: "m", Concurrency: 2, NumPrompts: 4, InputLen: 12, OutputLen: 2, Echo: true, Temperature: &zero})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	for i, r := range f.reqs {
		text, answer, ok := strings.Cut(r.Prompt, echoInstruction)
		if !ok || len(strings.Fields(text)) != 12 || answer != strings.Join(strings.Fields(text)[:echoLead], " ") {
			t.Fatalf("prompt %d is not an echo request: %q", i, r.Prompt)
		}
		if r.Temperature == nil || *r.Temperature != 0 {
			t.Fatalf("prompt %d: temperature %v, want 0", i, r.Temperature)
		}
	}
	f.mu.Unlock()
	if !rep.Echo || rep.SpecDraftTokens != 40 || rep.SpecAcceptedTokens != 20 || rep.SpecAcceptRate != 0.5 {
		t.Fatalf("report %+v", rep)
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil || !strings.Contains(b.String(), "Speculative accept rate:") || !strings.Contains(b.String(), "Workload:") {
		t.Fatalf("text report: %v\n%s", err, b.String())
	}
	plain := &fakeServer{t: t}
	rep, err = Run(context.Background(), Config{URL: plain.start().URL, Model: "m", NumPrompts: 1, InputLen: 4, OutputLen: 1})
	if err != nil || rep.SpecDraftTokens != 0 || rep.Echo {
		t.Fatalf("a server without speculation: %+v, %v", rep, err)
	}
	plain.mu.Lock()
	defer plain.mu.Unlock()
	if plain.reqs[0].Temperature != nil {
		t.Fatalf("no --temperature, yet %v was sent", *plain.reqs[0].Temperature)
	}
}
