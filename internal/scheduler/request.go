package scheduler

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/request"
)

// The request vocabulary every layer shares (internal/request).
type (
	Params = request.Params
	Event  = request.Event
)

// Finish reasons, as the OpenAI API names them.
const (
	FinishStop   = request.FinishStop
	FinishLength = request.FinishLength
	FinishAbort  = request.FinishAbort
	FinishError  = request.FinishError
)

// FinishPrefilled ends a prefill-role request: the prompt is computed and
// the event carries the first token; the worker then commits it to decode.
const FinishPrefilled = "prefilled"

// ChunkHook sees each step's progress on a request: positions [from, to) of
// its KV were just written into pages (a prefill worker ships completed
// pages from here). It runs on the engine loop and must not block.
type ChunkHook func(kv kernels.PagedKV, pages []int32, from, to int)

// Request is one generation. The HTTP side creates it, submits it, reads
// events with Next and may Cancel or Stop it (messages to the engine loop);
// everything else belongs to the engine loop. A decode request's state
// moves before Commit are made by the worker that reserved it (Reserved,
// Receiving, Sealed), every other one by the loop.
type Request struct {
	ID      string
	Prompt  []int32
	Params  Params
	OnChunk ChunkHook

	life *Lifecycle
	eng  *Engine // set by Enqueue or Reserve, before the request is shared

	mu     sync.Mutex
	events []Event
	wake   chan struct{}

	// engine-owned
	room      uint64
	seq       []int32         // prompt then generated tokens
	first     *model.Sampled  // decode: the token prefill sampled, until delivered
	matcher   Matcher         // follows the output through Params.Constraint
	grammar   grammarState    // its masks, made off the loop
	promptLP  []model.Sampled // the prompt's logprobs, until delivered
	generated int
	computed  int // positions whose KV is in the pages
	cached    int // leading prompt positions read from shared pages
	owner     kvpool.Owner
	pages     []int32
	// promptPages are a decode request's prompt pages, the ones its
	// transfer writer is named on; whether it still holds them is
	// State().WriterHolds().
	promptPages []int32
	// held are the decode request's leading prompt pages pinned from the
	// prefix cache at Reserve: nobody writes them.
	held []kvpool.SharedRef
	// loading is how many pages after the cached ones are loading from a
	// lower cache tier (standalone and prefill); the engine steps the
	// request only once they all ended. loadsDone closes when they did
	// (decode: its Commit check waits for it); nil when nothing loads.
	loading   int
	loadWait  bool // counted as a load wait already
	loadsDone chan struct{}
	rng       *rand.Rand
	arrived   time.Time
	queuedAt  time.Time // when it last entered the waiting queue
	lastToken time.Time
	spec      specState
}

// NewRequest makes a standalone request in state Received.
func NewRequest(id string, prompt []int32, p Params) *Request {
	return NewRoleRequest(RoleStandalone, id, prompt, p)
}

// NewRoleRequest makes a request of a role in state Received.
func NewRoleRequest(role Role, id string, prompt []int32, p Params) *Request {
	return &Request{ID: id, Prompt: prompt, Params: p, life: NewLifecycle(role), wake: make(chan struct{}, 1), arrived: time.Now()}
}

// traits are what its role changes in the loop (roleTraits).
func (r *Request) traits() roleTraits { return traitsOf(r.life.Role()) }

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
// computed, to go out with the first token; call it before Enqueue.
func (r *Request) SetPromptLogprobs(lp []model.Sampled) { r.promptLP = lp }

// takePromptLP hands the prompt's logprobs out once, with the first token.
func (r *Request) takePromptLP() []model.Sampled {
	lp := r.promptLP
	r.promptLP = nil
	return lp
}

// Cancel asks the engine to abort the request (the client went away). It
// is a message to the engine loop, which acts on it between steps; a
// request never submitted has nothing to cancel.
func (r *Request) Cancel() {
	if r.eng != nil {
		r.eng.post(message{kind: msgCancel, r: r, why: "client cancelled"})
	}
}

// Stop asks the engine to finish the request now (a stop string matched).
func (r *Request) Stop() {
	if r.eng != nil {
		r.eng.post(message{kind: msgStop, r: r})
	}
}

// emit queues an event for the reader. Only the goroutine that made the
// matching move emits (the loop, for every move after Commit), so a request
// gets exactly one last event without a flag to say it had one.
func (r *Request) emit(ev Event) {
	r.mu.Lock()
	r.events = append(r.events, ev)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
