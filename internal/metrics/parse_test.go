package metrics

import "testing"

func TestParseText(t *testing.T) {
	text := `# HELP baton_requests_total Requests by outcome.
baton_requests_total{outcome="finished",role="decode"} 3
baton_requests_total{outcome="aborted",role="decode"} 2
baton_kv_pages_free{role="decode"} 4096
baton_drain_wait_seconds_count{role="decode"} 1e+00
go_goroutines 12
`
	m := ParseText(text)
	for k, want := range map[string]float64{
		"baton_requests_total": 5, `baton_requests_total{outcome="aborted",role="decode"}`: 2,
		"baton_kv_pages_free": 4096, "baton_drain_wait_seconds_count": 1,
	} {
		if m[k] != want {
			t.Errorf("%s = %v, want %v", k, m[k], want)
		}
	}
	if _, ok := m["go_goroutines"]; ok {
		t.Error("non-baton metric parsed")
	}
}
