// Package request is the vocabulary of a generation request that every
// layer speaks: how it is sampled and bounded (Params), what its reader
// receives (Event, the finish reasons, SpecCounts), and how it is refused
// at a door (RejectError). It sits below the router, the engine and the
// model alike, so that the router, which runs no engine and holds no pool,
// depends on neither.
package request

// Sampling says how the next token is chosen.
type Sampling struct {
	Temperature float64 // 0 means greedy
	TopP        float64 // 1 or 0: off
	TopK        int     // 0: off
	MinP        float64 // 0: off
	TopLogprobs int     // how many alternatives to report
	// LogitBias is added to its tokens' logits before the choice.
	LogitBias map[int32]float64
	// PresencePenalty and FrequencyPenalty (OpenAI) weigh the generated
	// tokens; RepetitionPenalty (vLLM) the prompt's and the generated ones,
	// 0 or 1 being off.
	PresencePenalty, FrequencyPenalty, RepetitionPenalty float64
}

// SamplingEps is the smallest temperature that samples (vLLM's
// _SAMPLING_EPS); below it a request is greedy. Dividing logits by a
// temperature near zero overflows them: at 1e-320 every probability came
// out NaN and every token <unk>.
const SamplingEps = 1e-5

// Draws reports whether sampling a token under p takes a random draw (one
// Float64): greedy choices take none. A request that moves from one engine
// to another mid-stream uses it to carry on the same random stream.
func (p Sampling) Draws() bool { return p.Temperature >= SamplingEps && p.TopK != 1 }

// TokenLogprob is one candidate and its log-probability under the model's
// raw distribution (before temperature and truncation, as llama.cpp reports).
type TokenLogprob struct {
	ID      int32
	Logprob float32
}

// Sampled is the chosen token with its logprob and the top alternatives.
type Sampled struct {
	TokenLogprob
	Top []TokenLogprob
}

// Constraint restricts what a request may generate to a language: Kind is
// "json_object", "json_schema", "regex" or "ebnf" and Spec the schema,
// expression or grammar. The zero value constrains nothing.
type Constraint struct {
	Kind, Spec string
}

// Salt keeps one tenant's prefix-cache pages from another's: a request
// reads cached pages only of requests with the same salt.
type Salt [16]byte

// CacheKey names a shared page's content: the chained hash of the salt,
// the model and layout, and the exact tokens up to the end of the page.
type CacheKey struct{ Hi, Lo uint64 }

// Params says how a request is generated.
type Params struct {
	Sampling     Sampling
	MaxTokens    int     // 0: up to the context length
	Seed         *uint64 // same seed, same output
	StopTokenIDs []int32
	IgnoreEOS    bool
	// MinTokens holds off the end of generation: until that many tokens
	// are out, EOS and StopTokenIDs cannot be sampled (vLLM's min_tokens).
	MinTokens int
	// PromptLogprobs asks for the logprob of every prompt token after the
	// first (completions' echo with logprobs), with Sampling.TopLogprobs
	// alternatives each.
	PromptLogprobs bool
	// Constraint, when set, restricts the output to a language (structured
	// output).
	Constraint Constraint
	// Tenant is the request's prefix cache salt: it reads cached pages
	// only of requests with the same one.
	Tenant Salt
	// Continued counts the prompt's last tokens that are the request's own
	// output from before it moved to this pair (a continuation after its
	// decode worker failed it): the penalties weigh them as generated, and
	// a constraint's state starts past them.
	Continued int
}

// Output is the request's own output at the end of prompt (Continued of
// its tokens, at most all of them).
func (p Params) Output(prompt []int32) []int32 {
	return prompt[len(prompt)-min(max(p.Continued, 0), len(prompt)):]
}

// Finish reasons, as the OpenAI API names them, and baton's own.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
	FinishError  = "error"
)

// Event is what a request's reader receives: one generated token, and on
// the last event a finish reason (and for FinishError, the error).
type Event struct {
	Token  *Sampled
	Finish string
	Err    error
	// Prompt comes with the first token when Params.PromptLogprobs asked
	// for it: the logprobs of prompt tokens 1..n-1 (token 0 has none).
	Prompt []Sampled
	// CachedTokens comes with the first token: how many prompt tokens were
	// read from the prefix cache instead of computed.
	CachedTokens int
	// Spec comes with the last event of a request that speculated: its
	// draft tokens, accepted tokens and verifying steps.
	Spec *SpecCounts
}

// FinishSpecAnomaly ends a generation whose speculation figures left the
// decode worker's guard bounds: its KV is suspect, so it stops at once and
// nothing it would emit after the trip is sent. The router retries it
// elsewhere; a standalone client gets an error.
const FinishSpecAnomaly = "spec_anomaly"

// FinishDrain ends, on decode's token stream only, a request a draining
// decode worker handed back (its last event, code 503): the router goes on
// on another pair from the tokens the client has. No client sees it.
const FinishDrain = "drain"

// SpecCounts are one request's speculation figures: the draft tokens it
// verified, how many of them the target accepted, and its verifying
// steps (each emits the accepted drafts plus one token of the target's).
type SpecCounts struct {
	Drafted, Accepted, Steps int
}

// Add sums two attempts' figures (a request retried on another worker).
func (c SpecCounts) Add(o SpecCounts) SpecCounts {
	return SpecCounts{Drafted: c.Drafted + o.Drafted, Accepted: c.Accepted + o.Accepted, Steps: c.Steps + o.Steps}
}

// AcceptLength is tokens per verifying step (SGLang's accept length);
// 0 with no step.
func (c SpecCounts) AcceptLength() float64 {
	if c.Steps == 0 {
		return 0
	}
	return float64(c.Accepted+c.Steps) / float64(c.Steps)
}

// AcceptRate is the share of draft tokens accepted; 0 with none drafted.
func (c SpecCounts) AcceptRate() float64 {
	if c.Drafted == 0 {
		return 0
	}
	return float64(c.Accepted) / float64(c.Drafted)
}

// RejectError is a refusal at the door: the request allocated nothing.
type RejectError struct {
	Status     int    // 400 for a request that can never run, 429 when full, 503 when unavailable
	Reason     string // metric label
	Message    string
	RetryAfter int // seconds, for 429 and 503
}

func (e *RejectError) Error() string { return e.Message }
