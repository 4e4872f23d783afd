// Package toolcall turns a model's text into OpenAI tool calls, for the
// wire formats SGLang's --tool-call-parser names: hermes and qwen25
// (<tool_call>{json}</tool_call>), llama3 (bare JSON objects, or after
// <|python_tag|>, separated by ";"), mistral ([TOOL_CALLS] [json, ...])
// and pythonic ([f(a=1), g(b="x")]).
//
// A Parser reads text as it is generated and says, at each step, what
// may go to the client: plain content, the start of a call (its index and
// name) and fragments of its arguments. Text that may still turn out to
// be part of a call is held back until it is known. Every step re-reads
// the text so far from the start and reports only what is new, so a text
// gives the same calls whether it arrives at once or a byte at a time.
package toolcall

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Formats are the parser names New accepts.
var Formats = []string{"hermes", "qwen25", "llama3", "mistral", "pythonic"}

// Call is one complete tool call.
type Call struct {
	ID        string
	Name      string
	Arguments string // JSON text
}

// CallDelta is what one step adds to call Index: the first delta of a call
// carries its ID and Name, the later ones fragments of Arguments.
type CallDelta struct {
	Index     int
	ID, Name  string
	Arguments string
}

// Delta is what one step adds: content text and call deltas.
type Delta struct {
	Content string
	Calls   []CallDelta
}

// snapshot is what a format reads from the text so far: the content that
// is certainly not part of a call, and the calls begun.
type snapshot struct {
	content string
	calls   []callSnap
}

type callSnap struct {
	name     string
	nameDone bool
	args     string // raw text of the arguments value so far
	argsDone bool
}

// format reads a snapshot of text; atStart says text begins the answer
// (formats whose calls may open a bare answer look only there).
type format func(text string, final, atStart bool) snapshot

// Parser reads one choice's text.
type Parser struct {
	read format
	// skippable formats read the same calls from any suffix of the text
	// that starts after content already sent (a marker opens every call),
	// so that content is not read again: a long answer costs linear time.
	skippable bool
	text      strings.Builder
	skip      int // bytes at the start of text sent as content and not read again
	content   int // bytes of the snapshot's content sent
	sent      []sentCall
	calls     []Call
}

type sentCall struct {
	args int // bytes of args sent (raw form)
	done bool
}

// New returns a parser for a format of Formats.
func New(name string) (*Parser, error) {
	p := &Parser{}
	switch name {
	case "hermes", "qwen25":
		p.read, p.skippable = hermes, true
	case "llama3":
		p.read = llama3
	case "mistral":
		p.read, p.skippable = mistral, true
	case "pythonic":
		p.read = pythonic
	default:
		return nil, fmt.Errorf("unknown tool-call parser %q (%s)", name, strings.Join(Formats, ", "))
	}
	return p, nil
}

// Valid reports whether name is a parser New knows.
func Valid(name string) bool { return slices.Contains(Formats, name) }

// Push adds generated text and returns what may now be sent.
func (p *Parser) Push(s string) Delta {
	p.text.WriteString(s)
	return p.step(false)
}

// Finish ends the text and returns what was held back.
func (p *Parser) Finish() Delta { return p.step(true) }

// Calls are the calls read so far (complete after Finish).
func (p *Parser) Calls() []Call { return p.calls }

func (p *Parser) step(final bool) Delta {
	text := p.text.String()[p.skip:]
	sn := p.read(text, final, p.skip == 0)
	var d Delta
	// A snapshot never takes back what an earlier one said; should a
	// malformed text make it seem to, what was sent stands.
	if len(sn.content) > p.content {
		d.Content = sn.content[p.content:]
		p.content = len(sn.content)
	}
	if p.skippable && len(p.sent) == 0 && len(sn.calls) == 0 && p.content == len(sn.content) && strings.HasPrefix(text, sn.content) {
		p.skip += len(sn.content)
		p.content = 0
	}
	for i, c := range sn.calls {
		if !c.nameDone {
			break
		}
		if i == len(p.sent) {
			id := newID()
			p.sent = append(p.sent, sentCall{})
			p.calls = append(p.calls, Call{ID: id, Name: c.name})
			d.Calls = append(d.Calls, CallDelta{Index: i, ID: id, Name: c.name})
		}
		sc := &p.sent[i]
		if sc.done {
			continue
		}
		frag := ""
		raw := strings.HasPrefix(c.args, "{") || strings.HasPrefix(c.args, "[")
		switch {
		case raw && len(c.args) > sc.args:
			frag = c.args[sc.args:]
			sc.args = len(c.args)
		case !raw && c.argsDone:
			frag = c.args
			var s string
			if json.Unmarshal([]byte(c.args), &s) == nil {
				frag = s // arguments sent as a JSON string hold the JSON
			}
		case final && c.args == "" && sc.args == 0 && c.argsDone:
			frag = "{}" // a complete call without arguments
		}
		if c.argsDone || final {
			sc.done = true
		}
		if frag != "" {
			p.calls[i].Arguments += frag
			if n := len(d.Calls); n > 0 && d.Calls[n-1].Index == i {
				d.Calls[n-1].Arguments += frag
			} else {
				d.Calls = append(d.Calls, CallDelta{Index: i, Arguments: frag})
			}
		}
	}
	return d
}

func newID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "call_" + hex.EncodeToString(b[:])
}

const spaces = " \t\r\n"

// release is the part of s (content at the end of the text) that may be
// sent now: not a suffix that could begin one of markers, nor trailing
// space (which a call may yet follow). At the end all of it goes, but
// for the space after the last call.
func release(s string, markers []string, final, afterCalls bool) string {
	if final {
		if afterCalls {
			return strings.TrimRight(s, spaces)
		}
		return s
	}
	keep := 0
	for _, m := range markers {
		for n := min(len(s), len(m)-1); n > keep; n-- {
			if strings.HasSuffix(s, m[:n]) {
				keep = n
				break
			}
		}
	}
	return strings.TrimRight(s[:len(s)-keep], spaces)
}

func snapOf(o objectSnap) callSnap {
	return callSnap{name: o.name, nameDone: o.nameDone, args: o.args, argsDone: o.argsDone || o.done}
}

// nextOpen finds the next open tag at or after pos, for the parsers whose
// calls follow a tag. The text before it goes to content (trailing spaces
// cut); at is the tag's index and p the first non-space byte after it.
// more is false when the parse ends here: no tag (the rest released to
// content as far as it cannot be a tag's start), or the text ends right
// after the tag (kept as content once final).
func nextOpen(text string, pos int, open string, final, called bool, content *strings.Builder) (at, p int, more bool) {
	i := strings.Index(text[pos:], open)
	if i < 0 {
		content.WriteString(release(text[pos:], []string{open}, final, called))
		return 0, 0, false
	}
	at = pos + i
	content.WriteString(strings.TrimRight(text[pos:at], spaces))
	p = at + len(open)
	p += wsLen(text[p:])
	if p >= len(text) {
		if final {
			content.WriteString(text[at:])
		}
		return at, p, false
	}
	return at, p, true
}

// hermes reads <tool_call>{"name": ..., "arguments": ...}</tool_call>
// blocks (qwen25 is the same format).
func hermes(text string, final, _ bool) snapshot {
	const open, close = "<tool_call>", "</tool_call>"
	var sn snapshot
	var content strings.Builder
	pos := 0
	for {
		at, p, more := nextOpen(text, pos, open, final, len(sn.calls) > 0, &content)
		if !more {
			break
		}
		o := scanCall(text[p:], "arguments")
		if final && !o.done && !o.nameDone {
			content.WriteString(text[at:]) // a call that never began
			break
		}
		if !o.nameDone && (o.bad || o.done) {
			content.WriteString(open)
			pos = at + len(open)
			continue
		}
		sn.calls = append(sn.calls, snapOf(o))
		if o.bad {
			sn.calls[len(sn.calls)-1].argsDone = true
			j := strings.Index(text[p:], close)
			if j < 0 {
				break
			}
			pos = p + j + len(close)
			continue
		}
		if !o.done {
			break
		}
		q := p + o.end
		q += wsLen(text[q:])
		switch {
		case strings.HasPrefix(text[q:], close):
			pos = q + len(close)
			continue
		case strings.HasPrefix(close, text[q:]) && !final:
		default:
			pos = q
			continue
		}
		break
	}
	sn.content = content.String()
	return sn
}

const mistralOpen = "[TOOL_CALLS]"

// mistral reads [TOOL_CALLS] [{"name": ..., "arguments": ...}, ...]. A
// tokenizer that treats [TOOL_CALLS] as a control token leaves it out of
// the text, so a list of calls at the very start counts too.
func mistral(text string, final, atStart bool) snapshot {
	lead := wsLen(text)
	rest := text[lead:]
	if atStart && rest != "" && rest[0] == '[' && !strings.HasPrefix(rest, mistralOpen) {
		p := 1 + wsLen(rest[1:])
		switch {
		case p >= len(rest):
			if !final {
				return snapshot{} // may yet be a list of calls
			}
		case rest[p] == '{':
			o := scanCall(rest[p:], "arguments")
			if o.nameDone {
				return mistralCalls(mistralOpen+rest, final)
			}
			if !o.bad && !o.done && !final {
				return snapshot{}
			}
		}
	}
	return mistralCalls(text, final)
}

func mistralCalls(text string, final bool) snapshot {
	const open = mistralOpen
	var sn snapshot
	var content strings.Builder
	pos := 0
outer:
	for {
		at, p, more := nextOpen(text, pos, open, final, len(sn.calls) > 0, &content)
		if !more {
			break
		}
		if text[p] != '[' {
			content.WriteString(open)
			pos = at + len(open)
			continue
		}
		p++
		called := false
		for {
			p += wsLen(text[p:])
			if p >= len(text) {
				if final && !called {
					content.WriteString(text[at:])
				}
				break outer
			}
			switch text[p] {
			case ',':
				p++
				continue
			case ']':
				pos = p + 1
				continue outer
			}
			o := scanCall(text[p:], "arguments")
			if final && !o.done && !o.nameDone && !called {
				content.WriteString(text[at:])
				break outer
			}
			if !o.nameDone && (o.bad || o.done) && !called {
				content.WriteString(open)
				pos = at + len(open)
				continue outer
			}
			if o.bad || (o.done && !o.nameDone) {
				if o.nameDone {
					sn.calls = append(sn.calls, snapOf(o))
					sn.calls[len(sn.calls)-1].argsDone = true
				}
				pos = p
				continue outer
			}
			sn.calls = append(sn.calls, snapOf(o))
			called = true
			if !o.done {
				break outer
			}
			p += o.end
		}
	}
	sn.content = content.String()
	return sn
}

// llama3 reads JSON calls {"name": ..., "parameters": ...} separated by
// ";", at the very start of the text or after <|python_tag|>.
func llama3(text string, final, _ bool) snapshot {
	const tag = "<|python_tag|>"
	var sn snapshot
	start := -1
	lead := wsLen(text)
	switch {
	case lead == len(text) && !final:
		return sn
	case lead < len(text) && text[lead] == '{':
		start = lead
	default:
		if i := strings.Index(text, tag); i >= 0 {
			start = i + len(tag)
			sn.content = strings.TrimRight(text[:i], spaces)
		} else {
			sn.content = release(text, []string{tag}, final, false)
			return sn
		}
	}
	p := start
	for {
		p += wsLen(text[p:])
		if p >= len(text) {
			return sn
		}
		if text[p] == ';' {
			p++
			continue
		}
		if text[p] != '{' {
			break
		}
		o := scanCall(text[p:], "parameters", "arguments")
		if o.bad {
			if !o.nameDone {
				break
			}
			sn.calls = append(sn.calls, snapOf(o))
			sn.calls[len(sn.calls)-1].argsDone = true
			return sn
		}
		if !o.done {
			if !o.nameDone && len(sn.calls) == 0 && start == lead {
				if final {
					sn.content = text
				}
				return sn // a bare '{' that is not yet known to be a call
			}
			sn.calls = append(sn.calls, snapOf(o))
			return sn
		}
		if !o.nameDone {
			break // a JSON object, not a call
		}
		sn.calls = append(sn.calls, snapOf(o))
		p += o.end
	}
	if len(sn.calls) == 0 && start == lead {
		sn.content = release(text, nil, final, false)
		return sn
	}
	sn.content += release(text[p:], nil, final, true)
	return sn
}
