// Package scheduler runs requests through their lifecycle: admission with a
// capacity gate, continuous batching, chunked prefill, and release of pages.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/model/expsum"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

// Config bounds what the engine takes on.
type Config struct {
	// Role is what the engine's requests are: standalone (prefill and decode
	// here), prefill (compute the prompt, hand it on) or decode (take a
	// handed-over prompt and generate).
	Role Role
	// ContextLength is the effective maximum sequence length: the model's
	// context lowered to what the pool can hold.
	ContextLength int
	// MaxRunning caps the requests in the running batch.
	MaxRunning int
	// ChunkSize caps the prompt tokens prefilled in one step.
	ChunkSize int
	// MaxQueue caps requests waiting for admission; more are refused with
	// 429, which clients and SDKs retry after Retry-After.
	MaxQueue int
	// PreemptAfter, when positive, lets a request that has waited that long
	// for a full batch take the slot of the running request that has
	// generated the most (standalone only); 0 never preempts.
	PreemptAfter time.Duration
	// IsEOG says whether a token ends generation (EOS, EOT).
	IsEOG func(int32) bool
	// Constrain makes the matchers of requests with a Constraint
	// (structured output); nil refuses such requests.
	Constrain Constrainer
	// MaskBudget bounds a constrained request's mask work beyond a small
	// allowance per token (grammarwork.go); 0 means a second.
	MaskBudget time.Duration
	// PrefixCache, when set (standalone only), lets a request read the
	// shared pages of an earlier request of its tenant with the same
	// prefix, and publishes its own complete prompt pages for later ones.
	PrefixCache *prefixcache.Cache
	// Tiers, with PrefixCache, are the cache's lower tiers (host memory,
	// files): a prefix found there is loaded back into the pool.
	Tiers *hicache.Tiers
	// Spec turns on speculative decoding (standalone and decode).
	Spec SpecConfig
	// SpecGuard stops a speculating generation whose accept figures say
	// its KV is suspect (FinishSpecAnomaly).
	SpecGuard SpecGuard
	// Guards are the engine's isolation checks; the zero value is every
	// check (guards.go).
	Guards Guards
	// Faults are injected only by the faults build's command; the zero
	// value injects none.
	Faults Faults
}

// RejectError is a refusal at the door: the request allocated nothing.
type RejectError = request.RejectError

// Engine is the standalone scheduler: one loop owns the model and the pool.
type Engine struct {
	model *model.Model
	pool  *kvpool.Pool
	cfg   Config
	m     *metrics.Set

	mu       sync.Mutex
	inbox    []*Request
	msgs     []message // for the loop, in the order they were sent
	stopped  bool      // Run returned: messages are answered ErrStopped
	wake     chan struct{}
	nextRoom uint64
	queued   int // requests submitted but not yet admitted (inbox + waiting)

	// deferredStops are Stop messages for requests not decoding yet (loop only).
	deferredStops []message

	nRunning, nQueued atomic.Int32

	waiting []*Request // FIFO
	// ready holds committed decode requests waiting for a batch slot; they
	// hold their pages already.
	ready   []*Request
	running []*Request
	sampler model.Sampler
	// samplers are the scratch of sampleDraws' ranges, one per range
	// running at a time.
	samplers sync.Pool
	draws    []pendingDraw // the step's tokens to sample (step only)
	// onDevice samples the step's draws where the logits are, when the
	// backend can (a kernels.RowSampler): the logits then stay there,
	// and a step brings them to the host only for a member that reads
	// them (prompt logprobs, a draft's verification, a deferred draw).
	onDevice kernels.RowSampler
	devRows  model.DeviceRows
	drafter  drafter
	eog      []int32    // the tokens IsEOG accepts, banned before min_tokens
	traits   roleTraits // what the role changes in the loop (step.go)
	// maskSlots bounds the mask workers running at once (grammarwork.go).
	maskSlots chan struct{}
}

// NewEngine makes an engine; Run drives it.
func NewEngine(m *model.Model, pool *kvpool.Pool, cfg Config, ms *metrics.Set) *Engine {
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 512
	}
	if cfg.MaxRunning <= 0 {
		cfg.MaxRunning = 64
	}
	if cfg.MaxQueue <= 0 {
		cfg.MaxQueue = 1024
	}
	if cfg.IsEOG == nil {
		cfg.IsEOG = func(int32) bool { return false }
	}
	cfg.Guards = cfg.Guards.withChecks()
	cfg.Faults = cfg.Faults.withNone()
	ms.KVPagesCapacity.Set(float64(pool.NumPages()))
	ms.KVPagesFree.Set(float64(pool.Free()))
	ms.TokenUsage.Set(1 - float64(pool.Free())/float64(max(1, pool.NumPages())))
	m.Reserve(stepRows(cfg), cfg.MaxRunning)
	e := &Engine{model: m, pool: pool, cfg: cfg, m: ms, wake: make(chan struct{}, 1), drafter: newDrafter(cfg.Spec), traits: traitsOf(cfg.Role),
		maskSlots: make(chan struct{}, maskWorkers())}
	e.samplers.New = func() any { return new(model.Sampler) }
	e.onDevice, _ = m.Backend().(kernels.RowSampler)
	for id := range int32(m.Config.Vocab) {
		if cfg.IsEOG(id) {
			e.eog = append(e.eog, id)
		}
	}
	return e
}

// stepRows is the most rows an ordinary step of a cfg engine runs: a
// prompt chunk (standalone and prefill) and one row of each running
// request (standalone and decode). Speculative steps and prompts that
// want every row's logits may run more; the model grows for those.
func stepRows(cfg Config) int {
	switch cfg.Role {
	case RolePrefill:
		return cfg.ChunkSize
	case RoleDecode:
		return cfg.MaxRunning
	}
	return cfg.ChunkSize + cfg.MaxRunning
}

// Pool is the engine's KV pool.
func (e *Engine) Pool() *kvpool.Pool { return e.pool }

// Config is the engine's effective configuration.
func (e *Engine) Config() Config { return e.cfg }

// Enqueue is the engine's one entry. A standalone or prefill request is
// checked at the door: a refused one moves to Rejected and allocates
// nothing, an accepted one waits for admission. A decode request comes in
// verified (its Handover's checks passed: Verifying, with prefill's first
// token) and joins the batch with the pages Reserve set aside; an error
// means it had ended, or the engine has stopped.
func (e *Engine) Enqueue(r *Request) error {
	if !e.takes(r.life.Role()) {
		return fmt.Errorf("scheduler: a %s engine cannot take a %s request", e.cfg.Role, r.life.Role())
	}
	if r.life.Role() == RoleDecode {
		if r.eng != e {
			return fmt.Errorf("scheduler: decode request %s was not reserved on this engine", r.ID)
		}
		return e.call(message{kind: msgEnqueue, r: r}).err
	}
	if rej := door(e, r); rej != nil {
		return e.reject(r, rej)
	}
	r.eng = e
	e.mu.Lock()
	if e.queued >= e.cfg.MaxQueue {
		e.mu.Unlock()
		// 429 rather than 503: the server is up and merely busy, and OpenAI's
		// SDKs retry a 429 by default.
		return e.reject(r, &RejectError{Status: 429, Reason: "queue_full", Message: "server is at capacity; retry later", RetryAfter: 1})
	}
	e.nextRoom++
	r.room = e.nextRoom
	e.queued++
	r.queuedAt = time.Now()
	e.inbox = append(e.inbox, r)
	e.m.QueuedTotal.Inc()
	e.mu.Unlock()
	e.poke()
	return nil
}

// takes says whether the engine runs requests of a role: its own, and on
// a decode engine standalone ones too (a prompt its worker computes
// itself rather than have it handed over, DESIGN's short-prompt path).
func (e *Engine) takes(role Role) bool {
	return role == e.cfg.Role || (e.cfg.Role == RoleDecode && role == RoleStandalone)
}

// CheckDoor runs Enqueue's door checks without queueing r, so a worker can
// refuse a request before it opens anything on its behalf (a transport
// session). A refused request is moved to Rejected.
func (e *Engine) CheckDoor(r *Request) error {
	if rej := door(e, r); rej != nil {
		return e.reject(r, rej)
	}
	return nil
}

// reject moves r to Rejected: it holds nothing and is answered once.
func (e *Engine) reject(r *Request, rej *RejectError) error {
	if err := r.life.To(StateRejected, rej.Message); err != nil {
		return err
	}
	e.m.Reject(rej.Reason)
	e.m.Outcome("rejected")
	return rej
}

// Reserve is a decode worker's door: it checks a handed-over request like
// Enqueue does, then allocates pages for its whole sequence and names writer
// as the second owner of the prompt's pages. A refusal is terminal and
// allocates nothing. The Handover it returns makes the request's moves
// until its Commit is verified and it comes back through Enqueue: until
// then the loop does not see it.
func (e *Engine) Reserve(r *Request) (*Handover, error) {
	if e.cfg.Role != RoleDecode || r.life.Role() != RoleDecode {
		return nil, fmt.Errorf("scheduler: Reserve is for decode requests on a decode engine")
	}
	if rej := door(e, r); rej != nil {
		return nil, e.reject(r, rej)
	}
	e.mu.Lock()
	e.nextRoom++
	room := e.nextRoom
	e.mu.Unlock()
	a, held, err := e.reservePages(r, room)
	if err != nil {
		return nil, e.reject(r, &RejectError{Status: 503, Reason: "no_space", RetryAfter: 1,
			Message: fmt.Sprintf("no room for %d tokens in the KV pool now; retry later", e.maxSeqLen(r))})
	}
	// The writer gets the prompt pages decode does not hold already.
	prompt := a.Pages[len(held):e.pool.PagesFor(len(r.Prompt))]
	if err := e.pool.AttachWriter(a.Owner, prompt); err != nil {
		_ = e.pool.Release(a.Owner, a.Pages)
		return nil, err
	}
	if err := r.life.To(StateReserved, ""); err != nil {
		e.must(r, err)
		_ = e.pool.WriterClosed(a.Owner, prompt, "reservation never handed out")
		_ = e.pool.Release(a.Owner, a.Pages)
		return nil, err
	}
	r.room, r.owner, r.pages, r.promptPages, r.held, r.eng = room, a.Owner, a.Pages, prompt, held, e
	e.poolGauges()
	return &Handover{r: r, e: e}, nil
}

// door is every entry's check in Received: Enqueue, CheckDoor and Reserve
// all call it, so a request is judged by one rule whichever way it came
// in.
func door(e *Engine, r *Request) *RejectError { return e.cfg.Guards.Door(e, r) }

// readable is the read gate's question: may this step read every position
// it attends over, beyond those it writes itself?
func readable(e *Engine, r *Request) error { return e.cfg.Guards.ReadGate(e, r) }

func (e *Engine) checkReadable(r *Request) error {
	return e.pool.CheckReadable(r.owner, r.pages, r.computed)
}

// checkDoor refuses what the engine cannot hold or read: an empty prompt,
// one that fills the context, a completion past it, a token outside the
// vocabulary.
func (e *Engine) checkDoor(r *Request) *RejectError {
	n, ctx := len(r.Prompt), e.cfg.ContextLength
	vocab := e.model.Config.Vocab
	switch {
	case n == 0:
		return &RejectError{Status: 400, Reason: "empty_prompt", Message: "the prompt is empty"}
	case n >= ctx:
		return &RejectError{Status: 400, Reason: "too_long", Message: fmt.Sprintf(
			"this model's maximum context length is %d tokens; the prompt has %d tokens, leaving no room to generate", ctx, n)}
	case r.Params.MaxTokens > 0 && n+r.Params.MaxTokens > ctx && !r.traits().handsOn: // prefill holds only the prompt
		return &RejectError{Status: 400, Reason: "too_long", Message: fmt.Sprintf(
			"this model's maximum context length is %d tokens; you requested %d tokens (%d in the prompt, %d for the completion)",
			ctx, n+r.Params.MaxTokens, n, r.Params.MaxTokens)}
	}
	for _, t := range r.Prompt {
		if t < 0 || int(t) >= vocab {
			return &RejectError{Status: 400, Reason: "bad_token", Message: fmt.Sprintf("token id %d is outside the vocabulary (0..%d)", t, vocab-1)}
		}
	}
	return nil
}

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Run is the scheduler loop; it returns when ctx ends, aborting what is left.
func (e *Engine) Run(ctx context.Context) {
	for {
		e.takeInbox()
		e.admit()
		e.maybePreempt()
		e.admit()
		if len(e.running) == 0 {
			select {
			case <-ctx.Done():
				e.shutdown()
				return
			case <-e.wake:
			}
			continue
		}
		if ctx.Err() != nil {
			e.shutdown()
			return
		}
		if !e.step() && e.allWaiting() {
			// Every running request waits for a load or a mask: the
			// loader and the mask workers poke the loop when one ends.
			select {
			case <-ctx.Done():
				e.shutdown()
				return
			case <-e.wake:
			}
		}
	}
}

// takeInbox takes new requests and messages together, so that a message
// about a request submitted before it finds the request in the loop's
// queues.
func (e *Engine) takeInbox() {
	e.mu.Lock()
	in, msgs := e.inbox, e.msgs
	e.inbox, e.msgs = nil, nil
	e.mu.Unlock()
	e.waiting = append(e.waiting, in...)
	e.handle(msgs)
	e.gauges()
}

// deliverFirst emits the token prefill sampled and enters the batch.
func (e *Engine) deliverFirst(r *Request) {
	if err := r.life.To(StateDecoding, ""); err != nil {
		e.must(r, err)
		e.fail(r, err)
		return
	}
	// Prefill chose it under the same constraint; the matcher here starts
	// from it.
	if err := e.follow(r, r.first.ID); err != nil {
		e.fail(r, err)
		return
	}
	first := *r.first
	r.first = nil
	e.running = append(e.running, r)
	e.deliver(r, first)
}

// Load is the number of running and waiting requests (safe from any goroutine).
func (e *Engine) Load() (running, queued int) {
	return int(e.nRunning.Load()), int(e.nQueued.Load())
}

// gauges publishes the loop's figures; only the loop calls it.
func (e *Engine) gauges() {
	e.nRunning.Store(int32(len(e.running)))
	e.nQueued.Store(int32(len(e.waiting) + len(e.ready)))
	e.m.Running.Set(float64(len(e.running)))
	e.m.Queued.Set(float64(len(e.waiting) + len(e.ready)))
	e.poolGauges()
}

// poolGauges publishes the pool's figures; safe from any goroutine.
func (e *Engine) poolGauges() {
	st := e.pool.Stats()
	e.m.ReleaseErrors.Set(float64(st.ReleaseErrors))
	e.m.KVPagesFree.Set(float64(st.Free))
	e.m.KVPagesQuarantined.Set(float64(st.Quarantined))
	e.m.KVPagesCached.Set(float64(st.Cached))
	e.m.KVSharedWriteRefusals.Set(float64(st.SharedWriteRefusals))
	// Cached pages are free for the taking (eviction), so they do not
	// count as used.
	e.m.TokenUsage.Set(float64(st.Used()) / float64(max(1, st.Total)))
	if c := e.cfg.PrefixCache; c != nil {
		cs := c.Stats()
		e.m.PrefixCacheHitRate.Set(cs.HitRate())
	}
}

func (e *Engine) dequeued() {
	e.mu.Lock()
	e.queued--
	e.mu.Unlock()
}

// admit moves waiting requests into the running batch while their whole
// sequence (prompt plus the tokens they may generate) fits in free pages.
// Reserving it all up front means a running request never waits for a page
// and never has to be evicted. FIFO: a large request at the head is not
// overtaken, so it cannot starve.
func (e *Engine) admit() {
	for len(e.ready) > 0 && len(e.running) < e.cfg.MaxRunning {
		r := e.ready[0]
		e.ready = e.ready[1:]
		e.deliverFirst(r)
	}
	for len(e.waiting) > 0 && len(e.running) < e.cfg.MaxRunning {
		r := e.waiting[0]
		if r.life.State() == StatePreempted {
			// Re-admission: it kept its pages, its KV and its sampler; it
			// resumes where it stopped.
			e.waiting = e.waiting[1:]
			e.dequeued()
			if err := r.life.To(StateAdmitted, ""); err != nil {
				e.must(r, err)
				e.fail(r, err)
				continue
			}
			e.running = append(e.running, r)
			continue
		}
		a, cached, err := allocate(e, r)
		if err != nil {
			break
		}
		e.waiting = e.waiting[1:]
		e.dequeued()
		if err := r.life.To(StateAdmitted, ""); err != nil {
			e.must(r, err)
			_ = e.pool.Release(a.Owner, a.Pages)
			e.fail(r, err)
			continue
		}
		r.owner, r.pages, r.computed, r.cached = a.Owner, a.Pages, cached, cached
		e.shipCached(r)
		r.seq = append([]int32(nil), r.Prompt...)
		r.rng = requestRNG(r.Params.Seed)
		e.running = append(e.running, r)
	}
	e.gauges()
}

// requestRNG is a request's random stream: from its seed, so that the same
// seed gives the same text, else from a fresh one.
func requestRNG(seed *uint64) *rand.Rand {
	s := rand.Uint64()
	if seed != nil {
		s = *seed
	}
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// needPages is what admitting r takes from the pool: nothing for a
// preempted request, which kept its pages.
func (e *Engine) needPages(r *Request) int {
	if r.life.State() == StatePreempted {
		return 0
	}
	return e.pool.PagesFor(e.maxSeqLen(r))
}

// maybePreempt gives a slot of a full batch to a request that has waited
// longer than PreemptAfter, by taking the running request that has
// generated the most off the batch. The preempted request keeps its pages
// and KV and goes to the back of the queue; nothing is preempted unless the
// waiting request can then be admitted (its pages are free), so preemption
// can never leave the batch empty and the queue stuck.
func (e *Engine) maybePreempt() {
	if e.cfg.PreemptAfter <= 0 || !e.traits.preempts || len(e.waiting) == 0 || len(e.running) < e.cfg.MaxRunning {
		return
	}
	head := e.waiting[0]
	if time.Since(head.queuedAt) < e.cfg.PreemptAfter || e.needPages(head) > e.pool.Available() {
		return
	}
	var victim *Request
	for _, r := range e.running {
		if r.life.State() == StateDecoding && (victim == nil || r.generated > victim.generated) {
			victim = r
		}
	}
	if victim == nil {
		return
	}
	e.remove(victim)
	if err := victim.life.To(StatePreempted, ""); err != nil {
		e.must(victim, err)
		e.fail(victim, err)
		return
	}
	victim.queuedAt = time.Now()
	e.m.Preemptions.Inc()
	e.waiting = append(e.waiting, victim)
	e.mu.Lock()
	e.queued++
	e.mu.Unlock()
}

// maxSeqLen is the longest r can grow: its prompt plus max_tokens, or the
// context length when max_tokens was not given.
func (e *Engine) maxSeqLen(r *Request) int {
	if r.traits().handsOn {
		return len(r.Prompt)
	}
	if r.Params.MaxTokens > 0 {
		return min(len(r.Prompt)+r.Params.MaxTokens, e.cfg.ContextLength)
	}
	return e.cfg.ContextLength
}

// scorePrompt records the logprobs of the prompt tokens that rows (the
// logits of positions from, from+1, ...) predict: row j scores the token at
// position from+j+1, as long as that is still the prompt's.
func (e *Engine) scorePrompt(r *Request, rows []float32, from int) {
	vocab := e.model.Config.Vocab
	for j := 0; j*vocab < len(rows); j++ {
		next := from + j + 1
		if next >= len(r.Prompt) {
			break
		}
		r.promptLP = append(r.promptLP, e.sampler.Score(rows[j*vocab:(j+1)*vocab], r.Prompt[next], r.Params.Sampling.TopLogprobs))
	}
}

// history is what r's penalties and bans look at: its prompt, what it
// generated, and until min_tokens the tokens that would end it.
func (e *Engine) history(r *Request) model.History {
	own := len(r.Prompt) - len(r.Params.Output(r.Prompt))
	h := model.History{Prompt: r.seq[:own], Generated: r.seq[own:]}
	if r.generated < r.Params.MinTokens {
		if !r.Params.IgnoreEOS {
			h.Ban = e.eog
		}
		if len(r.Params.StopTokenIDs) > 0 {
			h.Ban = append(append([]int32(nil), h.Ban...), r.Params.StopTokenIDs...)
		}
	}
	return h
}

func (e *Engine) remove(r *Request) {
	for i, x := range e.running {
		if x == r {
			e.running = append(e.running[:i], e.running[i+1:]...)
			return
		}
	}
}

// prefilled ends a prefill request's time in the engine: its prompt KV has
// been handed to OnChunk page by page, so its local pages are released and
// the worker takes it from Sending on.
func (e *Engine) prefilled(r *Request, tok model.Sampled) {
	e.remove(r)
	if err := r.life.To(StateSending, ""); err != nil {
		e.must(r, err)
		e.fail(r, err)
		return
	}
	e.release(r)
	e.m.TTFT.Observe(time.Since(r.arrived).Seconds())
	e.m.GenerationTokens.Inc()
	r.emit(Event{Token: &tok, Finish: FinishPrefilled, Prompt: r.takePromptLP(), CachedTokens: r.cached})
}

func (e *Engine) deliver(r *Request, tok model.Sampled) {
	now := time.Now()
	if r.life.State() == StatePrefilling { // first token, or first after a re-admission
		e.must(r, r.life.To(StateDecoding, ""))
	}
	if r.generated == 0 {
		e.m.TTFT.Observe(now.Sub(r.arrived).Seconds())
	} else {
		e.m.ITL.Observe(now.Sub(r.lastToken).Seconds())
	}
	r.lastToken = now
	r.generated++
	r.seq = append(r.seq, tok.ID)
	e.m.GenerationTokens.Inc()
	finish := ""
	early := r.generated <= r.Params.MinTokens // a stop token now cannot end it
	switch {
	case !early && !r.Params.IgnoreEOS && e.cfg.IsEOG(tok.ID):
		finish = FinishStop
	case !early && containsToken(r.Params.StopTokenIDs, tok.ID):
		finish = FinishStop
	case r.Params.MaxTokens > 0 && r.generated >= r.Params.MaxTokens:
		finish = FinishLength
	case len(r.seq) >= e.cfg.ContextLength:
		finish = FinishLength
	}
	ev := Event{Token: &tok, Prompt: r.takePromptLP()}
	if r.generated == 1 {
		ev.CachedTokens = r.cached
	}
	r.emit(ev)
	if finish != "" {
		e.remove(r)
		e.finish(r, finish)
	}
}

// hasNaN: a row of logits holds a NaN. The vector max is NaN exactly then,
// and takes a 32K row in a few µs where a Go loop took 20, once for each
// sequence of every step, while the other cores waited for the next one.
func hasNaN(v []float32) bool {
	return len(v) > 0 && math.IsNaN(float64(expsum.Max(v)))
}

func containsToken(ids []int32, id int32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// finish ends a request normally and releases its pages.
func (e *Engine) finish(r *Request, reason string) {
	if err := r.life.To(StateFinished, reason); err != nil {
		e.must(r, err)
		e.fail(r, err)
		return
	}
	e.publish(r)
	e.release(r)
	e.specObserve(r)
	e.m.Outcome("finished")
	e.m.E2E.Observe(time.Since(r.arrived).Seconds())
	r.emit(Event{Finish: reason, Spec: specCounts(r)})
}

// abort ends a live request early (see tearDown); only the call that made
// the move tells the reader.
func (e *Engine) abort(r *Request, why string) bool {
	if !e.tearDown(r, why) {
		return false
	}
	e.m.Outcome("aborted")
	r.emit(Event{Finish: FinishAbort, Err: errors.New(why)})
	return true
}

// fail aborts a request because of an error the client must see (5xx).
func (e *Engine) fail(r *Request, err error) {
	if !e.tearDown(r, err.Error()) {
		return
	}
	e.m.Outcome("error")
	r.emit(Event{Finish: FinishError, Err: err})
}

// tearDown moves a live request to Aborting and releases its pages. A
// standalone request is then Aborted. A prefill request stays in Aborting:
// its worker closes the transport session and tells decode before it may
// say Drained. A decode request whose prompt pages a writer still holds
// goes to Draining (the pages wait in quarantine); otherwise it is Aborted.
// It reports whether it made the move (a request already ending is left
// to whoever ends it).
func (e *Engine) tearDown(r *Request, why string) bool {
	from := r.life.State()
	if !from.Live() {
		return false
	}
	if err := r.life.Move([]State{from}, StateAborting, why); err != nil {
		e.must(r, err)
		return false
	}
	e.releaseAborting(r, why)
	return true
}

// releaseAborting is the rest of a teardown once r is Aborting. A
// standalone request, or a decode request in the batch (its writer let go
// at Commit), is then Aborted; a prefill request stays Aborting until its
// worker has closed the session.
func (e *Engine) releaseAborting(r *Request, why string) {
	e.release(r)
	if r.life.Role() != RolePrefill {
		e.must(r, r.life.To(StateAborted, why))
	}
}

// must notes a lifecycle move that cannot be refused unless the engine
// has a bug: it is counted (tests require zero) and logged, never ignored.
func (e *Engine) must(r *Request, err error) {
	if err != nil {
		e.m.IllegalMoves.Inc()
		slog.Error("illegal lifecycle move", "request_id", r.ID, "err", err)
	}
}

// poolErr logs a writer release the pool refused; the pool keeps such
// pages rather than freeing them twice, and counts the error itself.
func (e *Engine) poolErr(r *Request, err error) {
	if err != nil {
		slog.Error("kv pool refused a writer release", "request_id", r.ID, "err", err)
	}
	e.poolGauges()
}

// release gives r's pages back; pages a writer still holds wait in
// quarantine until the writer lets go (Handover.WriterGone).
func (e *Engine) release(r *Request) {
	e.drafter.drop(r)
	if r.pages == nil {
		return
	}
	// A failed release is a bookkeeping bug; the pool counts it (tests
	// assert the count is zero) and keeps the pages rather than freeing
	// them twice.
	_ = e.pool.Release(r.owner, r.pages)
	r.pages = nil
	e.poolGauges()
}

func (e *Engine) shutdown() {
	e.takeInbox()
	for _, r := range e.waiting {
		e.abort(r, "server shutting down")
	}
	for _, r := range append(e.running, e.ready...) {
		e.abort(r, "server shutting down")
	}
	e.waiting, e.running, e.ready, e.deferredStops = nil, nil, nil, nil
	e.gauges()
	e.mu.Lock()
	e.stopped = true
	left := e.msgs
	e.msgs = nil
	e.mu.Unlock()
	for _, m := range left {
		m.answer(false, ErrStopped)
	}
}
