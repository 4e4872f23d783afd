package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer/chat"
)

// fakeGen answers every request with tokens of id 300, one every delay,
// or with fail as its last event.
type fakeGen struct {
	calls  atomic.Int32
	tokens int
	delay  time.Duration
	fail   *scheduler.Event
	refuse error // returned by Generate
}

type fakeStream struct {
	g    *fakeGen
	sent int
}

func (g *fakeGen) Generate(string, []int32, scheduler.Params) (Stream, error) {
	g.calls.Add(1)
	if g.refuse != nil {
		return nil, g.refuse
	}
	return &fakeStream{g: g}, nil
}

func (s *fakeStream) Next(ctx context.Context) (scheduler.Event, bool) {
	select {
	case <-time.After(s.g.delay):
	case <-ctx.Done():
		return scheduler.Event{}, false
	}
	s.sent++
	if s.g.fail != nil {
		return *s.g.fail, true
	}
	ev := scheduler.Event{Token: &model.Sampled{TokenLogprob: model.TokenLogprob{ID: 300}}}
	if s.sent >= max(1, s.g.tokens) {
		ev.Finish = scheduler.FinishLength
	}
	return ev, true
}

func (s *fakeStream) Cancel() {}
func (s *fakeStream) Stop()   {}

const testKey = "k-123"

func newTestServer(t *testing.T, o Options) (*httptest.Server, *fakeGen) {
	t.Helper()
	g := &fakeGen{tokens: 2}
	if gg, ok := o.Generator.(*fakeGen); ok {
		g = gg
	}
	if o.Generator == nil || o.Generator == Generator(g) {
		o.Generator = g
	}
	o.ModelName = "m"
	o.Tokenizer = bundledTokenizer(t)
	o.Template = chat.Plain()
	if o.Metrics == nil {
		o.Metrics = metrics.New("standalone")
	}
	s := New(o)
	s.SetReady(true)
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, g
}

type apiError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// openAIError checks that body is OpenAI's error shape and returns it.
func openAIError(t *testing.T, what string, body []byte) apiError {
	t.Helper()
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", what, body, err)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Fatalf("%s: body %q lacks error.%s", what, body, k)
		}
	}
	var e apiError
	_ = json.Unmarshal(body, &e)
	if e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("%s: body %q has an empty message or type", what, body)
	}
	return e
}

func do(t *testing.T, method, url, auth, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`

func TestAPIKeyRoutes(t *testing.T) {
	for _, keyed := range []bool{false, true} {
		ts, _ := newTestServer(t, Options{APIKey: testKey, MetricsRequireKey: keyed})
		for _, c := range []struct {
			method, path, body string
		}{
			{"POST", "/v1/chat/completions", chatBody},
			{"POST", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`},
			{"GET", "/v1/models", ""},
			{"GET", "/v1/models/m", ""},
			{"GET", "/server_info", ""},
			{"POST", "/tokenize", `{"model":"m","prompt":"hi"}`},
			{"POST", "/detokenize", `{"model":"m","tokens":[1,2]}`},
		} {
			for _, auth := range []string{"", "Bearer wrong", "Bearer " + testKey + "x", testKey, "Basic " + testKey} {
				code, hdr, body := do(t, c.method, ts.URL+c.path, auth, c.body)
				if code != http.StatusUnauthorized {
					t.Fatalf("%s %s with %q: status %d, want 401", c.method, c.path, auth, code)
				}
				if e := openAIError(t, c.path, body); e.Error.Code == nil || *e.Error.Code != "invalid_api_key" {
					t.Fatalf("%s: code %v", c.path, e.Error.Code)
				}
				if hdr.Get("WWW-Authenticate") == "" {
					t.Fatalf("%s: no WWW-Authenticate", c.path)
				}
			}
			for _, auth := range []string{"Bearer " + testKey, "bearer " + testKey, "BEARER " + testKey} {
				if code, _, body := do(t, c.method, ts.URL+c.path, auth, c.body); code != http.StatusOK {
					t.Fatalf("%s %s with %q: status %d %s", c.method, c.path, auth, code, body)
				}
			}
		}
		if code, _, _ := do(t, "GET", ts.URL+"/health", "", ""); code != http.StatusOK {
			t.Fatalf("/health without a key: %d", code)
		}
		code, _, _ := do(t, "GET", ts.URL+"/metrics", "", "")
		if want := map[bool]int{false: 200, true: 401}[keyed]; code != want {
			t.Fatalf("--metrics-require-key=%v: /metrics without a key got %d, want %d", keyed, code, want)
		}
		if code, _, _ := do(t, "GET", ts.URL+"/metrics", "bearer "+testKey, ""); code != http.StatusOK {
			t.Fatalf("/metrics with the key: %d", code)
		}
	}
}

// noLeak returns a check that every goroutine started since (server,
// connections, handlers) has ended: a refused body leaves no reader behind.
func noLeak(t *testing.T) func() {
	base := runtime.NumGoroutine()
	return func() {
		http.DefaultClient.CloseIdleConnections()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				t.Fatalf("goroutines: %d now, %d before\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// rawRequest sends head and then whatever body writes on one connection
// and returns the status line and the response body that came back.
func rawRequest(t *testing.T, ts *httptest.Server, head string, body func(net.Conn)) (int, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, head); err != nil {
		t.Fatal(err)
	}
	if body != nil {
		go body(conn)
	}
	// A hang guard only: the answers asserted here come back at once.
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// endless writes a chunked body that never ends.
func endless(conn net.Conn) {
	for range 1000 {
		if _, err := io.WriteString(conn, "1\r\n{\r\n"); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A request without the key is answered before its body is read, even a
// body that never ends.
func TestUnauthorizedBeforeBody(t *testing.T) {
	defer noLeak(t)()
	ts, g := newTestServer(t, Options{APIKey: testKey, BodyReadTimeout: time.Hour})
	defer ts.Close()
	for _, head := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n",
	} {
		code, body := rawRequest(t, ts, head, endless)
		if code != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401", code)
		}
		openAIError(t, "401", body)
	}
	if g.calls.Load() != 0 {
		t.Fatal("the generator was called")
	}
}

func TestOversizeBody(t *testing.T) {
	defer noLeak(t)()
	ts, g := newTestServer(t, Options{BodyReadTimeout: time.Hour})
	defer ts.Close()
	// Declared too large: refused before a byte of it is read.
	code, body := rawRequest(t, ts, fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", maxBodyBytes+1), endless)
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("declared oversize: status %d, want 413", code)
	}
	openAIError(t, "413", body)
	// Sent without a length: refused once the limit is passed, without
	// reading on to the end.
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		chunk := []byte(strings.Repeat("x", 1<<20))
		_, _ = pw.Write([]byte(`{"model":"m","prompt":"`))
		for range 64 {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
		}
		_ = pw.CloseWithError(fmt.Errorf("the server should have stopped reading"))
	}()
	resp, err := http.Post(ts.URL+"/v1/completions", "application/json", pr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("chunked oversize: status %d %s", resp.StatusCode, b)
	}
	openAIError(t, "chunked 413", b)
	if g.calls.Load() != 0 {
		t.Fatal("the generator was called")
	}
}

func TestSlowBodyTimesOut(t *testing.T) {
	defer noLeak(t)()
	ts, g := newTestServer(t, Options{BodyReadTimeout: 300 * time.Millisecond})
	defer ts.Close()
	code, body := rawRequest(t, ts, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n",
		func(c net.Conn) { _, _ = io.WriteString(c, `{"model":"m",`) })
	if code != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", code)
	}
	openAIError(t, "408", body)
	if g.calls.Load() != 0 {
		t.Fatal("the generator was called")
	}
}

// The body deadline ends with the body: an answer that streams for longer
// than it is not cut.
func TestStreamOutlivesBodyDeadline(t *testing.T) {
	gen := &fakeGen{tokens: 8, delay: 100 * time.Millisecond}
	ts, _ := newTestServer(t, Options{Generator: gen, BodyReadTimeout: 200 * time.Millisecond})
	code, _, body := do(t, "POST", ts.URL+"/v1/chat/completions", "",
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8,"stream":true}`)
	if code != http.StatusOK || !strings.Contains(string(body), "data: [DONE]") || !strings.Contains(string(body), `"finish_reason":"length"`) {
		t.Fatalf("status %d, stream cut short: %s", code, body)
	}
}

func TestBodyErrorsHaveTheOpenAIShape(t *testing.T) {
	ts, _ := newTestServer(t, Options{})
	for _, body := range []string{`{"model":`, `[]`, `{"model":"m","prompt":1}`, "\xff"} {
		code, _, b := do(t, "POST", ts.URL+"/v1/completions", "", body)
		if code != http.StatusBadRequest {
			t.Fatalf("%q: status %d", body, code)
		}
		openAIError(t, body, b)
	}
	code, _, b := do(t, "GET", ts.URL+"/nope", "", "")
	if code != http.StatusNotFound {
		t.Fatalf("unknown route: %d", code)
	}
	openAIError(t, "404", b)
}

// A prompt whose length alone proves it cannot fit is refused without
// being tokenized: the answer names its byte length (what only this check
// says), and the request allocates about its body, not the gigabytes a
// tokenization of it takes.
func TestHugePromptRefusedBeforeTokenizing(t *testing.T) {
	ts, g := newTestServer(t, Options{MaxPromptTokens: func() int { return 511 }})
	huge := strings.Repeat("Once upon a time there was a dog. ", 20<<20/34)
	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions", fmt.Sprintf(`{"model":"m","prompt":%q}`, huge), "prompt"},
		{"/v1/chat/completions", fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, huge), "messages"},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		code, _, b := do(t, "POST", ts.URL+c.path, "", c.body)
		runtime.ReadMemStats(&after)
		if code != http.StatusBadRequest {
			t.Fatalf("%s: status %d %.200s", c.path, code, b)
		}
		e := openAIError(t, c.path, b)
		if !strings.Contains(e.Error.Message, "bytes long") || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Fatalf("%s: not refused by its length: %+v", c.path, e.Error)
		}
		// Client and server share this process: the body is counted a few
		// times over (request, read, JSON, template), a tokenization of it
		// would be well over a gigabyte.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 400<<20 {
			t.Fatalf("%s: %d MiB allocated for a %d MiB prompt", c.path, alloc>>20, len(huge)>>20)
		}
		if d := time.Since(start); d > 30*time.Second { // hang guard only
			t.Fatalf("%s: took %s", c.path, d)
		}
	}
	if g.calls.Load() != 0 {
		t.Fatal("the generator was called")
	}
	// A prompt that might fit is tokenized and goes on as before.
	if code, _, b := do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"Once upon a time","max_tokens":2}`); code != http.StatusOK {
		t.Fatalf("short prompt: %d %s", code, b)
	}
}

type statusErr struct{ status int }

func (e statusErr) Error() string {
	return "the KV handoff between the prefill and decode workers failed; retry the request"
}
func (e statusErr) HTTPStatus() int { return e.status }

// An engine's failure names its pages and checks in the log, under the
// request id, and not to the client; a generator's own status and words
// (the router's) pass as they are.
func TestGenerationErrorsLeakNothing(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	engineErr := errors.New("KV read gate refused the batch: page 12 is owned by room 3 epoch 4")
	for _, c := range []struct {
		name   string
		ev     scheduler.Event
		status int
		want   string
	}{
		{"engine failure", scheduler.Event{Finish: scheduler.FinishError, Err: engineErr}, 500, "generation failed inside the server"},
		{"engine abort", scheduler.Event{Finish: scheduler.FinishAbort, Err: errors.New("server shutting down")}, 503, "aborted"},
		{"router's status", scheduler.Event{Finish: scheduler.FinishError, Err: statusErr{502}}, 502, "the KV handoff"},
	} {
		for _, stream := range []bool{false, true} {
			gen := &fakeGen{fail: &c.ev}
			ts, _ := newTestServer(t, Options{Generator: gen, Logger: logger})
			code, hdr, b := do(t, "POST", ts.URL+"/v1/completions", "", fmt.Sprintf(`{"model":"m","prompt":"hi","stream":%v}`, stream))
			if stream {
				if code != 200 || !strings.Contains(string(b), c.want) || strings.Contains(string(b), "page 12") {
					t.Fatalf("%s, streamed: %d %s", c.name, code, b)
				}
				continue
			}
			if code != c.status {
				t.Fatalf("%s: status %d %s", c.name, code, b)
			}
			e := openAIError(t, c.name, b)
			if !strings.Contains(e.Error.Message, c.want) || strings.Contains(string(b), "page 12") || strings.Contains(string(b), "room") {
				t.Fatalf("%s: %s", c.name, b)
			}
			if c.status == 503 && hdr.Get("Retry-After") == "" {
				t.Fatalf("%s: no Retry-After", c.name)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "page 12 is owned by room 3") || !strings.Contains(logs.String(), "request_id=cmpl-") {
		t.Fatalf("the cause is not logged with the request id:\n%s", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// A refusal that carries its status (the router's failed handoff before any
// token) keeps it.
func TestRefusalKeepsItsStatus(t *testing.T) {
	ts, _ := newTestServer(t, Options{Generator: &fakeGen{refuse: statusErr{504}}})
	code, _, b := do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"hi"}`)
	if code != 504 {
		t.Fatalf("status %d %s", code, b)
	}
	openAIError(t, "504", b)
}

// Overload is a 429 with Retry-After whether the generator refuses at its
// door (standalone's full queue) or its stream fails before any token
// (the router's full workers); an outage stays a 503.
func TestOverloadIs429(t *testing.T) {
	for _, c := range []struct {
		name   string
		gen    *fakeGen
		status int
	}{
		{"queue full", &fakeGen{refuse: &scheduler.RejectError{Status: 429, Reason: "queue_full", Message: "server is at capacity; retry later"}}, 429},
		{"workers full", &fakeGen{fail: &scheduler.Event{Finish: scheduler.FinishError, Err: statusErr{429}}}, 429},
		{"no workers", &fakeGen{refuse: &scheduler.RejectError{Status: 503, Reason: "no_workers", Message: "no healthy worker", RetryAfter: 1}}, 503},
	} {
		ts, _ := newTestServer(t, Options{Generator: c.gen})
		code, hdr, b := do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"hi"}`)
		if code != c.status || hdr.Get("Retry-After") == "" {
			t.Fatalf("%s: %d Retry-After %q %s", c.name, code, hdr.Get("Retry-After"), b)
		}
		openAIError(t, c.name, b)
	}
}

// A known route under a wrong method is a 405 with Allow, as OpenAI
// answers; an unknown route a 404; both in OpenAI's shape.
func TestWrongMethodAndUnknownRoute(t *testing.T) {
	ts, _ := newTestServer(t, Options{})
	for _, c := range []struct {
		method, path string
		status       int
		allow        string
	}{
		{"GET", "/v1/completions", 405, "POST"},
		{"GET", "/v1/chat/completions", 405, "POST"},
		{"POST", "/v1/models", 405, "GET, HEAD"},
		{"PUT", "/health", 405, "GET, HEAD"},
		{"GET", "/v2/nothing", 404, ""},
	} {
		code, hdr, b := do(t, c.method, ts.URL+c.path, "", "")
		if code != c.status || hdr.Get("Allow") != c.allow {
			t.Fatalf("%s %s: %d Allow %q %s", c.method, c.path, code, hdr.Get("Allow"), b)
		}
		openAIError(t, c.method+" "+c.path, b)
	}
}

// While a server drains, /health says 503 and new generations are refused
// with 503 and Retry-After; other routes still answer.
func TestDrainRefusesNewWork(t *testing.T) {
	ts, g := newTestServer(t, Options{})
	srvOf(t, ts).Drain()
	code, hdr, b := do(t, "GET", ts.URL+"/health", "", "")
	if code != 503 || hdr.Get("Retry-After") == "" || !strings.Contains(string(b), "draining") {
		t.Fatalf("/health while draining: %d %s", code, b)
	}
	code, hdr, b = do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"hi"}`)
	if code != 503 || hdr.Get("Retry-After") == "" {
		t.Fatalf("a request while draining: %d %s", code, b)
	}
	openAIError(t, "draining", b)
	if g.calls.Load() != 0 {
		t.Fatal("the generator was called while draining")
	}
	if code, _, _ := do(t, "GET", ts.URL+"/v1/models", "", ""); code != 200 {
		t.Fatalf("/v1/models while draining: %d", code)
	}
}

func srvOf(t *testing.T, ts *httptest.Server) *Server {
	t.Helper()
	s, ok := ts.Config.Handler.(*Server)
	if !ok {
		t.Fatalf("handler %T", ts.Config.Handler)
	}
	return s
}

// ctxGen is a generator that waits in Generate (as the router does for
// the first token): each call waits until all n choices were asked, then
// until release closes or the client leaves.
type ctxGen struct {
	fakeGen
	n       int32
	asked   atomic.Int32
	all     chan struct{}
	release chan struct{}
	left    atomic.Int32
}

func (g *ctxGen) GenerateContext(ctx context.Context, id string, prompt []int32, p scheduler.Params) (Stream, error) {
	if g.asked.Add(1) == g.n {
		close(g.all)
	}
	for _, ch := range []chan struct{}{g.all, g.release} {
		select {
		case <-ch:
		case <-ctx.Done():
			g.left.Add(1)
			return nil, ctx.Err()
		}
	}
	return g.fakeGen.Generate(id, prompt, p)
}

// A generator that waits for the first token is asked for every choice of
// n at once (one after another, each choice would wait for the one before
// it), and is told when the client leaves while it waits.
func TestContextGenerator(t *testing.T) {
	g := &ctxGen{fakeGen: fakeGen{tokens: 2}, n: 3, all: make(chan struct{}), release: make(chan struct{})}
	close(g.release)
	ts, _ := newTestServer(t, Options{Generator: g})
	code, _, b := do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"hi","n":3,"max_tokens":2}`)
	if code != 200 || strings.Count(string(b), `"finish_reason":"length"`) != 3 {
		t.Fatalf("n=3: %d %s", code, b)
	}

	g = &ctxGen{fakeGen: fakeGen{tokens: 2}, n: 1, all: make(chan struct{}), release: make(chan struct{})}
	ts, _ = newTestServer(t, Options{Generator: g})
	ctx, leave := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi"}`))
	req.Header.Set("Content-Type", "application/json")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	select {
	case <-g.all:
	case <-time.After(5 * time.Second):
		t.Fatal("GenerateContext was not called")
	}
	leave()
	<-done
	deadline := time.Now().Add(5 * time.Second)
	for g.left.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the generator was not told the client left")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A standalone generation the spec guard stopped is the client's 500 with
// code spec_anomaly, in OpenAI's shape.
func TestSpecAnomalyIsAnError(t *testing.T) {
	ts, _ := newTestServer(t, Options{Generator: &fakeGen{fail: &scheduler.Event{Finish: scheduler.FinishSpecAnomaly,
		Err: &scheduler.SpecAnomalyError{Rule: "accept rate 1.000 above 0.960", Generated: 130}}}})
	code, _, b := do(t, "POST", ts.URL+"/v1/completions", "", `{"model":"m","prompt":"hi"}`)
	e := openAIError(t, "spec_anomaly", b)
	if code != 500 || e.Error.Code == nil || *e.Error.Code != scheduler.FinishSpecAnomaly || strings.Contains(e.Error.Message, "0.960") {
		t.Fatalf("status %d %s", code, b)
	}
}
