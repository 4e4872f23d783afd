package server

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
)

// generation is one completions or chat request from prompt to last byte.
type generation struct {
	s            *Server
	chat         bool
	stream       bool
	includeUsage bool
	sampling     openai.Sampling
	id           string
	promptParam  string
	created      int64

	text   textStream
	tokens int // completion tokens
	finish string

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
	if sp.Seed != nil {
		seed := uint64(*sp.Seed)
		p.Seed = &seed
	}
	return p
}

func rejectToOpenAI(err error, param string) *openai.Error {
	var rej *scheduler.RejectError
	if errors.As(err, &rej) {
		switch rej.Status {
		case http.StatusBadRequest:
			return openai.BadRequest(rej.Message, param)
		case http.StatusTooManyRequests:
			return openai.TooManyRequests(rej.Message, time.Duration(rej.RetryAfter)*time.Second)
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

func (g *generation) run(w http.ResponseWriter, r *http.Request, prompt []int32) {
	g.created = time.Now().Unix()
	g.text = textStream{dec: g.s.o.Tokenizer.NewStreamDecoder(), stops: g.sampling.Stop}
	if g.sampling.Logprobs {
		if g.chat {
			g.chatLP = &openai.ChatLogprobs{}
		} else {
			g.legacy = &openai.CompletionLogprobs{}
		}
	}
	st, err := g.s.o.Generator.Generate(g.id, prompt, g.params())
	if err != nil {
		openai.WriteError(w, rejectToOpenAI(err, g.promptParam))
		return
	}
	ctx := r.Context()
	var sse *openai.SSE
	if g.stream {
		sse = openai.NewSSE(w)
		if g.chat {
			empty := ""
			if err := sse.Send(g.chatChunk(openai.ChatDelta{Role: "assistant", Content: &empty}, nil, nil)); err != nil {
				st.Cancel()
				return
			}
		}
	}
	for g.finish == "" {
		ev, ok := st.Next(ctx)
		if !ok { // the client went away
			st.Cancel()
			return
		}
		var piece string
		if ev.Token != nil {
			g.tokens++
			var stopped bool
			piece, stopped = g.text.push(ev.Token.ID)
			g.addLogprobs(ev.Token)
			if stopped {
				st.Stop()
				g.finish = openai.FinishStop
			}
		}
		if ev.Finish != "" && g.finish == "" {
			switch ev.Finish {
			case scheduler.FinishStop, scheduler.FinishLength:
				g.finish = ev.Finish
				piece += g.text.flush()
			default:
				e := g.s.eventError(g.id, ev)
				if sse != nil {
					_ = sse.SendError(e)
					_ = sse.Done()
				} else {
					openai.WriteError(w, e)
				}
				return
			}
		}
		if sse != nil && (piece != "" || g.finish != "" || (ev.Token != nil && g.sampling.Logprobs)) {
			if err := g.sendChunk(sse, piece); err != nil {
				st.Cancel()
				return
			}
		}
	}
	if sse != nil {
		if g.includeUsage {
			usage := openai.NewUsage(len(prompt), g.tokens)
			if g.chat {
				_ = sse.Send(openai.ChatCompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Choices: []openai.ChatChunkChoice{}, Usage: usage})
			} else {
				_ = sse.Send(openai.CompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Choices: []openai.CompletionChoice{}, Usage: usage})
			}
		}
		_ = sse.Done()
		return
	}
	usage := openai.NewUsage(len(prompt), g.tokens)
	finish := g.finish
	if g.chat {
		writeJSON(w, http.StatusOK, openai.ChatCompletionResponse{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Usage: usage,
			Choices: []openai.ChatChoice{{Message: openai.ChatMessage{Role: "assistant", Content: g.text.out.String()}, Logprobs: g.chatLP, FinishReason: &finish}}})
		return
	}
	writeJSON(w, http.StatusOK, openai.CompletionResponse{ID: g.id, Created: g.created, Model: g.s.o.ModelName, Usage: usage,
		Choices: []openai.CompletionChoice{{Text: g.text.out.String(), Logprobs: g.legacy, FinishReason: &finish}}})
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
			return openai.BadRequest(msg, "")
		case st == http.StatusServiceUnavailable || st == http.StatusTooManyRequests:
			return openai.ServiceUnavailable(msg, time.Second)
		case st >= 500:
			e := openai.Internal(msg)
			e.Status = st
			return e
		}
		return openai.Internal(msg)
	}
	s.log.Warn("generation failed", "request_id", id, "finish", ev.Finish, "err", errText(err))
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

// sendChunk sends the text produced since the last chunk and, in the chunk
// that ends the choice, its finish reason. Logprobs are sent with the chunk
// of the token they belong to and then forgotten.
func (g *generation) sendChunk(sse *openai.SSE, piece string) error {
	var fin *string
	if g.finish != "" {
		f := g.finish
		fin = &f
	}
	if g.chat {
		var delta openai.ChatDelta
		if piece != "" {
			delta.Content = &piece
		}
		lp := g.chatLP
		if lp != nil {
			g.chatLP = &openai.ChatLogprobs{}
		}
		return sse.Send(g.chatChunk(delta, lp, fin))
	}
	lp := g.legacy
	if lp != nil {
		g.legacy = &openai.CompletionLogprobs{}
	}
	return sse.Send(openai.CompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName,
		Choices: []openai.CompletionChoice{{Text: piece, Logprobs: lp, FinishReason: fin}}})
}

func (g *generation) chatChunk(d openai.ChatDelta, lp *openai.ChatLogprobs, fin *string) openai.ChatCompletionChunk {
	return openai.ChatCompletionChunk{ID: g.id, Created: g.created, Model: g.s.o.ModelName,
		Choices: []openai.ChatChunkChoice{{Delta: d, Logprobs: lp, FinishReason: fin}}}
}

func (g *generation) addLogprobs(t *model.Sampled) {
	tok := g.s.o.Tokenizer
	switch {
	case g.chatLP != nil:
		e := openai.ChatTokenLogprob{Token: tok.TokenText(t.ID), Logprob: openai.Logprob(t.Logprob)}
		e.Bytes = openai.TokenBytes(e.Token)
		for _, a := range t.Top {
			s := tok.TokenText(a.ID)
			e.TopLogprobs = append(e.TopLogprobs, openai.TopLogprob{Token: s, Logprob: openai.Logprob(a.Logprob), Bytes: openai.TokenBytes(s)})
		}
		g.chatLP.Content = append(g.chatLP.Content, e)
	case g.legacy != nil:
		var top map[string]openai.Logprob
		if len(t.Top) > 0 {
			top = map[string]openai.Logprob{}
			for _, a := range t.Top {
				top[tok.TokenText(a.ID)] = openai.Logprob(a.Logprob)
			}
		}
		g.legacy.Add(tok.TokenText(t.ID), float64(t.Logprob), top, g.text.out.Len())
	}
}

// textStream turns generated tokens into text, holding back what might be
// the start of a stop string so that a stop string never reaches the client.
type textStream struct {
	dec     *tokenizer.StreamDecoder
	stops   []string
	pending string          // decoded, not yet released
	out     strings.Builder // released text
	done    bool
}

// push adds a token; it returns the text now safe to release and whether a
// stop string matched (the text before it is released, the rest dropped).
func (t *textStream) push(id int32) (string, bool) {
	if t.done {
		return "", true
	}
	t.pending += t.dec.Push(id)
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
	for _, s := range t.stops {
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
