// Package server is baton's OpenAI-compatible HTTP surface: request
// validation, chat templates and tokenization, streaming, stop strings and
// the error shape. What generates the tokens sits behind Generator, so the
// standalone engine and the PD router serve the same surface.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/batonlm/baton/api/openai"
	"github.com/batonlm/baton/internal/httpauth"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tokenizer"
	"github.com/batonlm/baton/internal/tokenizer/chat"
)

// Stream is one generation in flight: events until one carries a finish
// reason. Cancel aborts it (the client left); Stop finishes it early (a stop
// string matched).
type Stream interface {
	Next(ctx context.Context) (scheduler.Event, bool)
	Cancel()
	Stop()
}

// Generator starts generations. A refusal at the door is returned as a
// *scheduler.RejectError.
type Generator interface {
	Generate(id string, prompt []int32, p scheduler.Params) (Stream, error)
}

// ContextGenerator is a Generator whose Generate waits (for the first
// token, for room) and gives up when ctx ends: the client left.
type ContextGenerator interface {
	Generator
	GenerateContext(ctx context.Context, id string, prompt []int32, p scheduler.Params) (Stream, error)
}

// EngineGenerator generates with a local engine (standalone role).
type EngineGenerator struct{ Engine *scheduler.Engine }

// Generate implements Generator.
func (g EngineGenerator) Generate(id string, prompt []int32, p scheduler.Params) (Stream, error) {
	r := scheduler.NewRequest(id, prompt, p)
	if err := g.Engine.Enqueue(r); err != nil {
		return nil, err
	}
	return r, nil
}

// Options configure a Server.
type Options struct {
	ModelName string
	APIKey    string
	Tokenizer *tokenizer.Tokenizer
	Template  *chat.Template
	Generator Generator
	Metrics   *metrics.Set
	// Info is served at /server_info (configuration and capacity).
	Info map[string]any
	// LiveInfo, when set, adds live figures (pool occupancy) to /server_info.
	LiveInfo func() map[string]any
	// Constraints checks that a structured-output constraint can be
	// followed with this server's vocabulary (compiling it, cached); nil
	// refuses every constraint.
	Constraints func(scheduler.Constraint, prefixcache.Salt) error
	// Defaults are the model's own sampling defaults (generation_config.json),
	// used for what a request leaves out; nil fields keep OpenAI's defaults.
	Defaults SamplingDefaults
	// MetricsRequireKey puts /metrics behind APIKey; by default it stays
	// open for scrapers.
	MetricsRequireKey bool
	// BodyReadTimeout bounds how long a client may take to send a request
	// body (default 60 s), so that a slow upload cannot hold a connection
	// and its buffer forever. It ends once the body is in: a streamed
	// answer runs as long as it needs.
	BodyReadTimeout time.Duration
	// Logger receives what clients are not told (why a generation
	// failed); nil discards it.
	Logger *slog.Logger
	// MaxPromptTokens, when set, is the longest prompt the generator admits
	// now (0: unknown). A text that cannot fit it in any tokenization is
	// refused before it is tokenized.
	MaxPromptTokens func() int
	// MaxModelLen, when set, is the longest sequence (prompt and
	// completion) served now; /v1/models and /tokenize report it.
	MaxModelLen func() int
	// PrefixCacheScope says what a tenant of the prefix cache is (see
	// prefixcache.TenantSalt); every request carries its tenant's salt.
	PrefixCacheScope prefixcache.Scope
	// ToolCallParser reads tool calls out of chat answers (a name of
	// toolcall.Formats); empty refuses requests that let the model call
	// tools.
	ToolCallParser string
	// ReasoningParser splits <think> blocks into reasoning_content (a name
	// of reasoning.Formats); empty leaves them in the content.
	ReasoningParser string
	// AllowSpecialTokensInPrompt parses control tokens written in a
	// completions prompt (and a /tokenize prompt) as those tokens, as
	// llama.cpp's server does; by default a prompt's "</s>" is text. Chat
	// messages are text either way.
	AllowSpecialTokensInPrompt bool
	// CORS, when set, answers browsers' preflights and names allowed
	// origins in every answer; nil sends no CORS headers.
	CORS *CORS
}

// SamplingDefaults are a model's default sampling parameters.
type SamplingDefaults struct {
	Temperature, TopP, MinP *float64
	TopK                    *int
	MaxTokens               *int
}

// maxBodyBytes bounds a request body; prompts far beyond any context length
// are refused without reading them whole.
const maxBodyBytes = 32 << 20

const defaultBodyReadTimeout = 60 * time.Second

// maxEchoLogprobsTokens bounds the prompt whose logprobs are echoed: on the
// PD path they travel in one gRPC message from prefill to decode and on to
// the router, and at 5 alternatives a token this keeps it well under the
// 4 MiB a gRPC peer accepts by default.
const maxEchoLogprobsTokens = 32768

// Server serves the OpenAI API.
type Server struct {
	o     Options
	log   *slog.Logger
	mux   *http.ServeMux
	ready atomic.Bool
	// draining is set by Drain: /health says so and new generations are
	// refused while those already running finish.
	draining atomic.Bool
	// stateMu orders the writes of ready and draining, so that a late
	// SetReady(true) cannot follow a Drain.
	stateMu sync.Mutex
	created int64
	// maxTokenBytes is the most bytes of text one token can stand for (see
	// tokenizer.MaxTokenBytes); 0 when no such bound holds.
	maxTokenBytes int
}

// New makes a server; it answers /health with 503 until SetReady(true).
func New(o Options) *Server {
	if o.BodyReadTimeout <= 0 {
		o.BodyReadTimeout = defaultBodyReadTimeout
	}
	s := &Server{o: o, log: o.Logger, mux: http.NewServeMux(), created: time.Now().Unix()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if o.Tokenizer != nil {
		s.maxTokenBytes = o.Tokenizer.MaxTokenBytes()
	}
	s.mux.HandleFunc("POST /v1/completions", s.auth(s.completions))
	s.mux.HandleFunc("POST /v1/chat/completions", s.auth(s.chatCompletions))
	s.mux.HandleFunc("POST /v1/responses", s.auth(s.responses))
	s.mux.HandleFunc("GET /v1/models", s.auth(s.models))
	s.mux.HandleFunc("GET /v1/models/{id}", s.auth(s.model))
	s.mux.HandleFunc("POST /tokenize", s.auth(s.tokenize))
	s.mux.HandleFunc("POST /detokenize", s.auth(s.detokenize))
	s.mux.HandleFunc("GET /health", s.health)
	s.mux.HandleFunc("GET /server_info", s.auth(s.serverInfo))
	if o.Metrics != nil {
		var h http.Handler = o.Metrics.Handler()
		if o.MetricsRequireKey {
			h = httpauth.Require(o.APIKey, h)
		}
		s.mux.Handle("GET /metrics", h)
	}
	s.mux.HandleFunc("/", openai.NoRoute(s.mux))
	return s
}

// SetReady switches /health between 200 and 503. Once Drain ran it keeps
// 503: a readiness report racing the drain (the router's ticker) must not
// take /health back to 200 while new work is refused.
func (s *Server) SetReady(ok bool) {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.ready.Store(ok && !s.draining.Load())
}

// Drain starts a shutdown: /health answers 503 so that load balancers
// stop sending, and new generations are refused with 503 while the port
// stays open for those already running. Refusal comes first, so that
// whoever sees the 503 finds new work refused too; a request sent on the
// last 200 may still be refused, which a balancer retries.
func (s *Server) Drain() {
	s.stateMu.Lock()
	defer s.stateMu.Unlock()
	s.draining.Store(true)
	s.ready.Store(false)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.o.CORS != nil && s.o.CORS.handle(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// auth checks the key before anything of the body is read.
func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	return httpauth.Require(s.o.APIKey, h).ServeHTTP
}

func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	if !s.ready.Load() {
		status := "starting"
		if s.draining.Load() {
			status = "draining"
		}
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": status})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) serverInfo(w http.ResponseWriter, _ *http.Request) {
	info := map[string]any{}
	for k, v := range s.o.Info {
		info[k] = v
	}
	if s.o.LiveInfo != nil {
		for k, v := range s.o.LiveInfo() {
			info[k] = v
		}
	}
	writeJSON(w, http.StatusOK, info)
}

func (s *Server) modelObject() openai.Model {
	return openai.Model{ID: s.o.ModelName, Created: s.created, OwnedBy: "baton", MaxModelLen: s.maxModelLen()}
}

func (s *Server) maxModelLen() int {
	if s.o.MaxModelLen == nil {
		return 0
	}
	return s.o.MaxModelLen()
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openai.ModelList{Data: []openai.Model{s.modelObject()}})
}

func (s *Server) model(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") != s.o.ModelName {
		openai.WriteError(w, s.unknownModel(r.PathValue("id")))
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}

func (s *Server) unknownModel(name string) *openai.Error {
	return openai.NotFound("the model `"+openai.Cut(name)+"` does not exist; this server serves `"+s.o.ModelName+"`", "model_not_found")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// readBody reads a request body of at most maxBodyBytes within the body
// read timeout. A body declared too large is refused before a byte of it
// is read; one that turns out too large stops being read at the limit.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *openai.Error) {
	tooLarge := func() *openai.Error {
		// The rest of the body is not wanted: close rather than drain it.
		w.Header().Set("Connection", "close")
		return openai.PayloadTooLarge(fmt.Sprintf("the request body exceeds the limit of %d MiB", maxBodyBytes>>20))
	}
	if r.ContentLength > maxBodyBytes {
		return nil, tooLarge()
	}
	rc := http.NewResponseController(w)
	// Per request rather than http.Server.ReadTimeout: that one stays on
	// the connection while the answer streams and would cut a long stream
	// off. Recorders in tests do not support deadlines; that is fine.
	if rc.SetReadDeadline(time.Now().Add(s.o.BodyReadTimeout)) == nil {
		defer func() { _ = rc.SetReadDeadline(time.Time{}) }()
	}
	b, err := readAll(http.MaxBytesReader(w, r.Body, maxBodyBytes), r.ContentLength)
	if err != nil {
		var tooBig *http.MaxBytesError
		var ne net.Error
		switch {
		case errors.As(err, &tooBig):
			return nil, tooLarge()
		case errors.As(err, &ne) && ne.Timeout():
			w.Header().Set("Connection", "close")
			return nil, openai.RequestTimeout(fmt.Sprintf("the request body did not arrive within %s", s.o.BodyReadTimeout))
		}
		w.Header().Set("Connection", "close")
		return nil, openai.BadRequest("could not read the request body", "")
	}
	return b, nil
}

// firstBodyAlloc bounds readAll's first buffer (see there).
const firstBodyAlloc = 1 << 20

// readAll reads a body whose declared length (at most maxBodyBytes,
// checked before) sizes the buffer: io.ReadAll's doubling would allocate
// twice a large body's size on its way. The first allocation is at most
// firstBodyAlloc, since a header costs a client nothing: a declared 32 MiB
// that never arrives must not hold 32 MiB; a body that does arrive grows
// the buffer to its declared size.
func readAll(r io.Reader, declared int64) ([]byte, error) {
	if declared <= 0 {
		return io.ReadAll(r)
	}
	b := make([]byte, 0, min(declared, firstBodyAlloc)+1)
	for {
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
		if len(b) == cap(b) {
			if int64(cap(b)) <= declared {
				// The body is arriving: room for all it declared.
				b = append(make([]byte, 0, declared+1), b...)
				continue
			}
			// Longer than declared, which net/http's server never hands
			// over (it stops at Content-Length); a reader that does is
			// read to its end all the same.
			rest, err := io.ReadAll(r)
			return append(b, rest...), err
		}
	}
}

// limits are what a request must fit now, for the request parsers.
func (s *Server) limits() openai.Limits {
	var l openai.Limits
	if s.o.MaxPromptTokens != nil {
		l.MaxPromptTokens = s.o.MaxPromptTokens()
	}
	return l
}

// refused counts a request the parser refused for its length as the
// engine counts those it refuses, so that the rejections show either way.
func (s *Server) refused(e *openai.Error) {
	if s.o.Metrics != nil && e.Code != nil && *e.Code == openai.CodeContextLength {
		s.o.Metrics.Reject("too_long")
		s.o.Metrics.Outcome("rejected")
	}
}

// parseRequest reads a request body with parse and checks that it names
// the served model; on failure it has written the error and returns false.
func parseRequest[T any](s *Server, w http.ResponseWriter, r *http.Request, parse func([]byte, openai.Limits) (T, *openai.Error), model func(T) string) (T, bool) {
	fail := func(e *openai.Error) (T, bool) {
		openai.WriteError(w, e)
		var zero T
		return zero, false
	}
	body, e := s.readBody(w, r)
	if e != nil {
		return fail(e)
	}
	req, e := parse(body, s.limits())
	if e != nil {
		s.refused(e)
		return fail(e)
	}
	// A request that names no model gets the one served, as vLLM,
	// SGLang and llama.cpp answer it.
	if m := model(req); m != "" && m != s.o.ModelName {
		return fail(s.unknownModel(m))
	}
	return req, true
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	req, ok := parseRequest(s, w, r, openai.ParseCompletionRequestLimited, func(c *openai.CompletionRequest) string { return c.Model })
	if !ok {
		return
	}
	if req.Sampling.MaxTokens == 0 && s.o.Defaults.MaxTokens == nil {
		req.Sampling.MaxTokens = openai.DefaultCompletionMaxTokens
	}
	if e := s.checkSampling(req.Sampling); e != nil {
		openai.WriteError(w, e)
		return
	}
	g := &generation{s: s, chat: false, stream: req.Stream, includeUsage: req.IncludeUsage, sampling: req.Sampling,
		id: openai.NewID("cmpl-"), promptParam: "prompt", tenant: s.Tenant(r, req.Sampling.CacheSalt)}
	if e := s.completionPrompts(g, req); e != nil {
		openai.WriteError(w, e)
		return
	}
	g.run(w, r, nil)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	req, ok := parseRequest(s, w, r, openai.ParseChatRequestLimited, func(c *openai.ChatRequest) string { return c.Model })
	if !ok {
		return
	}
	if e := s.checkSampling(req.Sampling); e != nil {
		openai.WriteError(w, e)
		return
	}
	plan, e := s.planChat(req)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	text, e := s.renderChatWith(req, plan.vars)
	if e != nil {
		openai.WriteError(w, e)
		return
	}
	prompt := s.encodeChat(text)
	g := &generation{s: s, chat: true, stream: req.Stream, includeUsage: req.IncludeUsage, sampling: req.Sampling,
		id: openai.NewID("chatcmpl-"), promptParam: "messages", plan: plan, tenant: s.Tenant(r, req.Sampling.CacheSalt)}
	g.run(w, r, prompt)
}

// Tenant is the prefix cache salt of a request: its bearer token (hashed;
// with --api-key all callers hold the same one, behind a gateway each
// caller's own) and its cache_salt field, under the configured scope.
func (s *Server) Tenant(r *http.Request, cacheSalt string) prefixcache.Salt {
	key := ""
	if vals := r.Header.Values("Authorization"); len(vals) == 1 {
		key, _ = httpauth.Bearer(vals[0])
	}
	scope := s.o.PrefixCacheScope
	if scope == "" {
		scope = prefixcache.ScopeKey
	}
	return prefixcache.TenantSalt(scope, key, cacheSalt)
}

// checkSampling checks what the parser could not: token ids against the
// vocabulary and min_tokens against the model's default max_tokens, which
// only the server knows.
func (s *Server) checkSampling(sp openai.Sampling) *openai.Error {
	if sp.MaxTokens == 0 && s.o.Defaults.MaxTokens != nil {
		sp.MaxTokens = *s.o.Defaults.MaxTokens
	}
	if e := sp.CheckMinTokens(); e != nil {
		return e
	}
	vocab := s.o.Tokenizer.VocabSize()
	for id := range sp.LogitBias {
		if int(id) >= vocab {
			return openai.BadRequest(fmt.Sprintf("logit_bias names token %d, outside the vocabulary (0..%d)", id, vocab-1), "logit_bias")
		}
	}
	return nil
}

// cannotFit refuses a text whose length alone proves it longer than the
// longest prompt admitted now: however it is tokenized, n bytes become at
// least ceil(n/L) tokens, L being the most bytes one token stands for.
// Tokenizing a text of many megabytes takes seconds and gigabytes only to
// learn what its length already says.
func (s *Server) cannotFit(text, param string) *openai.Error {
	if s.maxTokenBytes <= 0 || s.o.MaxPromptTokens == nil {
		return nil
	}
	limit := s.o.MaxPromptTokens()
	if limit <= 0 {
		return nil
	}
	n := tokenizer.UnescapedLen(text)
	least := (n + s.maxTokenBytes - 1) / s.maxTokenBytes
	if least <= limit {
		return nil
	}
	if s.o.Metrics != nil {
		s.o.Metrics.Reject("too_long")
		s.o.Metrics.Outcome("rejected")
	}
	return openai.PromptTooLong(fmt.Sprintf("this model's maximum context length is %d tokens; the prompt is %d bytes long, which is at least %d tokens",
		limit+1, n, least), param)
}
