// Package bench is an OpenAI-compatible load generator: it streams
// completions from any server that speaks /v1/completions (baton,
// llama-server, vLLM, SGLang) and measures what a user of the server feels:
// time to first token, inter-token latency, end-to-end latency and
// throughput.
package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Config is one benchmark run.
type Config struct {
	// URL is the server's base address, e.g. http://127.0.0.1:8000; a
	// trailing /v1 or /v1/completions is accepted too.
	URL string
	// Model is the model name sent with every request; empty asks the
	// server's /v1/models and takes the first.
	Model string
	// Concurrency is the most requests in flight at once (default 1).
	Concurrency int
	// NumPrompts is how many requests are sent in all.
	NumPrompts int
	// InputLen is the prompt length in tokens as the server counts them
	// (its /tokenize); a server without that route gets InputLen words,
	// about as many tokens in the usual BPE vocabularies (see Prompt).
	InputLen int
	// OutputLen is max_tokens; ignore_eos asks the server to generate all
	// of them, so that every request does the same work.
	OutputLen int
	// RequestRate is the mean arrival rate in requests per second, with
	// exponential gaps between arrivals (a Poisson process); 0 or +Inf
	// sends every request at once, so Concurrency alone sets the load.
	RequestRate float64
	// APIKey is sent as a bearer token when set.
	APIKey string
	// Seed makes the prompts and arrival times repeatable.
	Seed uint64
	// SharedPrefixLen, when set, starts every prompt with one of
	// NumPrefixes shared prefixes of that many words (SGLang's
	// generated-shared-prefix workload: a system prompt many requests
	// share); InputLen words follow it. Prompt i takes prefix i mod
	// NumPrefixes.
	SharedPrefixLen int
	NumPrefixes     int
	// Echo makes every prompt an input-echoing request: the prompt's text,
	// an instruction to repeat it word for word, and the repeat's first
	// words (see echoPrompt). Output that copies the input is what
	// speculative decoding's prompt lookup drafts from.
	Echo bool
	// Temperature, when set, is sent with every request (0: greedy, as
	// SGLang's and vLLM's serving benchmarks send); unset leaves it to the
	// server's default.
	Temperature *float64
	// WarmupRequests are sent, at most Concurrency at once, before the
	// measured ones and left out of the report (SGLang's bench_serving
	// sends one): a server's first requests carry one-time work (weights
	// paged in or uploaded, kernels chosen, graphs captured) that a run of
	// a few prompts would otherwise count as serving. Their prompts are
	// drawn apart from the measured ones, which stay the same with or
	// without them and hit no prefix a warm-up left in the cache.
	WarmupRequests int
	// Progress, when set, is called after each request ends.
	Progress func(done, total int)
	// Client sends the requests; nil makes one sized for Concurrency.
	Client *http.Client
}

// Report is what a run measured. Latencies are in milliseconds.
type Report struct {
	URL         string  `json:"url"`
	Model       string  `json:"model"`
	Concurrency int     `json:"concurrency"`
	RequestRate float64 `json:"request_rate"` // 0: all at once
	InputLen    int     `json:"input_len"`
	OutputLen   int     `json:"output_len"`
	// WarmupRequests were sent before the run and are not in its figures.
	WarmupRequests int `json:"warmup_requests"`
	// PromptsMeasured says each prompt was cut to InputLen tokens with the
	// server's /tokenize; false: InputLen words (the server has no such
	// route).
	PromptsMeasured bool `json:"prompts_measured"`
	// MeanInputTokens is the mean prompt length of the completed
	// requests, from the usage the server reported.
	MeanInputTokens float64 `json:"mean_input_tokens"`

	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// FailedStreamedChunks counts the text chunks (a token or a few each)
	// that failed requests streamed before they failed: work the server
	// did that the output counts leave out. A server that ends some streams
	// with an error event is then set against the others by the tokens it
	// delivered, however far into a stream its error came.
	FailedStreamedChunks int `json:"failed_streamed_chunks"`
	// Errors are the distinct failure messages (at most 10), each with
	// how often it happened.
	Errors []ErrorCount `json:"errors,omitempty"`

	DurationS float64 `json:"duration_s"`
	// TotalInputTokens and TotalOutputTokens count completed requests,
	// from the usage the server reported; a server that reports none gets
	// InputLen per prompt and one token per streamed chunk.
	TotalInputTokens  int  `json:"total_input_tokens"`
	TotalOutputTokens int  `json:"total_output_tokens"`
	UsageReported     bool `json:"usage_reported"`
	// TotalCachedTokens is how many of the input tokens the server said it
	// read from its prefix cache (usage.prompt_tokens_details.cached_tokens).
	TotalCachedTokens int  `json:"total_cached_tokens"`
	SharedPrefixLen   int  `json:"shared_prefix_len,omitempty"`
	NumPrefixes       int  `json:"num_prefixes,omitempty"`
	Echo              bool `json:"echo,omitempty"`
	// SpecDraftTokens and SpecAcceptedTokens are what the server's
	// speculative decoding drafted and accepted during the run (its
	// /metrics counters before and after; absent from a server without
	// them), SpecAcceptRate their ratio.
	SpecDraftTokens    float64 `json:"spec_draft_tokens,omitempty"`
	SpecAcceptedTokens float64 `json:"spec_accepted_tokens,omitempty"`
	SpecAcceptRate     float64 `json:"spec_accept_rate,omitempty"`
	// Migrations are the requests a baton router continued on another
	// pair during the run, by reason (its baton_router_migrations_total
	// before and after; absent from other servers), MigrationsTotal their
	// sum, and MigrationStall the extra latency of a migrated request
	// (migrationFigures says how it is told).
	Migrations      map[string]float64 `json:"migrations,omitempty"`
	MigrationsTotal int                `json:"migrations_total,omitempty"`
	MigrationStall  Stats              `json:"migration_stall_ms,omitzero"`

	RequestThroughput     float64 `json:"request_throughput"`      // completed requests/s
	OutputThroughput      float64 `json:"output_throughput"`       // generated tokens/s
	TotalTokenThroughput  float64 `json:"total_token_throughput"`  // prompt + generated tokens/s
	MaxConcurrentRequests int     `json:"max_concurrent_requests"` // the most in flight at once

	TTFT Stats `json:"ttft_ms"`
	// TPOT is each request's time per output token after the first,
	// (e2e - ttft) / (tokens - 1).
	TPOT Stats `json:"tpot_ms"`
	// ITL is the gap between consecutive streamed chunks, over all
	// requests.
	ITL Stats `json:"itl_ms"`
	E2E Stats `json:"e2e_latency_ms"`
}

// ErrorCount is one failure message and how many requests ended with it.
type ErrorCount struct {
	Message string `json:"message"`
	Count   int    `json:"count"`
}

// Stats summarise one latency over a run, in milliseconds.
type Stats struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
	N    int     `json:"n"`
}

// result is one request as the client saw it.
type result struct {
	err          error
	promptTokens int
	outputTokens int
	cachedTokens int
	chunks       int // text chunks streamed
	usage        bool
	ttft, e2e    time.Duration
	itl          []time.Duration
}

// Run sends cfg.NumPrompts streamed completions and measures them. It
// returns an error when the configuration is unusable or no request
// succeeded; the report is returned either way once requests were sent.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	base, endpoint := endpoints(cfg.URL)
	client := cfg.Client
	if client == nil {
		// Go keeps 2 idle connections per host by default; a run with more
		// in flight would reconnect for most requests and time that.
		client = &http.Client{Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			MaxIdleConns:        cfg.Concurrency,
			MaxIdleConnsPerHost: cfg.Concurrency,
			IdleConnTimeout:     90 * time.Second,
		}}
		defer client.CloseIdleConnections()
	}
	if cfg.Model == "" {
		m, err := firstModel(ctx, client, base, cfg.APIKey)
		if err != nil {
			return nil, fmt.Errorf("no --model given and %s/v1/models did not name one: %w", base, err)
		}
		cfg.Model = m
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x62_61_74_6f_6e)) // "baton"
	runID := rand.Uint64()
	drawn := make([][]string, cfg.NumPrompts)
	for i := range drawn {
		// A word with its space is one token or more, so InputLen words
		// are at least InputLen tokens: enough to cut from.
		drawn[i] = strings.Fields(Prompt(rng, cfg.InputLen))
	}
	gaps := arrivals(rng, cfg.NumPrompts, cfg.RequestRate)
	prompts, measured, err := fitPrompts(ctx, client, base, cfg, drawn)
	if err != nil {
		return nil, err
	}
	if cfg.SharedPrefixLen > 0 {
		// The prefixes are drawn after everything else, so that the rest
		// of a run is the same with and without them.
		words := make([][]string, max(1, cfg.NumPrefixes))
		for i := range words {
			words[i] = strings.Fields(Prompt(rng, cfg.SharedPrefixLen))
		}
		pcfg := cfg
		pcfg.InputLen = cfg.SharedPrefixLen
		prefixes, _, err := fitPrompts(ctx, client, base, pcfg, words)
		if err != nil {
			return nil, err
		}
		for i := range prompts {
			prompts[i] = prefixes[i%len(prefixes)] + " " + prompts[i]
		}
	}

	if cfg.Echo {
		for i := range prompts {
			prompts[i] = echoPrompt(prompts[i])
		}
	}
	if err := warmUp(ctx, client, base, endpoint, cfg, runID); err != nil {
		return nil, err
	}
	d0, a0, spec := specCounters(ctx, client, base, cfg.APIKey)
	m0, migr := migrationCounters(ctx, client, base, cfg.APIKey)

	results := make([]result, cfg.NumPrompts)
	slots := make(chan struct{}, cfg.Concurrency)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		done     int
		inflight int
		peak     int
	)
	start := time.Now()
	next := start
	for i := range prompts {
		next = next.Add(gaps[i])
		if !sleepUntil(ctx, next) {
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		mu.Lock()
		inflight++
		peak = max(peak, inflight)
		mu.Unlock()
		wg.Go(func() {
			results[i] = stream(ctx, client, endpoint, cfg, prompts[i], fmt.Sprintf("baton-bench-%x-%d", runID, i))
			mu.Lock()
			inflight--
			done++
			// Under the lock, so that a progress bar never steps back.
			if cfg.Progress != nil {
				cfg.Progress(done, cfg.NumPrompts)
			}
			mu.Unlock()
			// The slot goes last: freed before the count, the next request
			// would be counted while this one still is.
			<-slots
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep := summarise(cfg, results, elapsed)
	rep.MaxConcurrentRequests = peak
	rep.WarmupRequests = cfg.WarmupRequests
	if d1, a1, ok := specCounters(ctx, client, base, cfg.APIKey); spec && ok && d1 > d0 {
		rep.SpecDraftTokens, rep.SpecAcceptedTokens = d1-d0, a1-a0
		rep.SpecAcceptRate = rep.SpecAcceptedTokens / rep.SpecDraftTokens
	}
	if m1, ok := migrationCounters(ctx, client, base, cfg.APIKey); migr && ok {
		rep.migrationFigures(m0, m1, results)
	}
	rep.PromptsMeasured = measured
	if rep.Completed == 0 {
		msg := "no request completed"
		if len(rep.Errors) > 0 {
			msg += ": " + rep.Errors[0].Message
		}
		return rep, errors.New(msg)
	}
	return rep, nil
}

func (c *Config) check() error {
	if c.Concurrency == 0 {
		c.Concurrency = 1
	}
	switch {
	case c.URL == "":
		return errors.New("no server URL")
	case c.Concurrency < 0:
		return errors.New("concurrency must be positive")
	case c.NumPrompts < 1:
		return errors.New("num-prompts must be at least 1")
	case c.InputLen < 1:
		return errors.New("input-len must be at least 1")
	case c.OutputLen < 1:
		return errors.New("output-len must be at least 1")
	case c.RequestRate < 0 || math.IsNaN(c.RequestRate):
		return errors.New("request-rate must be positive (0: send all at once)")
	case c.Temperature != nil && (*c.Temperature < 0 || math.IsNaN(*c.Temperature)):
		return errors.New("temperature must not be negative")
	case c.SharedPrefixLen < 0 || c.NumPrefixes < 0:
		return errors.New("shared-prefix-len and num-prefixes must not be negative")
	case c.WarmupRequests < 0:
		return errors.New("warmup-requests must not be negative")
	}
	return nil
}

// warmUp sends cfg.WarmupRequests completions of the run's lengths, at
// most cfg.Concurrency at once, and waits for them; one that fails fails
// the run (the measured requests would fail alike). Their prompts come
// from a generator of their own, so the measured prompts do not depend on
// them.
func warmUp(ctx context.Context, client *http.Client, base, endpoint string, cfg Config, runID uint64) error {
	if cfg.WarmupRequests == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x77_61_72_6d)) // "warm"
	drawn := make([][]string, cfg.WarmupRequests)
	for i := range drawn {
		drawn[i] = strings.Fields(Prompt(rng, cfg.InputLen))
	}
	prompts, _, err := fitPrompts(ctx, client, base, cfg, drawn)
	if err != nil {
		return err
	}
	errs := make([]error, len(prompts))
	slots := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	for i, p := range prompts {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			errs[i] = stream(ctx, client, endpoint, cfg, p, fmt.Sprintf("baton-bench-%x-warmup-%d", runID, i)).err
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("warm-up request failed (the run was not started): %w", err)
		}
	}
	return nil
}

// endpoints splits the URL a user gives into the server's base and the
// completions endpoint; users copy either from their client settings.
func endpoints(raw string) (base, completions string) {
	u := strings.TrimRight(strings.TrimSpace(raw), "/")
	if !strings.Contains(u, "://") {
		u = "http://" + u
	}
	u = strings.TrimSuffix(u, "/completions")
	u = strings.TrimSuffix(u, "/v1")
	return u, u + "/v1/completions"
}

// arrivals are the gaps before each request: none for the first, then
// exponential with mean 1/rate.
func arrivals(rng *rand.Rand, n int, rate float64) []time.Duration {
	gaps := make([]time.Duration, n)
	if rate <= 0 || math.IsInf(rate, 1) {
		return gaps
	}
	for i := 1; i < n; i++ {
		gaps[i] = time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
	}
	return gaps
}

func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// completionRequest is the body every request sends. ignore_eos is not in
// OpenAI's API but baton, vLLM, SGLang and llama-server all take it, and
// without it a model that stops early makes runs incomparable.
type completionRequest struct {
	Model         string        `json:"model"`
	Prompt        string        `json:"prompt"`
	MaxTokens     int           `json:"max_tokens"`
	Stream        bool          `json:"stream"`
	StreamOptions streamOptions `json:"stream_options"`
	IgnoreEOS     bool          `json:"ignore_eos"`
	Temperature   *float64      `json:"temperature,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// chunk is the part of a streamed completion chunk (or an error event)
// that the benchmark reads; everything else is ignored so that any
// server's extras decode.
type chunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// drainClose reads what is left of a response body (up to 64 KiB: the
// chunked terminator after [DONE], an error page) and closes it, so the
// connection goes back to the pool: closed unread, it is dropped, and the
// next request times a new connection.
func drainClose(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	body.Close()
}

// stream sends one request. key is its idempotency key: with it, Go's
// transport sends the request again on a new connection when the server
// closed a kept-alive one as the request went out (llama-server does; the
// request then failed with EOF, no response read, and was counted against
// the server). A server that answered anything is never asked twice.
func stream(ctx context.Context, client *http.Client, endpoint string, cfg Config, prompt, key string) (res result) {
	body, _ := json.Marshal(completionRequest{
		Model: cfg.Model, Prompt: prompt, MaxTokens: cfg.OutputLen, Stream: true,
		StreamOptions: streamOptions{IncludeUsage: true}, IgnoreEOS: true, Temperature: cfg.Temperature,
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		res.err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Idempotency-Key", key)
	if cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+cfg.APIKey)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		res.err = err
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		res.err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorMessage(b))
		return res
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var (
		last     time.Time
		chunks   int
		finished bool
	)
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // blank separators, comments, event: lines
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			finished = true
			drainClose(resp.Body) // the chunked terminator
			break
		}
		now := time.Now()
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			res.err = fmt.Errorf("bad stream event %.200q: %v", data, err)
			return res
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			res.err = fmt.Errorf("error event: %s", errorMessage(data))
			return res
		}
		if c.Usage != nil {
			res.usage = true
			res.promptTokens, res.outputTokens = c.Usage.PromptTokens, c.Usage.CompletionTokens
			if d := c.Usage.PromptTokensDetails; d != nil {
				res.cachedTokens = d.CachedTokens
			}
		}
		for _, ch := range c.Choices {
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				finished = true
			}
		}
		// A chunk that carries text is a token (or a few) reaching the
		// user; role-only, usage-only and empty final chunks are not.
		if len(c.Choices) == 0 || c.Choices[0].Text == "" {
			continue
		}
		if chunks == 0 {
			res.ttft = now.Sub(start)
		} else {
			res.itl = append(res.itl, now.Sub(last))
		}
		last = now
		chunks++
		res.chunks = chunks
	}
	if err := sc.Err(); err != nil {
		res.err = fmt.Errorf("reading the stream: %w", err)
		return res
	}
	if !finished {
		res.err = errors.New("the stream ended without a finish reason or [DONE]")
		return res
	}
	if chunks == 0 {
		res.err = errors.New("the stream carried no text")
		return res
	}
	res.e2e = time.Since(start)
	if !res.usage {
		res.promptTokens, res.outputTokens = cfg.InputLen, chunks
	}
	return res
}

// errorMessage pulls the message out of an OpenAI error body, or returns
// the body itself.
func errorMessage(b []byte) string {
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
		return e.Error.Message
	}
	return strings.TrimSpace(string(b))
}

func firstModel(ctx context.Context, client *http.Client, base, apiKey string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/models", nil)
	if err != nil {
		return "", err
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer drainClose(resp.Body)
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, errorMessage(b))
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return "", err
	}
	if len(list.Data) == 0 || list.Data[0].ID == "" {
		return "", errors.New("the list is empty")
	}
	return list.Data[0].ID, nil
}

func summarise(cfg Config, results []result, elapsed time.Duration) *Report {
	rep := &Report{
		URL: cfg.URL, Model: cfg.Model, Concurrency: cfg.Concurrency, RequestRate: cfg.RequestRate,
		InputLen: cfg.InputLen, OutputLen: cfg.OutputLen, DurationS: elapsed.Seconds(), UsageReported: true,
		SharedPrefixLen: cfg.SharedPrefixLen, Echo: cfg.Echo,
	}
	if cfg.SharedPrefixLen > 0 {
		rep.NumPrefixes = max(1, cfg.NumPrefixes)
	}
	var ttft, tpot, itl, e2e []time.Duration
	errs := map[string]int{}
	var order []string
	for _, r := range results {
		if r.err != nil {
			rep.Failed++
			rep.FailedStreamedChunks += r.chunks
			msg := r.err.Error()
			if errs[msg] == 0 {
				order = append(order, msg)
			}
			errs[msg]++
			continue
		}
		rep.Completed++
		rep.UsageReported = rep.UsageReported && r.usage
		rep.TotalInputTokens += r.promptTokens
		rep.TotalOutputTokens += r.outputTokens
		rep.TotalCachedTokens += r.cachedTokens
		ttft = append(ttft, r.ttft)
		e2e = append(e2e, r.e2e)
		itl = append(itl, r.itl...)
		if r.outputTokens > 1 {
			tpot = append(tpot, (r.e2e-r.ttft)/time.Duration(r.outputTokens-1))
		}
	}
	if rep.Completed == 0 {
		rep.UsageReported = false
	}
	for _, m := range order[:min(len(order), 10)] {
		rep.Errors = append(rep.Errors, ErrorCount{Message: m, Count: errs[m]})
	}
	if rep.Completed > 0 {
		rep.MeanInputTokens = float64(rep.TotalInputTokens) / float64(rep.Completed)
	}
	if s := elapsed.Seconds(); s > 0 {
		rep.RequestThroughput = float64(rep.Completed) / s
		rep.OutputThroughput = float64(rep.TotalOutputTokens) / s
		rep.TotalTokenThroughput = float64(rep.TotalInputTokens+rep.TotalOutputTokens) / s
	}
	rep.TTFT, rep.TPOT, rep.ITL, rep.E2E = stats(ttft), stats(tpot), stats(itl), stats(e2e)
	return rep
}

func stats(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	ms := make([]float64, len(ds))
	sum := 0.0
	for i, d := range ds {
		ms[i] = float64(d) / float64(time.Millisecond)
		sum += ms[i]
	}
	slices.Sort(ms)
	return Stats{
		Mean: sum / float64(len(ms)), P50: Percentile(ms, 50), P90: Percentile(ms, 90), P99: Percentile(ms, 99),
		Max: ms[len(ms)-1], N: len(ms),
	}
}

// Percentile is the p-th percentile of sorted values, interpolated
// linearly between the two nearest ranks (numpy's default), so that the
// figures compare with vLLM's and SGLang's benchmark scripts.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}
