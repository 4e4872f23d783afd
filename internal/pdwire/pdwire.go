// Package pdparams carries a request's sampling parameters across the
// prefill/decode control plane: the router writes them, the workers read
// them, with one conversion each way so a field cannot travel one path
// and be dropped on another.
package pdwire

import (
	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

// ToPB converts sampling parameters for the wire.
func ToPB(p request.Params) *pdv1.SamplingParams {
	return &pdv1.SamplingParams{
		Temperature: p.Sampling.Temperature, TopP: p.Sampling.TopP, TopK: int32(p.Sampling.TopK), MinP: p.Sampling.MinP,
		TopLogprobs: int32(p.Sampling.TopLogprobs), MaxTokens: uint32(max(0, p.MaxTokens)), Seed: p.Seed,
		StopTokenIds: p.StopTokenIDs, IgnoreEos: p.IgnoreEOS, LogitBias: p.Sampling.LogitBias,
		PresencePenalty: p.Sampling.PresencePenalty, FrequencyPenalty: p.Sampling.FrequencyPenalty,
		RepetitionPenalty: p.Sampling.RepetitionPenalty, MinTokens: uint32(max(0, p.MinTokens)),
		PromptLogprobs: p.PromptLogprobs, ConstraintKind: p.Constraint.Kind, ConstraintSpec: p.Constraint.Spec,
		Continued: uint32(max(0, p.Continued)),
		Tenant:    p.Tenant[:],
	}
}

// FromPB converts wire sampling parameters.
func FromPB(s *pdv1.SamplingParams) request.Params {
	if s == nil {
		return request.Params{}
	}
	p := request.Params{
		Sampling: request.Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: int(s.TopK), MinP: s.MinP, TopLogprobs: int(s.TopLogprobs),
			LogitBias: s.LogitBias, PresencePenalty: s.PresencePenalty, FrequencyPenalty: s.FrequencyPenalty, RepetitionPenalty: s.RepetitionPenalty},
		MaxTokens: int(s.MaxTokens), StopTokenIDs: s.StopTokenIds, IgnoreEOS: s.IgnoreEos, MinTokens: int(s.MinTokens),
		PromptLogprobs: s.PromptLogprobs, Constraint: request.Constraint{Kind: s.ConstraintKind, Spec: s.ConstraintSpec}, Continued: int(s.Continued),
	}
	if s.Seed != nil {
		seed := *s.Seed
		p.Seed = &seed
	}
	// A salt of another length (a peer of another version) is hashed into
	// a tenant of its own rather than read as the zero tenant, whose
	// pages belong to requests that carried no key.
	if len(s.Tenant) == len(p.Tenant) {
		copy(p.Tenant[:], s.Tenant)
	} else if len(s.Tenant) > 0 {
		p.Tenant = prefixcache.TenantSalt(prefixcache.ScopeKey, string(s.Tenant), "\x00wire")
	}
	return p
}

// TokenToPB converts a sampled token for the wire.
func TokenToPB(t *request.Sampled) *pdv1.Token {
	if t == nil {
		return nil
	}
	out := &pdv1.Token{Id: t.ID, Logprob: t.Logprob}
	for _, a := range t.Top {
		out.Top = append(out.Top, &pdv1.TokenLogprob{Id: a.ID, Logprob: a.Logprob})
	}
	return out
}

// TokensToPB converts sampled tokens (a prompt's logprobs) for the wire.
func TokensToPB(ts []request.Sampled) []*pdv1.Token {
	if ts == nil {
		return nil
	}
	out := make([]*pdv1.Token, len(ts))
	for i := range ts {
		out[i] = TokenToPB(&ts[i])
	}
	return out
}

// TokensFromPB converts wire tokens, at most limit of them: a peer's list
// is bounded by what the request could have produced.
func TokensFromPB(ts []*pdv1.Token, limit int) []request.Sampled {
	if len(ts) == 0 {
		return nil
	}
	ts = ts[:min(len(ts), max(0, limit))]
	out := make([]request.Sampled, len(ts))
	for i, t := range ts {
		out[i] = TokenFromPB(t)
	}
	return out
}

// TokenFromPB converts a wire token.
func TokenFromPB(t *pdv1.Token) request.Sampled {
	out := request.Sampled{TokenLogprob: request.TokenLogprob{ID: t.GetId(), Logprob: t.GetLogprob()}}
	if top := t.GetTop(); len(top) > 0 {
		out.Top = make([]request.TokenLogprob, len(top))
		for i, a := range top {
			out.Top[i] = request.TokenLogprob{ID: a.GetId(), Logprob: a.GetLogprob()}
		}
	}
	return out
}
