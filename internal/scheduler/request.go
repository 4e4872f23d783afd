package scheduler

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

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
}

// Request is one generation. The HTTP side creates it, submits it, reads
// events with Next and may Cancel or Stop it; everything else belongs to
// the engine loop.
type Request struct {
	ID     string
	Prompt []int32
	Params Params

	life *Lifecycle

	mu       sync.Mutex
	events   []Event
	wake     chan struct{}
	cancel   bool // client went away: abort
	stop     bool // the reader found a stop string: finish
	finished bool

	// engine-owned
	room      uint64
	seq       []int32 // prompt then generated tokens
	generated int
	computed  int // positions whose KV is in the pages
	owner     kvpool.Owner
	pages     []int32
	rng       *rand.Rand
	arrived   time.Time
	lastToken time.Time
}

// NewRequest makes a request in state Received.
func NewRequest(id string, prompt []int32, p Params) *Request {
	return &Request{ID: id, Prompt: prompt, Params: p, life: NewLifecycle(RoleStandalone), wake: make(chan struct{}, 1), arrived: time.Now()}
}

// State is the request's lifecycle state.
func (r *Request) State() State { return r.life.State() }

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
