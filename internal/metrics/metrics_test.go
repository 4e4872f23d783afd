package metrics

import (
	"io"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

func scrape(t *testing.T, s *Set) string {
	t.Helper()
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(rec.Body)
	return string(b)
}

// Each role exports what means something on it, labelled counters start
// at 0 for their known labels, and the pool's size has a gauge's name.
func TestRoleMetrics(t *testing.T) {
	for _, c := range []struct {
		role    string
		has     []string
		hasNot  []string
		samples []string
	}{
		{"standalone", []string{"baton_kv_pages_capacity", "baton_token_usage"}, []string{"baton_kv_reservations_total", "baton_internal_auth_failures_total"},
			[]string{`baton_requests_rejected_total{reason="queue_full",role="standalone"} 0`, `baton_requests_total{outcome="finished",role="standalone"} 0`}},
		{"prefill", []string{"baton_kv_pages_capacity", "baton_token_usage", "baton_kv_transfer_sessions_total"}, nil,
			[]string{`baton_handoff_failures_total{reason="transfer",role="prefill"} 0`, `baton_internal_auth_failures_total{role="prefill",rpc="Prefill"} 0`}},
		{"decode", []string{"baton_kv_pages_capacity", "baton_token_usage", "baton_kv_reservations_total"}, nil,
			[]string{`baton_handoff_failures_total{reason="checksum",role="decode"} 0`, `baton_late_messages_dropped_total{kind="write",role="decode"} 0`,
				`baton_internal_auth_failures_total{role="decode",rpc="Reserve"} 0`, `baton_requests_rejected_total{reason="no_space",role="decode"} 0`}},
		// The router queues requests that wait for room on decode.
		{"router", []string{"baton_requests_total", "baton_time_to_first_token_seconds", "baton_internal_auth_failures_total", "baton_num_queue_reqs", "baton_requests_queued_total"},
			[]string{"baton_kv_pages_total", "baton_kv_pages_capacity", "baton_kv_pages_free", "baton_token_usage", "baton_kv_release_errors"},
			[]string{`baton_requests_rejected_total{reason="no_workers",role="router"} 0`, `baton_requests_rejected_total{reason="decode_full",role="router"} 0`,
				`baton_requests_rejected_total{reason="queue_full",role="router"} 0`, `baton_requests_rejected_total{reason="queue_timeout",role="router"} 0`}},
	} {
		text := scrape(t, New(c.role))
		for _, n := range c.has {
			if !strings.Contains(text, "\n"+n) {
				t.Errorf("%s: no %s", c.role, n)
			}
		}
		for _, n := range c.hasNot {
			if regexp.MustCompile(`(?m)^` + n + `\b`).MatchString(text) {
				t.Errorf("%s exports %s, which means nothing on it", c.role, n)
			}
		}
		for _, smp := range c.samples {
			if !strings.Contains(text, smp+"\n") {
				t.Errorf("%s: no sample %s", c.role, smp)
			}
		}
		// The pool's size under its old name, a gauge with a counter's
		// suffix that promtool refuses, is gone.
		if strings.Contains(text, "baton_kv_pages_total") {
			t.Errorf("%s still exports baton_kv_pages_total (removed: baton_kv_pages_capacity replaces it)", c.role)
		}
	}
}

// The names follow Prometheus's conventions (what promtool check metrics
// asks): counters end in _total, nothing else does, every metric has a
// HELP.
func TestMetricNamesLint(t *testing.T) {
	for _, role := range []string{"standalone", "prefill", "decode", "router"} {
		mfs, err := New(role).Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			name := mf.GetName()
			if !strings.HasPrefix(name, "baton_") {
				continue
			}
			counter := mf.GetType() == dto.MetricType_COUNTER
			switch {
			case mf.GetHelp() == "":
				t.Errorf("%s: %s has no HELP", role, name)
			case counter && !strings.HasSuffix(name, "_total"):
				t.Errorf("%s: counter %s does not end in _total", role, name)
			case !counter && strings.HasSuffix(name, "_total"):
				t.Errorf("%s: %s %s ends in _total, which is for counters", role, mf.GetType(), name)
			}
		}
	}
}

// A role serving a model labels every baton_ series with model_name, as
// SGLang does; the Go runtime's series are the process's, not the model's.
func TestModelNameLabel(t *testing.T) {
	for _, role := range []string{"standalone", "prefill", "decode", "router"} {
		s := ForModel(role, "tiny-llama")
		s.Outcome("rejected")
		text := scrape(t, s)
		n := 0
		for _, line := range strings.Split(text, "\n") {
			switch {
			case strings.HasPrefix(line, "baton_"):
				n++
				if !strings.Contains(line, `model_name="tiny-llama"`) {
					t.Errorf("%s: %s has no model_name", role, line)
				}
			case strings.HasPrefix(line, "go_") && strings.Contains(line, "model_name"):
				t.Errorf("%s: %s", role, line)
			}
		}
		if n == 0 {
			t.Fatalf("%s: no baton_ series", role)
		}
	}
}
