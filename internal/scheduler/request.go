package scheduler

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/model"
)

// Params says how a request is generated.
type Params struct {
	Sampling     model.Sampling
	MaxTokens    int     // 0: up to the context length
	Seed         *uint64 // same seed, same output
	StopTokenIDs []int32
	IgnoreEOS    bool
	// MinTokens holds off the end of generation: until that many tokens
	// are out, EOS and StopTokenIDs cannot be sampled (vLLM's min_tokens).
	MinTokens int
	// PromptLogprobs asks for the logprob of every prompt token after the
	// first (completions' echo with logprobs), with Sampling.TopLogprobs
	// alternatives each.
	PromptLogprobs bool
	// Constraint, when set, restricts the output to a language (structured
	// output).
	Constraint Constraint
}

// Finish reasons, as the OpenAI API names them.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
	FinishError  = "error"
)

// Event is what a request's reader receives: one generated token, and on
// the last event a finish reason (and for FinishError, the error).
type Event struct {
	Token  *model.Sampled
	Finish string
	Err    error
	// Prompt comes with the first token when Params.PromptLogprobs asked
	// for it: the logprobs of prompt tokens 1..n-1 (token 0 has none).
	Prompt []model.Sampled
}

// FinishPrefilled ends a prefill-role request: the prompt is computed and
// the event carries the first token; the worker then commits it to decode.
const FinishPrefilled = "prefilled"

// ChunkHook sees each step's progress on a request: positions [from, to) of
// its KV were just written into pages (a prefill worker ships completed
// pages from here). It runs on the engine loop and must not block.
type ChunkHook func(kv kernels.PagedKV, pages []int32, from, to int)

// Request is one generation. The HTTP side creates it, submits it, reads
// events with Next and may Cancel or Stop it; everything else belongs to
// the engine loop (or, on a decode worker before the request joins the
// batch, to the worker that reserved it).
type Request struct {
	ID      string
	Prompt  []int32
	Params  Params
	OnChunk ChunkHook

	life *Lifecycle

	mu       sync.Mutex
	events   []Event
	wake     chan struct{}
	cancel   bool // client went away: abort
	stop     bool // the reader found a stop string: finish
	finished bool

	// engine-owned
	room      uint64
	seq       []int32         // prompt then generated tokens
	first     *model.Sampled  // decode: the token prefill sampled, until delivered
	matcher   Matcher         // follows the output through Params.Constraint
	promptLP  []model.Sampled // the prompt's logprobs, until delivered
	generated int
	computed  int // positions whose KV is in the pages
	owner     kvpool.Owner
	pages     []int32
	// writerPages are the pages a transfer writer holds (decode: the
	// prompt's), until WriterGone; guarded by mu.
	writerPages []int32
	rng         *rand.Rand
	arrived     time.Time
	queuedAt    time.Time // when it last entered the waiting queue
	lastToken   time.Time
}

// NewRequest makes a standalone request in state Received.
func NewRequest(id string, prompt []int32, p Params) *Request {
	return NewRoleRequest(RoleStandalone, id, prompt, p)
}

// NewRoleRequest makes a request of a role in state Received.
func NewRoleRequest(role Role, id string, prompt []int32, p Params) *Request {
	return &Request{ID: id, Prompt: prompt, Params: p, life: NewLifecycle(role), wake: make(chan struct{}, 1), arrived: time.Now()}
}

// State is the request's lifecycle state.
func (r *Request) State() State { return r.life.State() }

// Lifecycle is the request's state machine (the one state field).
func (r *Request) Lifecycle() *Lifecycle { return r.life }

// Owner is the tag of the request's pages (zero until it holds pages).
func (r *Request) Owner() kvpool.Owner { return r.owner }

// Pages are the request's page ids in position order.
func (r *Request) Pages() []int32 { return r.pages }

// Room is the request's room on this worker.
func (r *Request) Room() uint64 { return r.room }

// Next waits for the next event. ok is false when ctx ended first.
func (r *Request) Next(ctx context.Context) (ev Event, ok bool) {
	for {
		r.mu.Lock()
		if len(r.events) > 0 {
			ev = r.events[0]
			r.events = r.events[1:]
			r.mu.Unlock()
			return ev, true
		}
		r.mu.Unlock()
		select {
		case <-r.wake:
		case <-ctx.Done():
			return Event{}, false
		}
	}
}

// SetPromptLogprobs hands a decode request the prompt logprobs its prefill
// computed, to go out with the first token; call it before Join.
func (r *Request) SetPromptLogprobs(lp []model.Sampled) { r.promptLP = lp }

// takePromptLP hands the prompt's logprobs out once, with the first token.
func (r *Request) takePromptLP() []model.Sampled {
	lp := r.promptLP
	r.promptLP = nil
	return lp
}

// Cancel asks the engine to abort the request (the client went away).
func (r *Request) Cancel() { r.flag(&r.cancel) }

// Stop asks the engine to finish the request now (a stop string matched).
func (r *Request) Stop() { r.flag(&r.stop) }

func (r *Request) flag(f *bool) {
	r.mu.Lock()
	*f = true
	r.mu.Unlock()
}

func (r *Request) flags() (cancel, stop bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cancel, r.stop
}

func (r *Request) emit(ev Event) {
	r.mu.Lock()
	if r.finished {
		r.mu.Unlock()
		return
	}
	r.events = append(r.events, ev)
	r.finished = ev.Finish != ""
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
