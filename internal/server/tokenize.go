package server

import (
	"bytes"
	"encoding/json"
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
	f, e := s.readFields(w, r)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	addSpecial := true
	if raw, ok := f["add_special_tokens"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &addSpecial); err != nil {
			openai.WriteError(w, openai.BadRequest("add_special_tokens must be a boolean", "add_special_tokens"))
			return
		}
	}
	var ids []int32
	switch _, hasMsgs := f["messages"]; {
	case hasMsgs:
		req, e := openai.ParseChatRequest(withModel(f))
		if e != nil {
			openai.WriteError(w, e)
			return
		}
		text, e := s.renderChat(req)
		if e != nil {
			openai.WriteError(w, e)
			return
		}
		ids = s.encodeChat(text)
	default:
		req, e := openai.ParseCompletionRequest(withModel(f))
		if e != nil {
			openai.WriteError(w, e)
			return
		}
		ids = req.PromptTokenIDs
		if ids == nil {
			if e := s.cannotFit(req.Prompt, "prompt"); e != nil {
				openai.WriteError(w, e)
				return
			}
			ids = s.o.Tokenizer.Encode(req.Prompt, addSpecial, true)
		}
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Tokens: nonNil(ids), Count: len(ids), MaxModelLen: s.maxModelLen()})
}

// detokenize answers POST /detokenize: {"tokens"} back to text.
func (s *Server) detokenize(w http.ResponseWriter, r *http.Request) {
	f, e := s.readFields(w, r)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	var ids []int64
	if raw, ok := f["tokens"]; !ok || isNull(raw) || json.Unmarshal(raw, &ids) != nil {
		openai.WriteError(w, openai.BadRequest("tokens must be an array of token ids", "tokens"))
		return
	}
	vocab := s.o.Tokenizer.VocabSize()
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(vocab) {
			openai.WriteError(w, openai.BadRequest(fmt.Sprintf("token id %d is outside the vocabulary (0..%d)", id, vocab-1), fmt.Sprintf("tokens[%d]", i)))
			return
		}
		toks[i] = int32(id)
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": s.promptText(toks)})
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

// checkModelField accepts an absent model (these endpoints do not need
// one) or the served one.
func (s *Server) checkModelField(raw json.RawMessage) *openai.Error {
	if len(raw) == 0 || isNull(raw) {
		return nil
	}
	var m string
	if json.Unmarshal(raw, &m) != nil {
		return openai.BadRequest("model must be a string", "model")
	}
	if m != s.o.ModelName {
		return s.unknownModel(m)
	}
	return nil
}

// withModel gives the body a model so that the request parsers, which
// require one, can read the rest; the model was checked already.
func withModel(f map[string]json.RawMessage) []byte {
	f["model"] = json.RawMessage(`"m"`)
	b, _ := json.Marshal(f)
	return b
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

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
	text, err := s.o.Template.RenderWith(msgs, true, vars)
	if err != nil {
		return "", openai.BadRequest("the chat template could not render these messages: "+err.Error(), "messages")
	}
	if e := s.cannotFit(text, "messages"); e != nil {
		return "", e
	}
	return text, nil
}

// encodeChat tokenizes a rendered conversation. Templates that write the
// BOS text themselves must not get a second one.
func (s *Server) encodeChat(text string) []int32 {
	bos := s.o.Tokenizer.TokenText(s.o.Tokenizer.BOS())
	addBOS := bos == "" || !strings.HasPrefix(text, bos)
	return s.o.Tokenizer.Encode(text, addBOS, true)
}

// readFields reads a /tokenize or /detokenize body: a JSON object whose
// optional model must be this server's.
func (s *Server) readFields(w http.ResponseWriter, r *http.Request) (map[string]json.RawMessage, *openai.Error) {
	body, e := s.readBody(w, r)
	if e != nil {
		return nil, e
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(body, &f); err != nil || f == nil {
		return nil, openai.BadRequest("request body must be a JSON object", "")
	}
	if e := s.checkModelField(f["model"]); e != nil {
		return nil, e
	}
	return f, nil
}
