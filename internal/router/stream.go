package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"go.opentelemetry.io/otel/trace"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/pdwire"
	"github.com/batonlm/baton/internal/request"
)

// RequestIDKey is the gRPC metadata key that carries the request id to
// every worker call, next to the id in the messages themselves.
const RequestIDKey = "x-request-id"

const (
	// controlTimeout bounds the short control calls (Reserve,
	// Abort, Finish) so that a hung worker cannot hold a
	// request, or its clean-up, forever.
	controlTimeout = 10 * time.Second
	// settleGrace bounds how long an ended request waits for its calls to
	// end on their own before they are cancelled (see settle).
	settleGrace = 2 * time.Second
)

const (
	quitCancel int32 = iota + 1
	quitStop
)

// stream is one request in flight through a prefill/decode pair. Its run
// goroutine owns the worker calls; Next, Cancel and Stop only talk to it
// through channels.
type stream struct {
	r      *Router
	id     string
	prompt []int32
	p      request.Params
	log    *slog.Logger
	start  time.Time
	md     context.Context // carries the request id as gRPC metadata

	// events is unbuffered: a token counts as delivered once the caller
	// took it, which is the line after which a failure can no longer be
	// retried on another pair.
	events  chan request.Event
	quit    chan struct{}
	quitWhy atomic.Int32
	once    sync.Once

	// run-owned
	started   chan<- error // nil once the first event is ready
	gotToken  bool         // this attempt delivered a token
	lastToken time.Time
	// orig and origP are the request's own prompt and parameters, and
	// sent the tokens the caller took, over every attempt: a request
	// that migrates goes on elsewhere with sent joined to its prompt and
	// taken off its bounds (migrate).
	orig, sent []int32
	origP      request.Params
	// migrations counts the request's moves to another pair after tokens
	// reached the caller, whatever the reason; at most Router.migrations.
	migrations int
	// spec sums the attempts' speculation figures; suspect are the decode
	// workers whose spec guard stopped this request, never tried again.
	spec    request.SpecCounts
	suspect map[*worker]bool
	// phase is where the request stands (phase.go), trail its moves.
	phase phase
	trail []phase
	// tracing (trace.go): the request's span context, the queue wait's
	// span, and the attempts so far.
	tctx     context.Context
	qspan    trace.Span
	attempts int
}

func newStream(r *Router, id string, prompt []int32, p request.Params, log *slog.Logger) *stream {
	return &stream{
		r: r, id: id, prompt: prompt, orig: prompt, p: p, origP: p, log: log, start: time.Now(),
		md:     metadata.AppendToOutgoingContext(context.Background(), RequestIDKey, id),
		events: make(chan request.Event), quit: make(chan struct{}),
	}
}

// Next waits for the next event; ok is false when ctx ended first. After
// the last event (one with a finish reason) it waits for ctx.
func (s *stream) Next(ctx context.Context) (request.Event, bool) {
	select {
	case ev := <-s.events:
		return ev, true
	case <-ctx.Done():
		return request.Event{}, false
	}
}

// Cancel aborts the request (the client left): decode is told to Abort.
func (s *stream) Cancel() { s.end(quitCancel) }

// Stop finishes the request early (a stop string matched): decode is told
// to Finish.
func (s *stream) Stop() { s.end(quitStop) }

func (s *stream) end(why int32) {
	s.once.Do(func() {
		s.quitWhy.Store(why)
		close(s.quit)
	})
}

// failure is one attempt that did not produce a token.
type failure struct {
	stage string     // pick, reserve, stream, prefill, decode
	code  codes.Code // the worker call's status; Unknown when it was not a gRPC status
	err   error      // what the client would see: *Error, or *request.RejectError from pick
	// detail is what happened, in the workers' words, for the log only.
	detail error
	retry  bool
	// midStream is set on a failure after tokens reached the caller that
	// the request may go on from on another pair: why (a migrate* reason,
	// the label of baton_router_migrations_total). The decode worker has
	// ended the request or was told to, so nothing needs aborting.
	midStream string
	// afterTokens: the failure came after tokens reached the caller, so
	// it ends the stream with an error event unless the request migrates.
	afterTokens bool
}

// Why a request migrates to another pair after tokens reached the caller.
const (
	migrateDecodeGone  = "decode_gone"  // its token stream broke: process gone, connection reset, Unavailable
	migrateDecodeError = "decode_error" // decode reported a failure of its own (5xx) on the stream
	migrateSpecGuard   = "spec_guard"   // decode's spec guard found its KV suspect (finish spec_anomaly)
	migrateDrain       = "drain"        // decode, draining, handed the request back (finish drain)
)

// migrateReasons are every label baton_router_migrations_total takes.
var migrateReasons = []string{migrateDecodeGone, migrateDecodeError, migrateSpecGuard, migrateDrain}

// anomaly: decode's spec guard stopped the request after tokens reached
// the caller.
func (f *failure) anomaly() bool { return f.midStream == migrateSpecGuard }

// run drives the attempts. started receives nil once the first event (a
// token, or the end of a request that generated none) is ready, or the
// error that stopped the request before that: until then nothing has
// reached the client, so every failure can still be an HTTP status, and
// Generate waits for it. A request that fits the decode pool but finds no
// decode worker with room now waits in the router's queue and tries again.
func (s *stream) run(started chan<- error) {
	s.started = started
	defer s.r.streamEnded()
	avoid := map[*worker]bool{}
	var last failure
	// held are the workers of the current attempt, released when it is
	// over so that a worker DNS dropped is closed only after its streams.
	var held []*worker
	defer func() { s.r.release(held...) }()
	// qw is the request's place in the queue, kept from its first refusal
	// for want of room until it holds a reservation.
	var qw *waiter
	leave := func() {
		if qw != nil {
			s.traceLeft(nil)
			s.r.queue.leave(qw)
			qw = nil
			s.r.gauges()
		}
	}
	defer leave()
	tries := 0 // attempts since the request last waited in the queue
	for {
		s.r.release(held...)
		held = nil
		s.to(phasePicking)
		if s.quitting() {
			// The client left (or stopped) between attempts; nothing is
			// reserved, so nothing needs telling.
			s.endOutcome()
			return
		}
		ps := s.tracePick()
		pr, err := s.r.pick(avoid, s.prompt, s.p.Tenant)
		tracePicked(ps, pr, err)
		if err != nil {
			last = failure{stage: "pick", err: err, detail: err}
			break
		}
		d, p := pr.d, pr.p
		held = pr.workers()
		if s.suspect[d] {
			// Only the worker that tripped is left: its text after the
			// trip must not reach the client.
			last = failure{stage: "spec_anomaly", err: &Error{Status: http.StatusBadGateway, Message: msgAnomaly},
				detail: fmt.Errorf("only %s, whose spec guard stopped the request, is left", d.url)}
			break
		}
		// A failed pair is passed over for the rest of this request: a
		// prefill error may come from decode's transport and the other way
		// round, so both sides of it are suspects.
		for _, w := range held {
			s.r.rm.picks.WithLabelValues(w.url, w.role).Inc()
			avoid[w] = true
		}
		f, over := s.attempt(pr, leave)
		if over {
			return
		}
		last = *f
		if f.afterTokens {
			if f.midStream != "" {
				s.to(phaseMigrating)
			}
			if s.finishedAt(f) {
				return
			}
			if !s.migrate(&last, d, avoid) {
				break
			}
			tries = 0
			s.log.Warn("decode failed the request after tokens reached the client; continuing on another pair",
				"reason", f.midStream, "decode", d.url, "prefill", p.name(), "delivered", len(s.sent), "migration", s.migrations, "err", f.detail)
			continue
		}
		if f.noRoom() && s.r.queue.max > 0 && s.r.mayFreeUp(d, f) && (tries >= s.r.retries || !s.r.untriedDecode(avoid)) {
			s.r.release(held...)
			held = nil
			if qw == nil {
				if qw = s.r.queue.join(); qw == nil {
					last = failure{stage: "queue", err: errQueueFull(s.r.queue.max), detail: errors.New("the router's queue is full")}
					break
				}
				s.to(phaseQueued)
				s.traceQueued()
				s.r.m.QueuedTotal.Inc()
				s.r.gauges()
				s.log.Debug("queued: no decode worker has room now", "waiting", s.r.queue.len())
			}
			if err := s.await(qw); err != nil {
				s.traceLeft(err)
				if errors.Is(err, errClientLeft) {
					s.endOutcome()
					return
				}
				last = failure{stage: "queue", err: err, detail: err}
				break
			}
			// Room may have freed anywhere: every pair is worth a try.
			clear(avoid)
			tries = 0
			continue
		}
		if !f.retry || tries >= s.r.retries {
			break
		}
		tries++
		if qw != nil && f.noRoom() {
			// A queued request looking for room is no failure to count.
			s.log.Debug("no room on this decode worker either; trying another", "decode", d.url)
			continue
		}
		s.r.rm.retries.WithLabelValues(f.stage).Inc()
		s.traceRetry(f)
		s.log.Warn("attempt failed before the first token; retrying on another pair",
			"stage", f.stage, "decode", d.url, "prefill", p.name(), "attempt", tries, "err", f.detail)
	}
	s.log.Warn("request failed", "stage", last.stage, "code", last.code, "err", last.detail, "client_error", last.err, "phases", s.phases())
	// Out of the queue before the client hears: its gauges then never
	// count a request whose answer is already out.
	leave()
	if s.started != nil {
		s.to(phaseFailed)
		s.started <- rejectFrom(last)
		s.started = nil
		return
	}
	s.finish(request.Event{Finish: request.FinishError, Err: asError(last.err)})
}

// migrate prepares another attempt after decode worker d failed the
// request mid-stream: the tokens the caller took join the prompt and come
// off max_tokens (and min_tokens), so that the next pair goes on where d
// stopped and the client reads one stream with no token repeated or
// missing. The sampling parameters stay the request's own. False: the
// request may not go on, and last (its error reworded where the reason is
// the bound) ends it: the failure is not one to migrate on (a client that
// left, a 4xx, the router shutting down), it has migrated the most
// --max-migrations allows, no healthy decode worker but d is there, or
// decode's spec guard stopped it a second time.
func (s *stream) migrate(last *failure, d *worker, avoid map[*worker]bool) bool {
	if last.midStream == "" || s.quitting() || s.r.closed.Load() {
		return false
	}
	if last.anomaly() {
		if s.suspect == nil {
			s.suspect = map[*worker]bool{}
		}
		s.suspect[d] = true
		if len(s.suspect) > 1 {
			return false
		}
	}
	if s.migrations >= s.r.migrations {
		if s.migrations > 0 && !last.anomaly() {
			last.err = &Error{Status: http.StatusBadGateway, Message: fmt.Sprintf(msgMigrations, s.migrations+1)}
		}
		last.detail = fmt.Errorf("%w (after %d migrations, the most allowed)", last.detail, s.migrations)
		return false
	}
	// The failed worker is passed over while any other will do; the
	// prefill worker did nothing wrong. Suspects are never tried again.
	clear(avoid)
	avoid[d] = true
	for w := range s.suspect {
		avoid[w] = true
	}
	if !s.r.untriedDecode(avoid) {
		return false
	}
	s.migrations++
	s.r.rm.migrations.WithLabelValues(last.midStream).Inc()
	s.traceMigrate(last)
	if last.anomaly() {
		s.r.rm.retries.WithLabelValues(last.stage).Inc()
	}
	s.prompt = append(append(make([]int32, 0, len(s.orig)+len(s.sent)), s.orig...), s.sent...)
	s.p = s.continuation()
	s.gotToken = false
	return true
}

// continuation is the request's own parameters for an attempt that goes on
// after the tokens the caller has: its bounds less what was sent, its
// prompt's logprobs (delivered with the first token) not asked again, and
// a constraint given the output so far.
func (s *stream) continuation() request.Params {
	p := s.origP
	if p.MaxTokens > 0 {
		p.MaxTokens -= len(s.sent)
	}
	p.MinTokens = max(0, p.MinTokens-len(s.sent))
	p.PromptLogprobs = false
	// The output the client has ends the new prompt: the new pair's
	// penalties and constraint take it as the request's own.
	p.Continued = len(s.sent)
	return p
}

// finishedAt ends a request whose decode worker failed after sending its
// last token but before saying so: max_tokens are all out, and a
// continuation would be asked for none, which reads as "up to the context
// length".
func (s *stream) finishedAt(f *failure) bool {
	if s.origP.MaxTokens == 0 || len(s.sent) < s.origP.MaxTokens || f.midStream == "" {
		return false
	}
	ev := request.Event{Finish: request.FinishLength}
	if s.spec.Steps > 0 {
		c := s.spec
		ev.Spec = &c
	}
	s.log.Warn("decode failed the request after its last token; it ends there", "reason", f.midStream, "err", f.detail)
	s.finish(ev)
	return true
}

// begin tells Generate that the first event is ready: from here on a
// failure reaches the client as the stream's last event.
func (s *stream) begin() {
	s.to(phaseStreaming)
	if s.started != nil {
		s.started <- nil
		s.started = nil
	}
}

// noRoom is a decode worker refusing a reservation for want of room: the
// request fits the pool, only not now.
func (f *failure) noRoom() bool {
	return f.stage == "reserve" && f.code == codes.ResourceExhausted
}

// perPeer is decode's refusal of a caller over its share of the pool
// (--max-reservations-per-peer, --max-pages-per-peer) rather than a full
// pool.
func (f *failure) perPeer() bool {
	return f.noRoom() && strings.Contains(f.detail.Error(), "held by this caller")
}

func (s *stream) quitting() bool {
	select {
	case <-s.quit:
		return true
	default:
		return false
	}
}

// attempt runs one try on pr: the decode worker alone when it computes the
// prompt itself, else the handoff. over: the request ended (its last
// event delivered, or the caller left); otherwise f says what failed.
func (s *stream) attempt(pr pair, leave func()) (f *failure, over bool) {
	defer s.traceAttempt(pr)(&f)
	if pr.local {
		leave()
		s.r.rm.localPrefills.Inc()
		f = s.generate(pr.d, pr.dc)
		return f, f == nil
	}
	res, f := s.reserve(pr.d, pr.p, pr.dc)
	if f != nil {
		return f, false
	}
	s.to(phaseReserved)
	if s.quitting() {
		s.abort(s.log, pr.dc, res, "client went away before prefill was asked")
		s.endOutcome()
		return nil, true
	}
	leave()
	f = s.relay(pr.d, pr.p, pr.dc, pr.pc, res)
	return f, f == nil
}

func (s *stream) reserve(d, p *worker, dc pdv1.DecodeClient) (*pdv1.Reservation, *failure) {
	s.r.mu.Lock()
	// The writer is named as prefill names itself: decode matches it
	// against the Writer of prefill's Commit and Drained, so an address
	// the router rewrote to dial it would make prefill's Drained a stranger.
	layout, writer := p.info.GetLayout(), p.info.GetGrpcAddr()
	if writer == "" {
		writer = p.addr
	}
	s.r.mu.Unlock()
	ctx, cancel := context.WithTimeout(s.md, controlTimeout)
	defer cancel()
	ctx, span := traceReserve(ctx)
	res, err := dc.Reserve(ctx, &pdv1.ReserveRequest{
		RequestId: s.id, Prompt: s.prompt, Sampling: pdwire.ToPB(s.p), Layout: layout, Writer: writer,
	})
	traceReserved(span, res, err)
	if err != nil {
		return nil, rpcFailure("reserve", "decode worker refused the reservation", err)
	}
	s.log.Debug("reserved", "decode", d.url, "prefill", p.url, "room", res.Room, "epoch", res.Epoch, "pages", len(res.Pages))
	return res, nil
}

type received struct {
	ev  *pdv1.TokenEvent
	err error
}

// receive hands decode's token events over a channel, so that the attempt
// can wait on them beside its other events; it returns with the stream's
// end or ctx's.
func receive(ctx context.Context, evs grpc.ServerStreamingClient[pdv1.TokenEvent]) <-chan received {
	recv := make(chan received)
	go func() {
		for {
			ev, err := evs.Recv()
			select {
			case recv <- received{ev, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return recv
}

// relay runs one attempt on a reservation: it opens decode's token stream,
// asks prefill to fill the reservation, and passes tokens on until the
// request ends. nil means the request is over (last event delivered, or
// the caller cancelled or stopped); a failure means either that no token
// was delivered and the reservation was cancelled, or (afterTokens) that
// decode failed the request after tokens and has ended it or was told to.
func (s *stream) relay(d, p *worker, dc pdv1.DecodeClient, pc pdv1.PrefillClient, res *pdv1.Reservation) *failure {
	s.to(phaseRelaying)
	log := s.log.With("decode", d.url, "prefill", p.url, "room", res.Room, "epoch", res.Epoch)
	// Cancelling ctx ends the token stream and the prefill call, so every
	// goroutine started here returns with relay.
	ctx, cancel := context.WithCancel(s.md)
	defer cancel()
	evs, err := dc.Stream(ctx, &pdv1.StreamRequest{Room: res.Room, Epoch: res.Epoch, Capability: res.Capability})
	if err != nil {
		f := rpcFailure("stream", "decode token stream failed", err)
		s.abort(log, dc, res, "token stream failed: "+err.Error())
		return f
	}
	prefillDone := make(chan error, 1)
	go func() {
		_, err := pc.Prefill(ctx, &pdv1.PrefillRequest{RequestId: s.id, Prompt: s.prompt, Sampling: pdwire.ToPB(s.p), Reservation: res})
		prefillDone <- err
	}()
	recv := receive(ctx, evs)
	tell := func() { s.tellDecode(log, dc, res) }
	pending := prefillDone // nil once prefill answered
	for {
		select {
		case err := <-pending:
			pending = nil
			if err == nil {
				s.r.m.PromptTokens.Add(float64(len(s.prompt)))
				log.Debug("prefill committed")
				continue
			}
			if s.gotToken {
				// Decode only streams after it accepted the commit, so its
				// word stands; the error is for the operator.
				log.Warn("prefill reported an error after decode streamed a token", "err", err)
				continue
			}
			f := rpcFailure("prefill", "prefill failed", err)
			s.abort(log, dc, res, "prefill failed: "+err.Error())
			return f
		case it := <-recv:
			if it.err != nil {
				if s.gotToken {
					log.Warn("stream failed after the first token", "err", it.err)
					// A decode worker that is still alive may not have seen
					// the break; this attempt is over either way.
					s.abort(log, dc, res, "token stream to the router broke")
					s.settle(nil, pending)
					return broken(it.err)
				}
				var f *failure
				if errors.Is(it.err, io.EOF) {
					// An orderly end with nothing sent (a decode worker
					// shutting down) says nothing against trying elsewhere.
					f = &failure{stage: "stream", retry: true, err: handoffError(http.StatusBadGateway),
						detail: errors.New("decode token stream ended before the first token")}
				} else {
					f = rpcFailure("stream", "decode token stream failed", it.err)
				}
				s.abort(log, dc, res, "token stream failed: "+it.err.Error())
				return f
			}
			if done, f := s.forward(log, it.ev, tell); f != nil {
				if f.afterTokens {
					// Decode ended the request with the event that said so.
					s.settle(recv, pending)
					return f
				}
				s.abort(log, dc, res, "decode failed the request before its first token: "+f.detail.Error())
				return f
			} else if done {
				s.settle(recv, pending)
				return nil
			}
		case <-s.quit:
			s.tellDecode(log, dc, res)
			s.settle(recv, pending)
			return nil
		}
	}
}

// generate runs one attempt on decode worker d alone, which computes the
// prompt itself (Generate) and streams the tokens: no reservation, no
// prefill worker, no handoff. Its result reads as relay's. Ending the call
// ends the request on d, so a caller that left or stopped ends it there.
func (s *stream) generate(d *worker, dc pdv1.DecodeClient) *failure {
	s.to(phaseRelaying)
	log := s.log.With("decode", d.url, "prefill", "none: computed on decode")
	ctx, cancel := context.WithCancel(s.md)
	defer cancel()
	evs, err := dc.Generate(ctx, &pdv1.GenerateRequest{RequestId: s.id, Prompt: s.prompt, Sampling: pdwire.ToPB(s.p)})
	if err != nil {
		return rpcFailure("generate", "decode worker refused the request", err)
	}
	recv := receive(ctx, evs)
	ended := func() {
		cancel()
		s.endOutcome()
	}
	counted := false
	for {
		select {
		case it := <-recv:
			switch {
			case it.err != nil && s.gotToken:
				log.Warn("stream failed after the first token", "err", it.err)
				return broken(it.err)
			case errors.Is(it.err, io.EOF):
				return &failure{stage: "generate", retry: true, err: handoffError(http.StatusBadGateway),
					detail: errors.New("decode's stream ended before the first token")}
			case it.err != nil:
				return rpcFailure("generate", "decode worker failed the request", it.err)
			}
			if !counted {
				counted = true
				s.r.m.PromptTokens.Add(float64(len(s.prompt)))
			}
			if done, f := s.forward(log, it.ev, ended); f != nil || done {
				return f
			}
		case <-s.quit:
			ended()
			return nil
		}
	}
}

// forward passes one decode event to the caller. done means the request is
// over; a failure is an error event before any token that may be retried,
// or one after tokens that lets the request go on elsewhere. tell tells
// decode the caller left or stopped.
func (s *stream) forward(log *slog.Logger, te *pdv1.TokenEvent, tell func()) (done bool, f *failure) {
	var ev request.Event
	if te.Token != nil {
		tok := pdwire.TokenFromPB(te.Token)
		ev.Token = &tok
		if len(s.sent) == 0 {
			// A continuation's figure is of its own prompt, which holds
			// tokens the client did not send.
			ev.CachedTokens = int(te.CachedTokens)
		}
		if s.p.PromptLogprobs && !s.gotToken {
			for _, t := range te.PromptLogprobs[:min(len(te.PromptLogprobs), max(0, len(s.prompt)-1))] {
				ev.Prompt = append(ev.Prompt, pdwire.TokenFromPB(t))
			}
		}
	}
	first := !s.gotToken && ev.Token == nil
	if te.SpecVerifySteps > 0 {
		s.spec = s.spec.Add(request.SpecCounts{Drafted: int(te.SpecDraftTokens), Accepted: int(te.SpecAcceptedTokens), Steps: int(te.SpecVerifySteps)})
	}
	switch {
	case te.Finish == request.FinishSpecAnomaly:
		// Decode stopped the request before the step that tripped its
		// guard sent anything, and ended it there; the run loop goes on
		// on another pair, or tells the client.
		return false, &failure{stage: "spec_anomaly", midStream: migrateSpecGuard, afterTokens: true,
			err: &Error{Status: http.StatusBadGateway, Message: msgAnomaly}, detail: fmt.Errorf("decode's spec guard: %s", te.Error)}
	case te.Error != "":
		st := httpStatus(te.Code)
		e := decodeEventError(st, te.Error, !first)
		detail := fmt.Errorf("decode error event %d: %s", te.Code, te.Error)
		if first {
			// Nothing reached the client yet: its answer is still a status,
			// and a failure that another pair may not repeat is retried.
			return false, &failure{stage: "decode", err: e, retry: retryableHTTP(st), detail: detail}
		}
		if te.Finish == request.FinishDrain {
			// A draining decode worker handed the request back: no failure.
			log.Info("decode handed the request back while draining")
			return false, &failure{stage: "decode", midStream: migrateDrain, afterTokens: true, err: e, detail: detail}
		}
		log.Warn("decode failed the request", "code", te.Code, "err", te.Error)
		if why := eventMigration(st); why != "" {
			return false, &failure{stage: "decode", midStream: why, afterTokens: true, err: e, detail: detail}
		}
		ev.Finish, ev.Err = request.FinishError, e
	case te.Finish == request.FinishStop || te.Finish == request.FinishLength:
		ev.Finish = te.Finish
	case te.Finish != "":
		log.Warn("decode ended the request with an unknown finish reason", "finish", te.Finish)
		e := &Error{Status: http.StatusBadGateway, Message: msgDecodeFail}
		if first {
			return false, &failure{stage: "decode", err: e, detail: fmt.Errorf("unknown finish reason %q", te.Finish)}
		}
		ev.Finish, ev.Err = request.FinishError, e
	case ev.Token == nil:
		return false, nil // nothing to pass on
	}
	if ev.Token != nil {
		now := time.Now()
		if !s.gotToken && len(s.sent) == 0 {
			s.r.m.TTFT.Observe(now.Sub(s.start).Seconds())
		} else {
			s.r.m.ITL.Observe(now.Sub(s.lastToken).Seconds())
		}
		s.gotToken, s.lastToken = true, now
		s.r.m.GenerationTokens.Inc()
	}
	s.begin()
	if ev.Finish != "" {
		if s.spec.Steps > 0 {
			c := s.spec
			ev.Spec = &c
		}
		s.finish(ev)
		return true, nil
	}
	select {
	case s.events <- ev:
		if ev.Token != nil {
			s.sent = append(s.sent, ev.Token.ID)
		}
		return false, nil
	case <-s.quit:
		tell()
		return true, nil
	}
}

// finish delivers the last event and counts the outcome. A caller that
// cancelled or stopped meanwhile does not read it, and decode, which sent
// it, needs no telling.
func (s *stream) finish(ev request.Event) {
	select {
	case s.events <- ev:
		if ev.Finish == request.FinishError {
			s.to(phaseFailed)
			s.r.m.Outcome("error")
		} else {
			s.to(phaseDone)
			s.r.m.Outcome("finished")
		}
		s.r.m.E2E.Observe(time.Since(s.start).Seconds())
	case <-s.quit:
		s.endOutcome()
	}
}

func (s *stream) endOutcome() {
	if s.quitWhy.Load() == quitStop {
		s.to(phaseDone)
		s.r.m.Outcome("finished")
		s.r.m.E2E.Observe(time.Since(s.start).Seconds())
		return
	}
	s.to(phaseCancelled)
	s.r.m.Outcome("aborted")
}

// tellDecode passes the caller's Cancel (Abort) or Stop (Finish) to decode.
// Decode, not the router, tells prefill and waits for it to drain.
func (s *stream) tellDecode(log *slog.Logger, dc pdv1.DecodeClient, res *pdv1.Reservation) {
	ctx, cancel := context.WithTimeout(s.md, controlTimeout)
	defer cancel()
	req := &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, RequestId: s.id, Capability: res.Capability}
	var err error
	if s.quitWhy.Load() == quitStop {
		req.Reason = "stop string matched"
		_, err = dc.Finish(ctx, req)
	} else {
		req.Reason = "client cancelled"
		_, err = dc.Abort(ctx, req)
	}
	if err != nil {
		log.Warn("could not tell decode the request ended", "reason", req.Reason, "err", err)
	} else {
		log.Debug("told decode the request ended", "reason", req.Reason)
	}
	s.endOutcome()
}

// abort tells decode to end a request the router gave up on: the client
// left, or the attempt failed and its pages go back before the next one.
// Prefill may have been told (and may have written) already: decode keeps
// the pages until the writer drained, so the router need not wait here.
func (s *stream) abort(log *slog.Logger, dc pdv1.DecodeClient, res *pdv1.Reservation, reason string) {
	ctx, cancel := context.WithTimeout(s.md, controlTimeout)
	defer cancel()
	if _, err := dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, RequestId: s.id, Reason: reason, Capability: res.Capability}); err != nil {
		log.Warn("could not tell decode to abort", "reason", reason, "err", err)
	}
}

// settle lets an ended request's calls end on their own before relay
// cancels them: decode closes its token stream after the last event, or
// after Finish or Abort, and prefill answers once it committed or drained.
// A worker that sees its call cancelled instead takes it for a vanished
// router and aborts, which is safe but turns a clean Finish into an abort
// and races a committed prefill's reply. A worker that does not end its
// call within settleGrace is cut off all the same.
func (s *stream) settle(recv <-chan received, pending <-chan error) {
	t := time.NewTimer(settleGrace)
	defer t.Stop()
	for recv != nil || pending != nil {
		select {
		case it := <-recv:
			if it.err != nil || it.ev.GetFinish() != "" || it.ev.GetError() != "" {
				recv = nil
			}
		case err := <-pending:
			pending = nil
			if err != nil && !s.gotToken && !s.quitting() {
				s.log.Warn("prefill failed", "err", err)
			}
		case <-t.C:
			return
		}
	}
}

// broken is a token stream that ended without a last event after tokens
// reached the caller. A decode worker that went away (process gone,
// connection reset, Unavailable, an orderly close with the request still
// running) or failed the stream itself lets the request go on elsewhere;
// Canceled is the router's own doing (the caller left, or it is shutting
// down), and a refusal (InvalidArgument, FailedPrecondition, ...) would be
// refused again, so those end it.
func broken(err error) *failure {
	f := &failure{stage: "stream", code: codes.Unknown, afterTokens: true,
		err: &Error{Status: http.StatusBadGateway, Message: msgInterrupted}, detail: fmt.Errorf("decode token stream broke: %w", err)}
	if errors.Is(err, io.EOF) {
		f.midStream = migrateDecodeGone
		return f
	}
	st, ok := status.FromError(err)
	if !ok {
		f.midStream = migrateDecodeGone // below gRPC: a reset connection
		return f
	}
	f.code = st.Code()
	switch st.Code() {
	case codes.Unavailable, codes.Aborted:
		f.midStream = migrateDecodeGone
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.DeadlineExceeded, codes.ResourceExhausted:
		f.midStream = migrateDecodeError
	}
	return f
}

// eventMigration says whether decode's error event after tokens lets the
// request go on elsewhere: a failure of decode's own (5xx), or decode
// letting the request go without the router asking (499: its shutdown;
// the router reads no events after it asked). A 4xx is the request's own
// fault (a constraint that admits nothing), which another pair would
// repeat.
func eventMigration(status int) string {
	switch {
	case status >= 500:
		return migrateDecodeError
	case status == 499:
		return migrateDecodeGone
	}
	return ""
}

// rpcFailure classifies a failed worker call. Unavailable,
// DeadlineExceeded and ResourceExhausted (another pair may have room), and
// errors below gRPC, are worth another pair; a refusal at a worker's door
// (InvalidArgument) or a layout mismatch (FailedPrecondition) would be
// refused again. The client is told what it can act on; the worker's text
// is kept as the failure's detail, for the log.
func rpcFailure(stage, what string, err error) *failure {
	f := &failure{stage: stage, code: codes.Unknown, detail: fmt.Errorf("%s: %w", what, err)}
	st, ok := status.FromError(err)
	if !ok {
		f.retry, f.err = true, handoffError(http.StatusBadGateway)
		return f
	}
	f.code = st.Code()
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange:
		if clientText(st.Message()) {
			// A door check about the request itself: written for the client.
			f.err = &Error{Status: http.StatusBadRequest, Message: st.Message()}
		} else {
			// One worker refusing what another asked of it is no fault of
			// the client's.
			f.err = handoffError(http.StatusBadGateway)
		}
	case codes.ResourceExhausted:
		// A worker at its door is full (queue, pool, per-peer bound):
		// overload, which HTTP calls 429 as gRPC's own mapping does, so
		// that clients back off and retry rather than count an outage.
		f.retry, f.err = true, &Error{Status: http.StatusTooManyRequests, Message: msgDecodeFull}
		switch stage {
		case "reserve":
		case "prefill":
			f.err = &Error{Status: http.StatusTooManyRequests, Message: msgPrefillFull}
		default:
			f.err = handoffError(http.StatusServiceUnavailable)
		}
	case codes.Unavailable:
		f.retry, f.err = true, handoffError(http.StatusServiceUnavailable)
		if stage == "reserve" {
			f.err = &Error{Status: http.StatusServiceUnavailable, Message: msgNoPair}
		}
	case codes.DeadlineExceeded:
		f.retry, f.err = true, handoffError(http.StatusGatewayTimeout)
	case codes.FailedPrecondition:
		f.err = handoffError(http.StatusBadGateway)
		if m := st.Message(); strings.Contains(m, "layout mismatch") || strings.Contains(m, "over transport") {
			f.err = &Error{Status: http.StatusInternalServerError, Message: msgMisconfig}
		}
	default:
		f.err = handoffError(http.StatusBadGateway)
	}
	return f
}

// decodeEventError is what the client sees of an error event on decode's
// token stream: a door refusal as decode wrote it, anything else mapped.
func decodeEventError(status int, msg string, afterToken bool) *Error {
	switch {
	case status == http.StatusBadRequest && clientText(msg):
		return &Error{Status: status, Message: msg}
	case afterToken:
		return &Error{Status: http.StatusBadGateway, Message: msgDecodeFail}
	case status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout:
		return handoffError(status)
	}
	// Decode aborts a request whose commit failed its checks (499 on the
	// wire): a failed handoff, not a client that went away.
	return handoffError(http.StatusBadGateway)
}

// rejectFrom turns a failure before any reservation held into Generate's
// error: the HTTP surface answers a *request.RejectError with its status.
func rejectFrom(f failure) error {
	var rej *request.RejectError
	if errors.As(f.err, &rej) {
		return rej
	}
	var e *Error
	if !errors.As(f.err, &e) {
		return f.err
	}
	switch {
	case e.Status == http.StatusBadRequest:
		return &request.RejectError{Status: 400, Reason: "rejected_by_decode", Message: e.Message}
	case f.code == codes.ResourceExhausted && e.Status == http.StatusTooManyRequests:
		reason := "decode_full"
		if f.stage == "prefill" {
			reason = "prefill_full"
		}
		return &request.RejectError{Status: 429, Reason: reason, Message: e.Message, RetryAfter: 1}
	case f.retry:
		return &request.RejectError{Status: 503, Reason: "workers_unavailable", Message: e.Message, RetryAfter: 1}
	}
	return e
}

// asError makes any failure an *Error for the last event.
func asError(err error) error {
	var rej *request.RejectError
	if errors.As(err, &rej) {
		return &Error{Status: rej.Status, Message: rej.Message}
	}
	return err
}

func httpStatus(code int32) int {
	if code < 400 || code > 599 {
		return http.StatusInternalServerError
	}
	return int(code)
}

func retryableHTTP(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}
