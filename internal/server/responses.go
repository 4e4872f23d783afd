package server

import (
	"net/http"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/scheduler"
)

// responses answers POST /v1/responses: the request is served as the
// chat completion it amounts to, and the answer is written as a Response
// object (or its stream of events) with reasoning, message and
// function-call items in the order the model produced them.
func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	req, ok := parseRequest(s, w, r, openai.ParseResponsesRequestLimited, func(c *openai.ResponsesRequest) string { return c.Chat.Model })
	if !ok {
		return
	}
	cr := req.Chat
	if e := s.checkSampling(cr.Sampling); e != nil {
		openai.WriteError(w, e)
		return
	}
	plan, e := s.planChat(cr)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	text, e := s.renderChatWith(cr, plan.vars)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	prompt := s.encodeChat(text)
	g := &generation{s: s, chat: true, sampling: cr.Sampling, id: openai.NewID("resp_"), promptParam: "input", plan: plan,
		tenant: s.Tenant(r, cr.Sampling.CacheSalt)}
	done := make(chan struct{})
	defer close(done)
	defer g.traceEnd(0)
	events, ok := g.open(w, r, prompt, done)
	if !ok {
		return
	}
	c := g.choices[0]
	reasoningTokens := 0
	rw := &responseWriter{resp: openai.Response{ID: g.id, CreatedAt: g.created, Status: "in_progress", Model: s.o.ModelName, ResponsesEcho: req.Echo}}
	if req.Stream {
		rw.sse = openai.NewSSE(w)
		rw.send("response.created", map[string]any{"response": rw.resp})
		rw.send("response.in_progress", map[string]any{"response": rw.resp})
	}
	for c.finish == "" {
		ev := <-events
		if !ev.ok {
			g.cancel()
			return
		}
		var piece string
		if ev.ev.Token != nil {
			c.tokens++
			var stopped bool
			piece, stopped = c.text.push(ev.ev.Token.ID)
			if stopped {
				c.st.Stop()
				c.finish = openai.FinishStop
			}
		}
		if f := ev.ev.Finish; f != "" && c.finish == "" {
			switch f {
			case scheduler.FinishStop, scheduler.FinishLength:
				c.finish = f
				piece += c.text.flush()
			default:
				g.cancel()
				e := s.eventError(g.id, ev.ev)
				g.traceEnd(e.Status)
				if rw.sse == nil {
					openai.WriteError(w, e)
					return
				}
				rw.resp.Status, rw.resp.Error = "failed", e
				rw.send("response.failed", map[string]any{"response": rw.resp})
				return
			}
		}
		rw.add(c.msg.push(piece, c.finish != ""))
		// A token counts as reasoning when the parser is still inside the
		// block once the text released so far is read: the open tag and
		// the reasoning do, the close tag and the answer do not. Text held
		// back by a stop string is read a step late, so its tokens take
		// the state it finds then.
		if ev.ev.Token != nil && c.msg.reason != nil && c.msg.reason.Thinking() {
			reasoningTokens++
		}
		if rw.sse != nil && rw.sse.Err() != nil {
			g.cancel()
			return
		}
	}
	rw.resp.Status = "completed"
	if c.finish == openai.FinishLength {
		rw.resp.Status = "incomplete"
		rw.resp.IncompleteDetails = &openai.IncompleteReason{Reason: "max_output_tokens"}
	}
	// The item open at the end is the one the limit cut, if any.
	rw.closeAs(rw.resp.Status)
	rw.resp.Usage = openai.NewResponseUsage(len(prompt), c.tokens, reasoningTokens)
	if rw.sse == nil {
		writeJSON(w, http.StatusOK, rw.resp)
		return
	}
	name := "response.completed"
	if rw.resp.Status == "incomplete" {
		name = "response.incomplete"
	}
	rw.send(name, map[string]any{"response": rw.resp})
}

// responseWriter builds a response's output items as the answer streams,
// sending each item's events when streaming.
type responseWriter struct {
	resp openai.Response
	sse  *openai.SSE
	seq  int
	open int // index of the item being written, -1 when none
	// calls maps a tool call's index to its output item.
	calls map[int]int
	text  string // of the open item
}

func (rw *responseWriter) send(name string, ev map[string]any) {
	if rw.sse == nil {
		return
	}
	ev["type"] = name
	ev["sequence_number"] = rw.seq
	rw.seq++
	_ = rw.sse.SendEvent(name, ev)
}

// item opens a new output item of type typ, closing the one before.
func (rw *responseWriter) item(it openai.OutputItem) int {
	rw.close()
	it.Status = "in_progress"
	rw.resp.Output = append(rw.resp.Output, it)
	rw.open = len(rw.resp.Output) - 1
	rw.text = ""
	rw.send("response.output_item.added", map[string]any{"output_index": rw.open, "item": it})
	switch it.Type {
	case "message":
		rw.send("response.content_part.added", map[string]any{"item_id": it.ID, "output_index": rw.open, "content_index": 0,
			"part": openai.ContentPart{Type: "output_text"}})
	case "reasoning":
		rw.send("response.content_part.added", map[string]any{"item_id": it.ID, "output_index": rw.open, "content_index": 0,
			"part": openai.ContentPart{Type: "reasoning_text"}})
	}
	return rw.open
}

func (rw *responseWriter) current() *openai.OutputItem {
	if len(rw.resp.Output) == 0 || rw.open < 0 {
		return nil
	}
	return &rw.resp.Output[rw.open]
}

// close finishes the open item as completed.
func (rw *responseWriter) close() { rw.closeAs("completed") }

// closeAs finishes the open item with status (completed, or incomplete
// for the item max_output_tokens cut).
func (rw *responseWriter) closeAs(status string) {
	it := rw.current()
	if it == nil {
		return
	}
	i := rw.open
	switch it.Type {
	case "message":
		part := openai.ContentPart{Type: "output_text", Text: rw.text}
		it.Content = []openai.ContentPart{part}
		rw.send("response.output_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": rw.text, "logprobs": []any{}})
		rw.send("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "part": part})
	case "reasoning":
		part := openai.ContentPart{Type: "reasoning_text", Text: rw.text}
		it.Content = []openai.ContentPart{part}
		rw.send("response.reasoning_text.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "text": rw.text})
		rw.send("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": i, "content_index": 0, "part": part})
	case "function_call":
		rw.send("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": i, "name": it.Name, "arguments": *it.Arguments})
	}
	it.Status = status
	rw.send("response.output_item.done", map[string]any{"output_index": i, "item": *it})
	rw.open = -1
}

// add takes what one step added to the answer.
func (rw *responseWriter) add(p chatPiece) {
	if rw.calls == nil {
		rw.calls = map[int]int{}
		rw.open = -1
	}
	if p.reasoning != "" {
		if it := rw.current(); it == nil || it.Type != "reasoning" {
			rw.item(openai.OutputItem{Type: "reasoning", ID: openai.NewID("rs_")})
		}
		rw.text += p.reasoning
		rw.send("response.reasoning_text.delta", map[string]any{"item_id": rw.current().ID, "output_index": rw.open, "content_index": 0, "delta": p.reasoning})
	}
	if p.content != "" {
		if it := rw.current(); it == nil || it.Type != "message" {
			rw.item(openai.OutputItem{Type: "message", ID: openai.NewID("msg_"), Role: "assistant"})
		}
		it := rw.current()
		rw.text += p.content
		rw.send("response.output_text.delta", map[string]any{"item_id": it.ID, "output_index": rw.open, "content_index": 0, "delta": p.content, "logprobs": []any{}})
	}
	for _, c := range p.calls {
		if c.ID != "" {
			empty := ""
			rw.calls[c.Index] = rw.item(openai.OutputItem{Type: "function_call", ID: openai.NewID("fc_"), CallID: c.ID, Name: c.Function.Name, Arguments: &empty})
		}
		i, ok := rw.calls[c.Index]
		if !ok || c.Function.Arguments == "" {
			continue
		}
		it := &rw.resp.Output[i]
		*it.Arguments += c.Function.Arguments
		rw.send("response.function_call_arguments.delta", map[string]any{"item_id": it.ID, "output_index": i, "delta": c.Function.Arguments})
	}
}
