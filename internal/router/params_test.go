package router

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/roles"
	"github.com/batonlm/baton/internal/scheduler"
)

// The router writes the same wire params as the workers read: a sampling
// field the router dropped would be ignored on the PD path only.
func TestSamplingParamsMatchWorkers(t *testing.T) {
	seed := uint64(9)
	p := scheduler.Params{
		Sampling: model.Sampling{Temperature: 0.5, TopP: 0.9, TopK: 4, MinP: 0.1, TopLogprobs: 3,
			LogitBias: map[int32]float64{5: -100}, PresencePenalty: 0.5, FrequencyPenalty: -1, RepetitionPenalty: 1.2},
		MaxTokens: 12, Seed: &seed, StopTokenIDs: []int32{2}, IgnoreEOS: true, MinTokens: 4, PromptLogprobs: true,
	}
	if got, want := samplingParams(p), roles.ParamsToPB(p); !proto.Equal(got, want) {
		t.Fatalf("router sends %v, workers expect %v", got, want)
	}
}
