package server

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/tokenizer/chat"
)

// tokenizeResponse is vLLM's and SGLang's /tokenize answer.
type tokenizeResponse struct {
	Tokens      []int32 `json:"tokens"`
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
}

// tokenize answers POST /tokenize: {"prompt"} is tokenized as completions
// would tokenize it, {"messages"} as chat would (template and all), so a
// client can count what a request will cost before sending it.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	req, e := openai.ParseTokenizeRequest(body, s.limits())
	if e == nil {
		e = s.checkModelName(req.Model)
	}
	if e != nil {
		s.refused(e)
		openai.WriteError(w, e)
		return
	}
	var ids []int32
	if req.Chat != nil {
		text, e := s.renderChat(req.Chat)
		if e != nil {
			openai.WriteError(w, e)
			return
		}
		ids = s.encodeChat(text)
	} else {
		ids = req.Completion.PromptTokenIDs
		if ids == nil {
			if e := s.cannotFit(req.Completion.Prompt, "prompt"); e != nil {
				openai.WriteError(w, e)
				return
			}
			ids = s.o.Tokenizer.Encode(req.Completion.Prompt, req.AddSpecialTokens, s.o.AllowSpecialTokensInPrompt)
		}
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Tokens: nonNil(ids), Count: len(ids), MaxModelLen: s.maxModelLen()})
}

// detokenize answers POST /detokenize: {"tokens"} back to text.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	body, e := s.readBody(w, r)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	req, e := openai.ParseDetokenizeRequest(body, s.limits())
	if e == nil {
		e = s.checkModelName(req.Model)
	}
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	vocab := s.o.Tokenizer.VocabSize()
	for i, id := range req.Tokens {
		if int(id) >= vocab {
			openai.WriteError(w, openai.BadRequest(fmt.Sprintf("token id %d is outside the vocabulary (0..%d)", id, vocab-1), fmt.Sprintf("tokens[%d]", i)))
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": s.promptText(req.Tokens)})
}

// promptText turns prompt tokens back into the text they came from, as
// Hugging Face's decode does: a leading BOS and the space that encoding
// put in front of the first word are dropped, control tokens left out.
func (s *Server) promptText(ids []int32) string {
	if len(ids) > 0 && ids[0] == s.o.Tokenizer.BOS() {
		ids = ids[1:]
	}
	return s.o.Tokenizer.Detokenize(ids, false, false)
}

// checkModelName accepts no model (these endpoints do not need one) or
// the served one.
func (s *Server) checkModelName(m string) *openai.Error {
	if m != "" && m != s.o.ModelName {
		return s.unknownModel(m)
	}
	return nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// renderChat applies the chat template to a chat request, as /tokenize
// does: tools are rendered whether or not this server could parse calls.
func (s *Server) renderChat(req *openai.ChatRequest) (string, *openai.Error) {
	vars, e := templateVars(req)
	if e != nil {
		return "", e
	}
	return s.renderChatWith(req, vars)
}

// renderChatWith renders with the template variables of the request's
// plan (its chat_template_kwargs and tools).
func (s *Server) renderChatWith(req *openai.ChatRequest, vars map[string]any) (string, *openai.Error) {
	for _, k := range chat.Reserved {
		if _, ok := req.TemplateKwargs[k]; ok {
			return "", openai.BadRequest("chat_template_kwargs may not set "+k+"; the server sets it", "chat_template_kwargs")
		}
	}
	msgs := make([]chat.Message, len(req.Messages))
	for i, m := range req.Messages {
		msgs[i] = chat.Message{Role: m.Role, Content: m.Content, Name: m.Name, ToolCallID: m.ToolCallID}
		for _, c := range m.ToolCalls {
			msgs[i].ToolCalls = append(msgs[i].ToolCalls, chat.ToolCall{ID: c.ID, Name: c.Function.Name, Arguments: c.Function.Arguments})
		}
	}
	// What the client wrote is escaped, so that its control-token text
	// stays text while the template's markup becomes control tokens
	// (encodeChat).
	text, err := s.o.Template.RenderEscaped(msgs, true, vars, s.o.Tokenizer.EscapeSpecial)
	if err != nil {
		return "", openai.BadRequest("the chat template could not render these messages: "+err.Error(), "messages")
	}
	if e := s.cannotFit(text, "messages"); e != nil {
		return "", e
	}
	return text, nil
}

// encodeChat tokenizes a conversation rendered by renderChatWith: control
// tokens of the template's own text are parsed, those of the client's
// text spelled out. Templates that write the BOS text themselves must
// not get a second one.
func (s *Server) encodeChat(text string) []int32 {
	bos := s.o.Tokenizer.TokenText(s.o.Tokenizer.BOS())
	addBOS := bos == "" || !strings.HasPrefix(text, bos)
	return s.o.Tokenizer.EncodeEscaped(text, addBOS)
}
