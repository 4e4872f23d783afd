// Package reasoning splits a reasoning model's <think>…</think> block from
// its answer, as SGLang's --reasoning-parser does: deepseek-r1 starts in
// the block (its chat template opens it in the prompt) and takes all text
// as reasoning until </think>; qwen3 treats text as reasoning only when it
// begins with <think>. Text is split as it streams; a tag cut across
// pieces is held back until it is known.
package reasoning

import (
	"fmt"
	"slices"
	"strings"
)

// Formats are the parser names New accepts.
var Formats = []string{"deepseek-r1", "qwen3"}

const (
	openTag  = "<think>"
	closeTag = "</think>"
)

// Parser splits one choice's text.
type Parser struct {
	state   int
	pending string
	// sawReasoning: leading newlines after <think> are dropped; trailing
	// ones before </think> are held back until more reasoning follows.
	sawReasoning bool
	sawContent   bool
}

const (
	start     = iota // nothing seen yet (qwen3: may open a block)
	thinking         // inside the block
	answering        // after it, or with no block
)

// New returns a parser; enabled false (chat_template_kwargs
// enable_thinking=false for qwen3) gives one that passes all text through
// as content.
func New(name string, enabled bool) (*Parser, error) {
	p := &Parser{}
	switch name {
	case "deepseek-r1":
		p.state = thinking
	case "qwen3":
		p.state = start
	default:
		return nil, fmt.Errorf("unknown reasoning parser %q (%s)", name, strings.Join(Formats, ", "))
	}
	if !enabled {
		p.state = answering
	}
	return p, nil
}

// Valid reports whether name is a parser New knows.
func Valid(name string) bool { return slices.Contains(Formats, name) }

// Push adds text and returns the reasoning and the content it releases.
func (p *Parser) Push(s string) (reasoning, content string) {
	p.pending += s
	return p.step(false)
}

// Thinking reports whether the text read so far leaves the parser inside
// the reasoning block, which is how a token is counted as reasoning.
func (p *Parser) Thinking() bool { return p.state == thinking }

// Finish releases what was held back.
func (p *Parser) Finish() (reasoning, content string) { return p.step(true) }

func (p *Parser) step(final bool) (reasoning, content string) {
	var r, c strings.Builder
	for {
		switch p.state {
		case start:
			t := strings.TrimLeft(p.pending, " \t\r\n")
			if strings.HasPrefix(t, openTag) {
				p.pending = t[len(openTag):]
				p.state = thinking
				continue
			}
			if !final && strings.HasPrefix(openTag, t) {
				return r.String(), c.String() // may yet open the block
			}
			p.state = answering
		case thinking:
			if !p.sawReasoning {
				// deepseek-r1 models may repeat the tag the template opened
				t := strings.TrimLeft(p.pending, "\r\n")
				if strings.HasPrefix(t, openTag) {
					t = strings.TrimLeft(t[len(openTag):], "\r\n")
				} else if !final && t != "" && strings.HasPrefix(openTag, t) {
					p.pending = t
					return r.String(), c.String()
				}
				p.pending = t
			}
			if i := strings.Index(p.pending, closeTag); i >= 0 {
				r.WriteString(strings.TrimRight(p.pending[:i], "\r\n"))
				p.pending = strings.TrimLeft(p.pending[i+len(closeTag):], "\r\n")
				p.sawReasoning = true
				p.state = answering
				continue
			}
			if final {
				r.WriteString(strings.TrimRight(p.pending, "\r\n"))
				p.pending = ""
				return r.String(), c.String()
			}
			keep := holdBack(p.pending, closeTag)
			out := strings.TrimRight(p.pending[:len(p.pending)-keep], "\r\n")
			if out != "" {
				p.sawReasoning = true
			}
			r.WriteString(out)
			p.pending = p.pending[len(out):]
			return r.String(), c.String()
		case answering:
			out := p.pending
			if !p.sawContent {
				out = strings.TrimLeft(out, "\r\n")
			}
			if out != "" {
				p.sawContent = true
			}
			c.WriteString(out)
			p.pending = ""
			return r.String(), c.String()
		}
	}
}

// holdBack is the length of the longest suffix of s that is a proper
// prefix of tag.
func holdBack(s, tag string) int {
	for n := min(len(s), len(tag)-1); n > 0; n-- {
		if strings.HasSuffix(s, tag[:n]) {
			return n
		}
	}
	return 0
}
