// Package pdparams carries a request's sampling parameters across the
// prefill/decode control plane: the router writes them, the workers read
// them, with one conversion each way so a field cannot travel one path
// and be dropped on another.
package pdparams

import (
	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
)

// ToPB converts sampling parameters for the wire.
func ToPB(p scheduler.Params) *pdv1.SamplingParams {
	return &pdv1.SamplingParams{
		Temperature: p.Sampling.Temperature, TopP: p.Sampling.TopP, TopK: int32(p.Sampling.TopK), MinP: p.Sampling.MinP,
		TopLogprobs: int32(p.Sampling.TopLogprobs), MaxTokens: uint32(max(0, p.MaxTokens)), Seed: p.Seed,
		StopTokenIds: p.StopTokenIDs, IgnoreEos: p.IgnoreEOS, LogitBias: p.Sampling.LogitBias,
		PresencePenalty: p.Sampling.PresencePenalty, FrequencyPenalty: p.Sampling.FrequencyPenalty,
		RepetitionPenalty: p.Sampling.RepetitionPenalty, MinTokens: uint32(max(0, p.MinTokens)),
		PromptLogprobs: p.PromptLogprobs, ConstraintKind: p.Constraint.Kind, ConstraintSpec: p.Constraint.Spec,
		Tenant: p.Tenant[:],
	}
}

// FromPB converts wire sampling parameters.
func FromPB(s *pdv1.SamplingParams) scheduler.Params {
	if s == nil {
		return scheduler.Params{}
	}
	p := scheduler.Params{
		Sampling: model.Sampling{Temperature: s.Temperature, TopP: s.TopP, TopK: int(s.TopK), MinP: s.MinP, TopLogprobs: int(s.TopLogprobs),
			LogitBias: s.LogitBias, PresencePenalty: s.PresencePenalty, FrequencyPenalty: s.FrequencyPenalty, RepetitionPenalty: s.RepetitionPenalty},
		MaxTokens: int(s.MaxTokens), StopTokenIDs: s.StopTokenIds, IgnoreEOS: s.IgnoreEos, MinTokens: int(s.MinTokens),
		PromptLogprobs: s.PromptLogprobs, Constraint: scheduler.Constraint{Kind: s.ConstraintKind, Spec: s.ConstraintSpec},
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
