package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// generation is one completions or chat request from prompt to last byte:
// n choices of each prompt generated independently and answered together.
type generation struct {
	s            *Server
	chat         bool
	stream       bool
	includeUsage bool
	sampling     openai.Sampling
	id           string
	promptParam  string
	created      int64
	// echo is each prompt's text put in front of its choices (completions'
	// echo); with echoLogprobs the prompt's tokens lead its logprobs too.
	echo         []string
	echoLogprobs bool
	// batch holds a completions request's prompts (a list of them is
	// served as one request, OpenAI's batch); nil for one prompt, which
	// open is given.
	batch [][]int32
	// tenant is the request's prefix cache salt.
	tenant prefixcache.Salt
	// cached is how many prompt tokens the first choice read from the
	// prefix cache (usage's cached_tokens: the prompt counts once).
	cached int
	// plan is a chat request's reading of the answer (tool calls,
	// reasoning, echo).
	plan chatPlan
	// spec sums the speculation figures of the choices' last events.
	spec scheduler.SpecCounts

	choices []*choice
	// span is the generation's trace span (trace.go); nil when not traced.
	span trace.Span
}

// choice is one of a generation's answers: choice i of prompt p has
// index p*n+i, as OpenAI numbers a batch's choices.
type choice struct {
	index int
	// first says the choice is its prompt's first, whose cache figures
	// count: a prompt counts once in usage.
	first  bool
	prompt []int32
	echo   string
	st     Stream
	text   textStream
	tokens int // completion tokens
	finish string
	// echoed says the prompt text went out already (streams send it with
	// the choice's first chunk).
	echoed bool
	// msg reads a chat choice's text into content, reasoning and calls.
	msg *chatText

	// logprobs, filled only when asked for
	legacy *openai.CompletionLogprobs
	chatLP *openai.ChatLogprobs
}

func (g *generation) params() scheduler.Params {
	sp := g.sampling
	d := g.s.o.Defaults
	if d.Temperature != nil && !sp.Given.Temperature {
		sp.Temperature = *d.Temperature
	}
	if d.TopP != nil && !sp.Given.TopP {
		sp.TopP = *d.TopP
	}
	if d.TopK != nil && !sp.Given.TopK {
		sp.TopK = max(0, *d.TopK)
	}
	if d.MinP != nil && !sp.Given.MinP {
		sp.MinP = *d.MinP
	}
	if d.MaxTokens != nil && sp.MaxTokens == 0 {
		sp.MaxTokens = *d.MaxTokens
	}
	p := scheduler.Params{
		Sampling: model.Sampling{Temperature: sp.Temperature, TopP: sp.TopP, TopK: sp.TopK, MinP: sp.MinP,
			LogitBias: sp.LogitBias, PresencePenalty: sp.PresencePenalty, FrequencyPenalty: sp.FrequencyPenalty,
			RepetitionPenalty: sp.RepetitionPenalty},
		MaxTokens: sp.MaxTokens, StopTokenIDs: sp.StopTokenIDs, IgnoreEOS: sp.IgnoreEOS, MinTokens: sp.MinTokens,
	}
	if sp.Logprobs {
		p.Sampling.TopLogprobs = sp.TopLogprobs
	}
	p.PromptLogprobs = g.echoLogprobs
	p.Constraint = scheduler.Constraint{Kind: sp.Constraint.Kind, Spec: sp.Constraint.Spec}
	p.Tenant = g.tenant
	if sp.Seed != nil {
		seed := uint64(*sp.Seed)
		p.Seed = &seed
	}
	return p
}

// choiceSeed gives choice i a seed of its own: choice 0 keeps the request's
// (so n=1 and the first of n agree), the others are spread by an odd
// constant so that no two choices of nearby seeds coincide.
func choiceSeed(seed uint64, i int) uint64 {
	return seed + uint64(i)*0x9e3779b97f4a7c15
}

// tooLong tells a refusal for the context's length, which clients
// recognise by its code (OpenAI's context_length_exceeded) to cut the
// prompt and retry. A worker's refusal relayed by the router has lost its
// reason on the way, but keeps the door's wording.
func tooLong(reason, msg string) bool {
	return reason == "too_long" || strings.Contains(msg, "maximum context length")
}

func rejectToOpenAI(err error, param string) *openai.Error {
	var rej *scheduler.RejectError
	if errors.As(err, &rej) {
		switch rej.Status {
		case http.StatusBadRequest:
			if tooLong(rej.Reason, rej.Message) {
				return openai.PromptTooLong(rej.Message, param)
			}
			return openai.BadRequest(rej.Message, param)
		case http.StatusTooManyRequests:
			return openai.TooManyRequests(rej.Message, time.Duration(max(1, rej.RetryAfter))*time.Second)
		default:
			return openai.ServiceUnavailable(rej.Message, time.Duration(max(1, rej.RetryAfter))*time.Second)
		}
	}
	e := openai.Internal(err.Error())
	// A failed handoff is the router's 502 or 504, not the server's 500.
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) && hs.HTTPStatus() > 500 {
		e.Status = hs.HTTPStatus()
	}
	return e
}

// start opens the n generations; if one is refused, those already started
// are cancelled and the refusal is the answer. A generator that waits for
// the first token (the router) is asked for the n at once, and gives up
// when the client leaves.
func (g *generation) start(ctx context.Context) *openai.Error {
	if g.s.draining.Load() {
		if m := g.s.o.Metrics; m != nil {
			m.Reject("shutting_down")
			m.Outcome("rejected")
		}
		return openai.ServiceUnavailable("the server is shutting down; retry the request", time.Second)
	}
	n := max(1, g.sampling.N)
	total := n * len(g.batch)
	base := g.params()
	if c := base.Constraint; c.Kind != "" {
		// Compiled here once, so a schema that cannot be followed is the
		// client's 400 before any worker holds anything.
		if g.s.o.Constraints == nil {
			return openai.BadRequest("structured output (response_format, regex, ebnf) is not available on this server", "response_format")
		}
		if err := g.s.o.Constraints(c, base.Tenant); err != nil {
			return openai.BadRequest(err.Error(), constraintParam(c))
		}
	}
	streams, errs := make([]Stream, total), make([]error, total)
	gen := func(i int) {
		p := base
		// Each prompt's choices are seeded as the prompt alone would be,
		// so a batch answers what its prompts sent one by one would.
		if p.Seed != nil {
			seed := choiceSeed(*p.Seed, i%n)
			p.Seed = &seed
		}
		id := g.id
		if total > 1 {
			id = fmt.Sprintf("%s-%d", g.id, i)
		}
		prompt := g.batch[i/n]
		if cg, ok := g.s.o.Generator.(ContextGenerator); ok {
			streams[i], errs[i] = cg.GenerateContext(ctx, id, prompt, p)
		} else {
			streams[i], errs[i] = g.s.o.Generator.Generate(id, prompt, p)
		}
	}
	if _, ok := g.s.o.Generator.(ContextGenerator); ok && total > 1 {
		var wg sync.WaitGroup
		for i := range total {
			wg.Go(func() { gen(i) })
		}
		wg.Wait()
	} else {
		for i := range total {
			if gen(i); errs[i] != nil {
				break
			}
		}
	}
	for _, err := range errs {
		if err != nil {
			for _, st := range streams {
				if st != nil {
					st.Cancel()
				}
			}
			return rejectToOpenAI(err, g.promptParam)
		}
	}
	for i, st := range streams {
		c := &choice{index: i, first: i%n == 0, prompt: g.batch[i/n], st: st, text: textStream{dec: g.s.o.Tokenizer.NewStreamDecoder(), stops: g.sampling.Stop, minTokens: g.sampling.MinTokens}}
		if g.chat {
			c.msg = newChatText(g.s, g.plan)
		}
		if len(g.echo) > 0 {
			c.echo = g.echo[i/n]
		}
		if g.sampling.Logprobs {
			if g.chat {
				c.chatLP = &openai.ChatLogprobs{}
			} else {
				c.legacy = &openai.CompletionLogprobs{}
			}
		}
		g.choices = append(g.choices, c)
	}
	return nil
}

func (g *generation) cancel() {
	for _, c := range g.choices {
		c.st.Cancel()
	}
}

// event is one choice's next event; ok is false when the client left.
type event struct {
	c  *choice
	ev scheduler.Event
	ok bool
}

// listen reads every choice's events into one channel, so that the choices
// of a stream interleave as their tokens come. Readers give up when done
// closes, so none outlives the request.
func (g *generation) listen(r *http.Request, done <-chan struct{}) <-chan event {
	ch := make(chan event)
	for _, c := range g.choices {
		go func() {
			for {
				ev, ok := c.st.Next(r.Context())
				select {
				case ch <- event{c, ev, ok}:
				case <-done:
					return
				}
				if !ok || ev.Finish != "" {
					return
				}
			}
		}()
	}
	return ch
}

// open starts g on prompt (on g.batch when set) and listens for its events until done closes;
// false when it could not start, the error already written to w.
func (g *generation) open(w http.ResponseWriter, r *http.Request, prompt []int32, done <-chan struct{}) (<-chan event, bool) {
	g.created = time.Now().Unix()
	if g.batch == nil {
		g.batch = [][]int32{prompt}
	}
	if e := g.start(g.traced(w, r)); e != nil {
		g.traceEnd(e.Status)
		openai.WriteError(w, e)
		return nil, false
	}
	return g.listen(r, done), true
}

func (g *generation) run(w http.ResponseWriter, r *http.Request, prompt []int32) {
	done := make(chan struct{})
	defer close(done)
	defer g.traceEnd(0)
	events, ok := g.open(w, r, prompt, done)
	if !ok {
		return
	}
	var sse *openai.SSE
	if g.stream {
		sse = openai.NewSSE(w)
		if g.chat {
			empty := ""
			for _, c := range g.choices {
				if err := sse.Send(g.chatChunk(c, openai.ChatDelta{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
					g.cancel()
					return
				}
			}
		}
	}
	for open := len(g.choices); open > 0; {
		e := <-events
		c, ev := e.c, e.ev
		if ev.Spec != nil {
			g.spec = g.spec.Add(*ev.Spec)
		}
		if c.finish != "" {
			continue // a stop string ended it; the engine's finish is news to no one
		}
		if !e.ok { // the client went away
			g.cancel()
			return
		}
		var piece string
		if ev.Token != nil {
			if c.tokens == 0 && c.first {
				g.cached += ev.CachedTokens
			}
			if c.tokens == 0 && g.echoLogprobs {
				g.addPromptLogprobs(c, ev.Prompt)
			}
			c.tokens++
			// A token's offset is where its text starts, held-back text
			// included.
			at := c.text.decoded()
			var stopped bool
			piece, stopped = c.text.push(ev.Token.ID)
			g.addLogprobs(c, ev.Token, at)
			if stopped {
				c.st.Stop()
				c.finish = openai.FinishStop
			}
		}
		if ev.Finish != "" && c.finish == "" {
			switch ev.Finish {
			case scheduler.FinishStop, scheduler.FinishLength:
				c.finish = ev.Finish
				piece += c.text.flush()
			default:
				g.cancel()
				e := g.s.eventError(g.id, ev)
				g.traceEnd(e.Status)
				if sse != nil {
					_ = sse.SendError(e)
					_ = sse.Done()
				} else {
					openai.WriteError(w, e)
				}
				return
			}
		}
		cp := chatPiece{content: piece}
		if c.msg != nil {
			cp = c.msg.push(piece, c.finish != "")
			if c.finish == openai.FinishStop && len(c.msg.calls) > 0 {
				c.finish = openai.FinishToolCalls
			}
		}
		if c.finish != "" {
			open--
		}
		if sse != nil && (!cp.empty() || c.finish != "" || (ev.Token != nil && g.sampling.Logprobs) || (c.echo+g.plan.echo != "" && !c.echoed)) {
			if err := g.sendChunk(sse, c, cp); err != nil {
				g.cancel()
				return
			}
		}
	}
	tokens := 0
	for _, c := range g.choices {
		tokens += c.tokens
	}
	prompts := 0
	for _, p := range g.batch {
		prompts += len(p)
	}
	usage := openai.NewUsage(prompts, tokens).WithCached(g.cached)
	if c := g.spec; c.Steps > 0 {
		usage.SpecUsage = &openai.SpecUsage{SpecVerifyCt: c.Steps, SpecDraftTokenNum: c.Drafted, SpecAcceptTokenNum: c.Accepted,
			SpecAcceptLength: c.AcceptLength(), SpecAcceptRate: c.AcceptRate()}
	}
	if sse != nil {
		if g.includeUsage {
			if g.chat {
				_ = sse.Send(openai.ChatCompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Choices: []openai.ChatChunkChoice{}, Usage: usage})
			} else {
				_ = sse.Send(openai.CompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Choices: []openai.CompletionChoice{}, Usage: usage})
			}
		}
		_ = sse.Done()
		return
	}
	if g.chat {
		out := make([]openai.ChatChoice, len(g.choices))
		for i, c := range g.choices {
			finish := c.finish
			out[i] = openai.ChatChoice{Index: c.index, Message: c.msg.message(g.plan.echo), Logprobs: c.chatLP, FinishReason: &finish}
		}
		writeJSON(w, http.StatusOK, openai.ChatCompletionResponse{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Usage: usage, Choices: out})
		return
	}
	out := make([]openai.CompletionChoice, len(g.choices))
	for i, c := range g.choices {
		finish := c.finish
		out[i] = openai.CompletionChoice{Index: c.index, Text: c.echo + c.text.out.String(), Logprobs: c.legacy, FinishReason: &finish}
	}
	writeJSON(w, http.StatusOK, openai.CompletionResponse{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Usage: usage, Choices: out})
}

// eventError maps a failed generation to the error the client sees. A
// generator that attached a status (the router) wrote its message for the
// client; an engine's own failure names pages and checks, which go to the
// log under the request id while the client learns what it can act on.
func (s *Server) eventError(id string, ev scheduler.Event) *openai.Error {
	err := ev.Err
	var hs interface{ HTTPStatus() int }
	if errors.As(err, &hs) {
		msg := "generation failed: " + errText(err)
		switch st := hs.HTTPStatus(); {
		case st == http.StatusBadRequest:
			if tooLong("", msg) {
				return openai.PromptTooLong(msg, "")
			}
			return openai.BadRequest(msg, "")
		case st == http.StatusTooManyRequests:
			return openai.TooManyRequests(msg, time.Second)
		case st == http.StatusServiceUnavailable:
			return openai.ServiceUnavailable(msg, time.Second)
		case st >= 500:
			e := openai.Internal(msg)
			e.Status = st
			return e
		}
		return openai.Internal(msg)
	}
	s.log.Warn("generation failed", "request_id", id, "finish", ev.Finish, "err", errText(err))
	if ev.Finish == scheduler.FinishSpecAnomaly {
		e := openai.Internal("generation stopped: speculative decoding found the KV cache suspect (spec_anomaly); retry the request")
		code := scheduler.FinishSpecAnomaly
		e.Code = &code
		return e
	}
	if ev.Finish == scheduler.FinishAbort {
		return openai.ServiceUnavailable("the request was aborted before it finished; retry it", time.Second)
	}
	return openai.Internal("generation failed inside the server; its log has the cause under request id " + id)
}

func errText(err error) string {
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}

// sendChunk sends what c produced since its last chunk (text; for chat
// also reasoning and tool-call deltas) and, in the chunk that ends the
// choice, its finish reason. Logprobs are sent with the
// chunk of the token they belong to and then forgotten.
func (g *generation) sendChunk(sse *openai.SSE, c *choice, cp chatPiece) error {
	var fin *string
	if c.finish != "" {
		f := c.finish
		fin = &f
	}
	piece := cp.content
	if g.chat {
		var delta openai.ChatDelta
		if !c.echoed {
			piece, c.echoed = g.plan.echo+piece, true
		}
		if piece != "" {
			delta.Content = &piece
		}
		if cp.reasoning != "" {
			delta.ReasoningContent = &cp.reasoning
		}
		delta.ToolCalls = cp.calls
		lp := c.chatLP
		if lp != nil {
			c.chatLP = &openai.ChatLogprobs{}
		}
		return sse.Send(g.chatChunk(c, delta, lp, fin))
	}
	if !c.echoed {
		piece, c.echoed = c.echo+piece, true
	}
	lp := c.legacy
	if lp != nil {
		c.legacy = &openai.CompletionLogprobs{}
	}
	return sse.Send(openai.CompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName,
		Choices: []openai.CompletionChoice{{Index: c.index, Text: piece, Logprobs: lp, FinishReason: fin}}})
}

func (g *generation) chatChunk(c *choice, d openai.ChatDelta, lp *openai.ChatLogprobs, fin *string) openai.ChatCompletionChunk {
	return openai.ChatCompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName,
		Choices: []openai.ChatChunkChoice{{Index: c.index, Delta: d, Logprobs: lp, FinishReason: fin}}}
}

func (g *generation) addLogprobs(c *choice, t *model.Sampled, offset int) {
	tok := g.s.o.Tokenizer
	switch {
	case c.chatLP != nil:
		e := openai.ChatTokenLogprob{Token: tok.TokenText(t.ID), Logprob: openai.Logprob(t.Logprob)}
		e.Bytes = openai.TokenBytes(e.Token)
		for _, a := range t.Top {
			s := tok.TokenText(a.ID)
			e.TopLogprobs = append(e.TopLogprobs, openai.TopLogprob{Token: s, Logprob: openai.Logprob(a.Logprob), Bytes: openai.TokenBytes(s)})
		}
		c.chatLP.Content = append(c.chatLP.Content, e)
	case c.legacy != nil:
		var top map[string]openai.Logprob
		if len(t.Top) > 0 {
			top = map[string]openai.Logprob{}
			for _, a := range t.Top {
				top[tok.TokenText(a.ID)] = openai.Logprob(a.Logprob)
			}
		}
		// Offsets count from the start of the choice's text, echo included.
		c.legacy.Add(tok.TokenText(t.ID), float64(t.Logprob), top, len(c.echo)+offset)
	}
}

// addPromptLogprobs puts the echoed prompt's tokens in front of c's
// logprobs: the first with null logprob, the others with what the model
// predicted for them (lp, tokens 1..n-1; a missing one is null too).
// Offsets are into the echoed text: the prompt decoded token by token,
// less what decoding adds in front of it (the space of a SentencePiece
// vocabulary).
func (g *generation) addPromptLogprobs(c *choice, lp []model.Sampled) {
	if c.legacy == nil {
		return
	}
	tok := g.s.o.Tokenizer
	dec := tok.NewStreamDecoder()
	offsets := make([]int, len(c.prompt))
	n := 0
	for i, id := range c.prompt {
		offsets[i] = n
		n += len(dec.Push(id))
	}
	n += len(dec.Flush())
	shift := max(0, n-len(c.echo))
	for i, id := range c.prompt {
		off := min(max(0, offsets[i]-shift), len(c.echo))
		if i == 0 || i-1 >= len(lp) {
			c.legacy.AddUnscored(tok.TokenText(id), off)
			continue
		}
		t := lp[i-1]
		var top map[string]openai.Logprob
		if len(t.Top) > 0 {
			top = map[string]openai.Logprob{}
			for _, a := range t.Top {
				top[tok.TokenText(a.ID)] = openai.Logprob(a.Logprob)
			}
		}
		c.legacy.Add(tok.TokenText(id), float64(t.Logprob), top, off)
	}
}

// textStream turns generated tokens into text, holding back what might be
// the start of a stop string so that a stop string never reaches the client.
type textStream struct {
	dec   *tokenizer.StreamDecoder
	stops []string
	// minTokens: stop strings count only from that many tokens on, as
	// vLLM does, so that min_tokens means what it says for them too.
	minTokens int
	pushed    int
	pending   string          // decoded, not yet released
	out       strings.Builder // released text
	done      bool
}

// decoded is the length of the text decoded so far, released or held.
func (t *textStream) decoded() int { return t.out.Len() + len(t.pending) }

// push adds a token; it returns the text now safe to release and whether a
// stop string matched (the text before it is released, the rest dropped).
func (t *textStream) push(id int32) (string, bool) {
	if t.done {
		return "", true
	}
	t.pending += t.dec.Push(id)
	t.pushed++
	return t.release(false)
}

// flush releases everything held back at the end of generation.
func (t *textStream) flush() string {
	if t.done {
		return ""
	}
	t.pending += t.dec.Flush()
	s, _ := t.release(true)
	return s
}

func (t *textStream) release(final bool) (string, bool) {
	cut := -1
	stops := t.stops
	if t.pushed < t.minTokens {
		stops = nil
	}
	for _, s := range stops {
		if i := strings.Index(t.pending, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		s := t.pending[:cut]
		t.out.WriteString(s)
		t.pending, t.done = "", true
		return s, true
	}
	keep := 0
	if !final {
		for _, s := range t.stops {
			keep = max(keep, overlap(t.pending, s))
		}
	}
	s := t.pending[:len(t.pending)-keep]
	t.pending = t.pending[len(t.pending)-keep:]
	t.out.WriteString(s)
	return s, false
}

// overlap is the length of the longest suffix of text that is a proper
// prefix of stop.
func overlap(text, stop string) int {
	for n := min(len(text), len(stop)-1); n > 0; n-- {
		if strings.HasSuffix(text, stop[:n]) {
			return n
		}
	}
	return 0
}
