package pdwire

import (
	"reflect"
	"testing"

	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

// FullParams sets every field of request.Params to a non-zero value; a
// field added to Params and not to the wire fails the round trip below.
func fullParams() request.Params {
	seed := uint64(9)
	return request.Params{
		Sampling: request.Sampling{Temperature: 0.5, TopP: 0.9, TopK: 4, MinP: 0.1, TopLogprobs: 3,
			LogitBias: map[int32]float64{5: -100, 7: 2}, PresencePenalty: 0.5, FrequencyPenalty: -1, RepetitionPenalty: 1.2},
		MaxTokens: 12, Seed: &seed, StopTokenIDs: []int32{2, 3}, IgnoreEOS: true, MinTokens: 4, PromptLogprobs: true,
		Constraint: request.Constraint{Kind: "regex", Spec: "a+"},
		Tenant:     prefixcache.TenantSalt(prefixcache.ScopeKey, "key", "salt"),
		Continued:  2,
	}
}

func TestParamsRoundTrip(t *testing.T) {
	p := fullParams()
	checkAllSet(t, reflect.ValueOf(p), "Params")
	if got := FromPB(ToPB(p)); !reflect.DeepEqual(got, p) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got, p)
	}
}

func checkAllSet(t *testing.T, v reflect.Value, at string) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		if !v.Type().Field(i).IsExported() {
			continue
		}
		if f.Kind() == reflect.Struct {
			checkAllSet(t, f, at+"."+v.Type().Field(i).Name)
			continue
		}
		if f.IsZero() {
			t.Errorf("%s.%s is not set in the test's params", at, v.Type().Field(i).Name)
		}
	}
}
