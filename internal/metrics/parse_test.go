package metrics

import "testing"

func TestParseText(t *testing.T) {
	text := `# HELP baton_requests_total Requests by outcome.
baton_requests_total{outcome="finished",role="decode"} 3
baton_requests_total{outcome="aborted",role="decode"} 2
baton_kv_pages_free{role="decode"} 4096
baton_drain_wait_seconds_count{role="decode"} 1e+00
baton_late_messages_dropped_total{kind="write",model_name="m",role="decode"} 7
baton_token_usage{model_name="m \"x\""} 0.5
go_goroutines 12
`
	m := ParseText(text)
	for k, want := range map[string]float64{
		"baton_requests_total": 5, `baton_requests_total{outcome="aborted",role="decode"}`: 2,
		"baton_kv_pages_free": 4096, "baton_drain_wait_seconds_count": 1,
		// model_name is left out of the keys: one value per process.
		`baton_late_messages_dropped_total{kind="write",role="decode"}`: 7, "baton_token_usage": 0.5,
	} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	if _, ok := m["baton_token_usage{}"]; ok {
		t.Error("an empty label set made a key")
	}
	if _, ok := m["go_goroutines"]; ok {
		t.Error("non-baton metric parsed")
	}
}
