package server

import (
	"fmt"

	"github.com/batonlm/baton/api/openai"
)

// completionPrompts tokenizes a completions request's prompts into g's
// batch, with their echo texts when echo is asked for. Each prompt is
// checked as a request of its own would be; the first that cannot be
// served refuses the batch, naming it.
func (s *Server) completionPrompts(g *generation, req *openai.CompletionRequest) *openai.Error {
	g.batch = make([][]int32, len(req.Prompts))
	g.echoLogprobs = req.Echo && req.Sampling.Logprobs
	for i, p := range req.Prompts {
		param := "prompt"
		if len(req.Prompts) > 1 {
			param = fmt.Sprintf("prompt[%d]", i)
		}
		prompt := p.TokenIDs
		if prompt == nil {
			if e := s.cannotFit(p.Text, param); e != nil {
				return e
			}
			prompt = s.o.Tokenizer.Encode(p.Text, true, s.o.AllowSpecialTokensInPrompt)
		}
		g.batch[i] = prompt
		if !req.Echo {
			continue
		}
		echo := p.Text
		if p.TokenIDs != nil {
			echo = s.promptText(p.TokenIDs)
		}
		g.echo = append(g.echo, echo)
		if g.echoLogprobs && len(prompt) > maxEchoLogprobsTokens {
			return openai.BadRequest(fmt.Sprintf("echo with logprobs is limited to prompts of %d tokens; this one has %d", maxEchoLogprobsTokens, len(prompt)), "echo")
		}
	}
	return nil
}
