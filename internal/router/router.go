// Package router is the front door in PD mode. It implements
// server.Generator: for each request it checks the prompt against the
// smallest capacity on the path, picks a decode and a prefill worker, has
// decode reserve pages, has prefill write into them, and relays decode's
// tokens as scheduler events. Workers are found and watched through their
// HTTP /health and /server_info and their gRPC Info.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/server"
	"github.com/batonlm/baton/internal/tracing"
)

// DefaultMaxMigrations is how many times a request is continued on another
// pair after its decode worker failed it mid-stream, unless told otherwise.
const DefaultMaxMigrations = 2

// DefaultDisaggPrefillThreshold is the longest uncached prompt a decode
// worker computes itself rather than have it handed over (SGLang's
// conditional disaggregation uses the same order of size).
const DefaultDisaggPrefillThreshold = 256

// Worker-selection policies.
const (
	PolicyRoundRobin = "round_robin"
	PolicyLeastLoad  = "least_load"
)

// Options configure a Router.
type Options struct {
	// Prefill and Decode are the workers' HTTP base URLs, e.g.
	// http://127.0.0.1:8100, or dns+http://NAME:PORT for one worker per
	// address of NAME, looked up again every ResolveInterval (see
	// DNSScheme).
	Prefill, Decode []string
	// Policy is PolicyRoundRobin (default), PolicyLeastLoad or
	// PolicyCacheAware.
	Policy string
	// CacheThreshold, BalanceAbsThreshold and BalanceRelThreshold tune
	// PolicyCacheAware (zero: SGLang's defaults, 0.5, 32 and 1.0001).
	CacheThreshold      float64
	BalanceAbsThreshold int
	BalanceRelThreshold float64
	// HealthInterval is how often every worker is probed (default 1 s).
	HealthInterval time.Duration
	// Retries is how many times a request that failed before its first
	// token is tried again on another pair: 0 means the default (2), a
	// negative value means never.
	Retries int
	// MaxMigrations is how many times a request whose decode worker failed
	// it after tokens reached the client (the worker went away, or reported
	// a failure of its own, or its spec guard stopped it) is continued on
	// another pair from the tokens the client has: 0 means the default
	// (2), a negative value means never.
	MaxMigrations int
	// DisaggPrefillThreshold is the longest prompt part a decode worker is
	// not thought to cache that it computes itself, with no handoff (a
	// decode worker that holds most of a prompt computes the rest itself
	// too): 0 means the default (DefaultDisaggPrefillThreshold), a
	// negative value means every prompt is handed over.
	DisaggPrefillThreshold int
	// APIKey, when set, is sent as a bearer token to the workers'
	// /server_info (which a worker started with --api-key protects).
	APIKey string
	// Metrics is the router's metric set (role "router"); nil makes one.
	Metrics *metrics.Set
	// Logger receives the router's logs; nil discards them.
	Logger *slog.Logger
	// Resolver looks up dns+http names; nil means net.DefaultResolver.
	Resolver Resolver
	// ResolveInterval is how often dns+http names are looked up again
	// (default 5 s; a name without workers is looked up at every probe).
	ResolveInterval time.Duration
	// ModelName and TokenizerFingerprint are what the router serves: a
	// worker reporting another served model or another tokenizer is not
	// paired (empty: not checked).
	ModelName, TokenizerFingerprint string
	// Auth proves the router to the workers and checks that each is the
	// role it is configured as; nil dials in plaintext (tests on loopback).
	Auth *auth.Plane
	// MaxQueued is how many requests may wait in the router's queue for a
	// decode worker with room (0: 1024; negative: no queue, such a request
	// gets 429 at once); QueueTimeout is how long one may wait (0: 60 s).
	MaxQueued    int
	QueueTimeout time.Duration
}

// Router picks workers for requests and relays their tokens.
type Router struct {
	o          Options
	policy     string
	retries    int
	migrations int // most migrations per request (Options.MaxMigrations)
	// localPrefill is Options.DisaggPrefillThreshold, 0 for never.
	localPrefill int
	// cache_aware's thresholds
	cacheThreshold float64
	balanceAbs     int
	balanceRel     float64
	log            *slog.Logger
	m              *metrics.Set
	rm             *routerMetrics
	http           *http.Client

	// prefill and decode change when dns+http names are looked up again;
	// they are replaced, never edited in place, under mu.
	prefill []*worker
	decode  []*worker
	disc    discovery

	mu         sync.Mutex // guards the worker lists, the workers' probed state and the round-robin cursors
	rrPrefill  int
	rrDecode   int
	mismatches map[[2]*worker]string // pairs refused for their layouts, logged once per difference

	inflight atomic.Int64
	closed   atomic.Bool
	done     chan struct{} // closed by Close
	queue    queue

	loopMu   sync.Mutex
	stopLoop context.CancelFunc
	loopDone chan struct{}
}

var _ server.Generator = (*Router)(nil)

// New checks the options and makes a router. It contacts no worker: Start
// (or Refresh) does.
func New(o Options) (*Router, error) {
	if len(o.Prefill) == 0 {
		return nil, errors.New("router: no prefill workers given")
	}
	if len(o.Decode) == 0 {
		return nil, errors.New("router: no decode workers given")
	}
	policy := o.Policy
	switch policy {
	case "":
		policy = PolicyRoundRobin
	case PolicyRoundRobin, PolicyLeastLoad, PolicyCacheAware:
	default:
		return nil, fmt.Errorf("router: unknown policy %q (%s, %s, %s)", o.Policy, PolicyRoundRobin, PolicyLeastLoad, PolicyCacheAware)
	}
	if o.CacheThreshold < 0 || o.CacheThreshold > 1 || o.BalanceAbsThreshold < 0 || o.BalanceRelThreshold < 0 {
		return nil, fmt.Errorf("router: cache_aware thresholds out of range (cache %v in [0,1], balance abs %d and rel %v not negative)",
			o.CacheThreshold, o.BalanceAbsThreshold, o.BalanceRelThreshold)
	}
	if o.CacheThreshold == 0 {
		o.CacheThreshold = DefaultCacheThreshold
	}
	if o.BalanceAbsThreshold == 0 {
		o.BalanceAbsThreshold = DefaultBalanceAbsThreshold
	}
	if o.BalanceRelThreshold == 0 {
		o.BalanceRelThreshold = DefaultBalanceRelThreshold
	}
	if o.HealthInterval <= 0 {
		o.HealthInterval = time.Second
	}
	retries := orDefault(o.Retries, 2)
	migrations := orDefault(o.MaxMigrations, DefaultMaxMigrations)
	localPrefill := orDefault(o.DisaggPrefillThreshold, DefaultDisaggPrefillThreshold)
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "router")
	m := o.Metrics
	if m == nil {
		m = metrics.New("router")
	}
	switch {
	case o.MaxQueued == 0:
		o.MaxQueued = 1024
	case o.MaxQueued < 0:
		o.MaxQueued = 0
	}
	if o.QueueTimeout <= 0 {
		o.QueueTimeout = time.Minute
	}
	r := &Router{
		o: o, policy: policy, retries: retries, migrations: migrations, localPrefill: localPrefill, log: log, m: m, rm: newRouterMetrics(m.Registerer),
		done: make(chan struct{}), queue: queue{max: o.MaxQueued, timeout: o.QueueTimeout},
		cacheThreshold: o.CacheThreshold, balanceAbs: o.BalanceAbsThreshold, balanceRel: o.BalanceRelThreshold,
		// Each probe's context bounds its requests, so the client needs no
		// timeout of its own.
		http:       &http.Client{},
		mismatches: map[[2]*worker]string{},
	}
	staticPrefill, staticDecode, err := r.disc.init(o)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, l := range []struct {
		role string
		urls []string
		into *[]*worker
	}{{rolePrefill, staticPrefill, &r.prefill}, {roleDecode, staticDecode, &r.decode}} {
		for _, raw := range l.urls {
			u, err := normalizeURL(raw)
			if err != nil {
				return nil, fmt.Errorf("router: %s worker %q: %w", l.role, raw, err)
			}
			if seen[u] {
				return nil, fmt.Errorf("router: worker %s is listed twice", u)
			}
			seen[u] = true
			*l.into = append(*l.into, newWorker(u, l.role, r.rm))
		}
	}
	r.disc.staticPrefill, r.disc.staticDecode = slices.Clone(r.prefill), slices.Clone(r.decode)
	return r, nil
}

func normalizeURL(raw string) (string, error) {
	s := strings.TrimRight(strings.TrimSpace(raw), "/")
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", fmt.Errorf("scheme %q is not http or https", u.Scheme)
	}
	if u.Host == "" {
		return "", errors.New("no host")
	}
	return s, nil
}

// Start probes every worker once, so that Ready is meaningful when it
// returns, then keeps probing every HealthInterval in the background until
// ctx ends or Close is called. Calling it again does nothing.
func (r *Router) Start(ctx context.Context) {
	r.loopMu.Lock()
	defer r.loopMu.Unlock()
	if r.stopLoop != nil || r.closed.Load() {
		return
	}
	ctx, cancel := context.WithCancel(ctx)
	r.stopLoop, r.loopDone = cancel, make(chan struct{})
	r.Refresh(ctx)
	go func() {
		defer close(r.loopDone)
		t := time.NewTicker(r.o.HealthInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.Refresh(ctx)
			}
		}
	}()
}

// Close stops the probe loop and closes the connections to the workers;
// requests still in flight end with an error.
func (r *Router) Close() {
	if r.closed.Swap(true) {
		return
	}
	close(r.done)
	r.loopMu.Lock()
	if r.stopLoop != nil {
		r.stopLoop()
		<-r.loopDone
	}
	r.loopMu.Unlock()
	r.mu.Lock()
	ws := append(append(r.drainingLocked(), r.prefill...), r.decode...)
	r.mu.Unlock()
	for _, w := range ws {
		w.close(&r.mu)
	}
	r.http.CloseIdleConnections()
}

// Ready says whether a request can be served now: at least one healthy
// prefill worker and one healthy decode worker whose KV layouts agree.
func (r *Router) Ready() bool {
	if r.closed.Load() {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.decode {
		if d.healthy && r.hasPartnerLocked(d) {
			return true
		}
	}
	return false
}

// Capacity is the path's limit over the healthy workers: maxSequence is
// the smallest max_sequence_tokens any of them reports (prompt plus
// completion must fit it on decode), and maxPrompt the longest prompt
// admitted (one token less, so that there is room to generate). Both are 0
// when no healthy prefill or decode worker is known.
func (r *Router) Capacity() (maxPrompt, maxSequence int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	lim := r.limitsLocked()
	if !lim.ok() {
		return 0, 0
	}
	seq := min(lim.prefill, lim.decode)
	return seq - 1, seq
}

// Workers describes every configured worker as last probed, for
// /server_info and for logs.
func (r *Router) Workers() []WorkerStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WorkerStatus, 0, len(r.prefill)+len(r.decode))
	for _, w := range append(append([]*worker(nil), r.prefill...), r.decode...) {
		out = append(out, w.statusLocked())
	}
	return out
}

// WorkerStatus is one worker as the router last saw it.
type WorkerStatus struct {
	URL      string `json:"url"`
	Role     string `json:"role"`
	Healthy  bool   `json:"healthy"`
	GRPCAddr string `json:"grpc_addr,omitempty"`
	// Error is why the worker is unhealthy.
	Error             string `json:"error,omitempty"`
	MaxSequenceTokens int    `json:"max_sequence_tokens,omitempty"`
	FreePages         int    `json:"free_pages,omitempty"`
	Running           int    `json:"running"`
	Queued            int    `json:"queued"`
	// InternalAuth is how the worker authenticates its peers.
	InternalAuth string `json:"internal_auth,omitempty"`
	// ServedModel and TokenizerFingerprint are the worker's identity, as
	// its Info reports it.
	ServedModel          string `json:"served_model,omitempty"`
	TokenizerFingerprint string `json:"tokenizer_fingerprint,omitempty"`
}

// IdentityRefusals lists, for each worker refused because it serves
// another model or tokenizer than the router, why; empty when none is.
func (r *Router) IdentityRefusals() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, w := range append(append([]*worker(nil), r.prefill...), r.decode...) {
		if w.identity != "" {
			out = append(out, w.role+" worker "+w.url+": "+w.identity)
		}
	}
	return out
}

// PairRefusals lists the healthy prefill/decode pairs refused because
// their KV layouts (or transports) differ, each with what differs; empty
// when none is.
func (r *Router) PairRefusals() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for k, diff := range r.mismatches {
		out = append(out, "prefill "+k[0].url+", decode "+k[1].url+": "+diff)
	}
	sort.Strings(out)
	return out
}

// limits are the smallest max_sequence_tokens reported by healthy workers;
// 0 means no healthy worker of that role reported one.
type limits struct{ prefill, decode int }

func (l limits) ok() bool { return l.prefill > 0 && l.decode > 0 }

func (r *Router) limitsLocked() limits {
	var l limits
	lowest := func(cur *int, ws []*worker) {
		for _, w := range ws {
			if !w.healthy || w.info == nil || w.info.MaxSequenceTokens == 0 {
				continue
			}
			if n := int(w.info.MaxSequenceTokens); *cur == 0 || n < *cur {
				*cur = n
			}
		}
	}
	lowest(&l.prefill, r.prefill)
	lowest(&l.decode, r.decode)
	return l
}

// gate refuses, before any worker is contacted, a request that cannot run
// on the path or that has no path at all. The wording follows the
// standalone engine's door so that clients see one message either way.
func (r *Router) gate(prompt []int32, p request.Params) *request.RejectError {
	if r.closed.Load() {
		return &request.RejectError{Status: 503, Reason: "no_workers", Message: "the router is shutting down", RetryAfter: 1}
	}
	if len(prompt) == 0 {
		return &request.RejectError{Status: 400, Reason: "empty_prompt", Message: "the prompt is empty"}
	}
	r.mu.Lock()
	lim := r.limitsLocked()
	r.mu.Unlock()
	if !lim.ok() {
		which := "prefill and decode workers"
		switch {
		case lim.prefill > 0:
			which = "decode worker"
		case lim.decode > 0:
			which = "prefill worker"
		}
		return &request.RejectError{Status: 503, Reason: "no_workers", Message: "no healthy " + which + " is available; retry later", RetryAfter: 1}
	}
	n, ctx := len(prompt), min(lim.prefill, lim.decode)
	switch {
	case n >= ctx:
		return &request.RejectError{Status: 400, Reason: "too_long", Message: fmt.Sprintf(
			"this model's maximum context length is %d tokens (prefill %d, decode %d); the prompt has %d tokens, leaving no room to generate",
			ctx, lim.prefill, lim.decode, n)}
	case p.MaxTokens > 0 && n+p.MaxTokens > lim.decode:
		return &request.RejectError{Status: 400, Reason: "too_long", Message: fmt.Sprintf(
			"this model's maximum context length is %d tokens (decode %d); you requested %d tokens (%d in the prompt, %d for the completion)",
			lim.decode, lim.decode, n+p.MaxTokens, n, p.MaxTokens)}
	}
	return nil
}

// Generate implements server.Generator: GenerateContext that no client
// can cancel before the first event.
func (r *Router) Generate(id string, prompt []int32, p request.Params) (server.Stream, error) {
	return r.GenerateContext(context.Background(), id, prompt, p)
}

// GenerateContext returns once the request's first event is ready (its
// first token, as a rule). Until then nothing has reached the client, so a
// refusal or a failure (capacity, no workers, decode's own door, a handoff
// that failed on every pair tried, a queue wait that timed out) is an error:
// a *request.RejectError, or an *Error. Anything later arrives as the
// stream's last event, whose Err is an *Error. ctx ending first (the client
// left) cancels the request. The caller must read the stream to its last
// event or call Cancel or Stop: the stream hands events over one at a time
// and holds its worker calls open until then.
func (r *Router) GenerateContext(ctx context.Context, id string, prompt []int32, p request.Params) (server.Stream, error) {
	log := tracing.Log(r.log.With("request_id", id), ctx)
	if rej := r.gate(prompt, p); rej != nil {
		r.m.Reject(rej.Reason)
		r.m.Outcome("rejected")
		log.Info("request rejected", "reason", rej.Reason, "status", rej.Status, "prompt_tokens", len(prompt), "max_tokens", p.MaxTokens, "msg", rej.Message)
		return nil, rej
	}
	s := newStream(r, id, prompt, p, log)
	s.traceBegin(ctx)
	started := make(chan error, 1)
	r.inflight.Add(1)
	r.gauges()
	go s.run(started)
	var err error
	select {
	case err = <-started:
	case <-ctx.Done():
		// run sees the Cancel at its next step and tells decode, if it
		// holds a reservation, and counts the request aborted.
		s.Cancel()
		return nil, ctx.Err()
	}
	if err != nil {
		var rej *request.RejectError
		if errors.As(err, &rej) {
			r.m.Reject(rej.Reason)
			r.m.Outcome("rejected")
		} else {
			r.m.Outcome("error")
		}
		log.Warn("request refused", "err", err)
		return nil, err
	}
	return s, nil
}

// InFlight is the number of generations the router has accepted and not
// yet ended: what a drain waits for.
func (r *Router) InFlight() int { return int(r.inflight.Load()) }

func (r *Router) streamEnded() {
	r.inflight.Add(-1)
	r.gauges()
	// The request's pages come free once decode drained it: the head of
	// the queue may fit now (it polls for the moment they do).
	r.queue.kick()
}

// gauges sets the running and queued figures: requests in flight through
// a pair, and requests waiting in the queue for room.
func (r *Router) gauges() {
	q := r.queue.len()
	r.m.Queued.Set(float64(q))
	r.m.Running.Set(float64(max(0, int(r.inflight.Load())-q)))
}

// untriedDecode reports whether a healthy decode worker with a partner is
// not among those this request already tried.
func (r *Router) untriedDecode(avoid map[*worker]bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.decode {
		if d.healthy && d.conn != nil && !avoid[d] && r.hasPartnerLocked(d) {
			return true
		}
	}
	return false
}

// Error is a generation that failed after the router accepted it; it is
// the Err of a request.FinishError event. Status is the HTTP status the
// client should see.
type Error struct {
	Status  int
	Message string
}

func (e *Error) Error() string { return e.Message }

// HTTPStatus is the status the HTTP surface should answer with.
func (e *Error) HTTPStatus() int { return e.Status }

func (r *Router) compatibleLocked(p, d *worker) bool {
	return p.info != nil && d.info != nil && pairDiff(p.info, d.info) == ""
}

// pairDiff is what keeps a prefill and a decode worker from pairing: their
// KV layouts, or the transport they move KV with.
func pairDiff(p, d *pdv1.WorkerInfo) string {
	diff := pdv1.LayoutDiff(p.Layout, d.Layout, "prefill", "decode")
	if pt, dt := transportName(p), transportName(d); pt != dt {
		if diff != "" {
			diff += ", "
		}
		diff += fmt.Sprintf("transport (prefill %s, decode %s)", pt, dt)
	}
	return diff
}

func transportName(w *pdv1.WorkerInfo) string {
	if w.GetTransport() == "" {
		return "tcp"
	}
	return w.GetTransport()
}

func (r *Router) hasPartnerLocked(d *worker) bool {
	for _, p := range r.prefill {
		if p.healthy && r.compatibleLocked(p, d) {
			return true
		}
	}
	return false
}

// checkPairsLocked logs each healthy prefill/decode pair whose layouts
// differ, once per difference, so that a misconfigured deployment says why
// it is not serving without repeating itself every probe.
func (r *Router) checkPairsLocked() {
	for _, p := range r.prefill {
		for _, d := range r.decode {
			key := [2]*worker{p, d}
			if !p.healthy || !d.healthy || p.info == nil || d.info == nil {
				continue
			}
			diff := pairDiff(p.info, d.info)
			if diff == "" {
				if _, was := r.mismatches[key]; was {
					r.log.Info("prefill/decode pair now agrees on the KV layout", "prefill", p.url, "decode", d.url)
					delete(r.mismatches, key)
				}
				continue
			}
			if r.mismatches[key] == diff {
				continue
			}
			r.mismatches[key] = diff
			r.rm.mismatch.Inc()
			r.log.Error("refusing prefill/decode pair: their KV layouts differ in "+diff,
				"prefill", p.url, "decode", d.url, "differs", diff)
		}
	}
}

// pair is an attempt's workers: a decode worker and a prefill worker whose
// layout agrees with it, or (local) the decode worker alone, which computes
// the prompt itself.
type pair struct {
	d, p  *worker
	dc    pdv1.DecodeClient
	pc    pdv1.PrefillClient
	local bool
}

// pick chooses a pair for a prompt. Workers in avoid (those that just
// failed this request) are passed over while any other will do.
func (r *Router) pick(avoid map[*worker]bool, prompt []int32, tenant request.Salt) (pair, error) {
	promptTokens := len(prompt)
	r.mu.Lock()
	defer r.mu.Unlock()
	var decodes []*worker
	for _, w := range r.decode {
		if w.healthy && w.conn != nil && r.hasPartnerLocked(w) {
			decodes = append(decodes, w)
		}
	}
	if len(decodes) == 0 {
		return pair{}, r.noPairLocked()
	}
	var d, p *worker
	held := 0 // prompt tokens the chosen decode worker is thought to cache
	if r.policy == PolicyCacheAware {
		ds := preferOthers(decodes, avoid)
		ps := int(ds[0].info.GetLayout().GetPageSize())
		var pages int
		d, pages = r.chooseCacheAware(ds, promptKeys(tenant, prompt, ps), roleDecode)
		held = pages * ps
	} else {
		d = r.choose(preferOthers(decodes, avoid), roleDecode)
	}
	// Between probes the workers' reported load is stale; count what this
	// router sent them since so that least_load does not pile a burst of
	// requests onto one worker.
	d.assigned++
	if ps := d.info.GetLayout().GetPageSize(); ps > 0 {
		d.assignedPages += (promptTokens + int(ps) - 1) / int(ps)
	}
	if r.computesHere(d, promptTokens, held) {
		r.holdLocked(d)
		return pair{d: d, dc: pdv1.NewDecodeClient(d.conn), local: true}, nil
	}
	var prefills []*worker
	for _, w := range r.prefill {
		if w.healthy && w.conn != nil && r.compatibleLocked(w, d) {
			prefills = append(prefills, w)
		}
	}
	if len(prefills) == 0 {
		return pair{}, r.noPairLocked()
	}
	if r.policy == PolicyCacheAware {
		p, _ = r.chooseCacheAware(preferOthers(prefills, avoid), promptKeys(tenant, prompt, int(d.info.GetLayout().GetPageSize())), rolePrefill)
	} else {
		p = r.choose(preferOthers(prefills, avoid), rolePrefill)
	}
	p.assigned++
	r.holdLocked(d, p)
	return pair{d: d, p: p, dc: pdv1.NewDecodeClient(d.conn), pc: pdv1.NewPrefillClient(p.conn)}, nil
}

// computesHere says whether decode worker d computes a prompt of n tokens
// itself rather than have it handed over: d can, and the prompt's part it
// is not thought to hold (held tokens, the cache_aware record) is at most
// the threshold, or it holds most of it. Moving a short prompt's KV costs
// more than computing it where it decodes (SGLang's and llm-d's
// conditional disaggregation).
func (r *Router) computesHere(d *worker, n, held int) bool {
	if r.localPrefill <= 0 || !d.info.GetPrefillsLocally() {
		return false
	}
	return n-held <= r.localPrefill || 2*held > n
}

func (r *Router) noPairLocked() error {
	healthyP, healthyD := 0, 0
	for _, w := range r.prefill {
		if w.healthy {
			healthyP++
		}
	}
	for _, w := range r.decode {
		if w.healthy {
			healthyD++
		}
	}
	msg := msgNoPair
	if healthyP > 0 && healthyD > 0 {
		// Which workers differ, and in what, is for the operator:
		// checkPairsLocked logged it with their addresses.
		msg = "no healthy prefill/decode pair agrees on the KV layout; retry later"
	}
	return &request.RejectError{Status: 503, Reason: "no_workers", Message: msg, RetryAfter: 1}
}

func preferOthers(ws []*worker, avoid map[*worker]bool) []*worker {
	if len(avoid) == 0 {
		return ws
	}
	var rest []*worker
	for _, w := range ws {
		if !avoid[w] {
			rest = append(rest, w)
		}
	}
	if len(rest) == 0 {
		return ws
	}
	return rest
}

// choose applies the policy to a non-empty candidate list (in configured
// order, so that ties go to the first listed).
func (r *Router) choose(ws []*worker, role string) *worker {
	if r.policy == PolicyRoundRobin {
		cur := &r.rrPrefill
		if role == roleDecode {
			cur = &r.rrDecode
		}
		w := ws[*cur%len(ws)]
		*cur++
		return w
	}
	best := ws[0]
	for _, w := range ws[1:] {
		if role == rolePrefill {
			if w.prefillLoad() < best.prefillLoad() {
				best = w
			}
			continue
		}
		wf, bf := w.decodeFree(), best.decodeFree()
		if wf > bf || (wf == bf && w.decodeRunning() < best.decodeRunning()) {
			best = w
		}
	}
	return best
}

// orDefault reads a count option: 0 is def, a negative value none.
func orDefault(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// workers are the pair's workers, held for the attempt.
func (pr pair) workers() []*worker {
	if pr.p == nil {
		return []*worker{pr.d}
	}
	return []*worker{pr.d, pr.p}
}
