package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// Short prompts skip the handoff: with the router's default threshold the
// reference prompt is computed on the decode worker itself (no
// reservation, nothing for prefill) and still gives the reference text,
// in batches; a prompt past the threshold is handed over as always; every
// page comes back on both workers.
func TestPDShortPromptsOnDecode(t *testing.T) {
	ref := loadReference(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1,
		RouterArgs: []string{"--disagg-prefill-threshold", "256"}})
	greedyConcurrently(t, c.Router.URL, ref, 4)
	c.WaitClean(t)
	rm, dm, pm := metricsOf(t, c.Router), metricsOf(t, c.Decode[0]), metricsOf(t, c.Prefill[0])
	if rm["baton_router_local_prefill_total"] != 4 || dm["baton_kv_reservations_total"] != 0 || pm["baton_prompt_tokens_total"] != 0 {
		t.Fatalf("short prompts: router local prefills %v (want 4), decode reservations %v (want 0), prefill prompt tokens %v (want 0)",
			rm["baton_router_local_prefill_total"], dm["baton_kv_reservations_total"], pm["baton_prompt_tokens_total"])
	}
	long := strings.Repeat("Once upon a time there was a cat. ", 40)
	code, _, body := post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":4,"temperature":0}`, long))
	if code != 200 {
		t.Fatalf("long prompt: status %d: %s", code, body)
	}
	c.WaitClean(t)
	rm, dm = metricsOf(t, c.Router), metricsOf(t, c.Decode[0])
	if rm["baton_router_local_prefill_total"] != 4 || dm["baton_kv_reservations_total"] != 1 {
		t.Fatalf("a prompt past the threshold: router local prefills %v (want 4), decode reservations %v (want 1)",
			rm["baton_router_local_prefill_total"], dm["baton_kv_reservations_total"])
	}
}
