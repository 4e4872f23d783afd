package e2e

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// scrapeRoles starts every role (standalone, and a router with a prefill
// and a decode worker) and returns each one's /metrics as served.
func scrapeRoles(t *testing.T) map[string]string {
	t.Helper()
	s := startServer(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1})
	out := map[string]string{}
	for role, srv := range map[string]*server{"standalone": s, "router": c.Router, "prefill": c.Prefill[0], "decode": c.Decode[0]} {
		code, body := get(t, srv.URL+"/metrics")
		if code != 200 {
			t.Fatalf("%s /metrics: %d", role, code)
		}
		out[role] = string(body)
	}
	return out
}

// promtoolAllowed is what promtool may say: baton_kv_pages_total is a gauge
// under a counter's suffix, kept one release next to
// baton_kv_pages_capacity for dashboards that still ask for it.
var promtoolAllowed = []string{`baton_kv_pages_total non-counter metrics should not have "_total" suffix`}

// Every role's /metrics passes `promtool check metrics` (Debian's
// prometheus package), the linter Prometheus users run on exporters.
func TestMetricsEveryRole(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: `apt-get install prometheus` (Debian) provides it; .ci/run installs it")
	}
	for role, text := range scrapeRoles(t) {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		runErr := cmd.Run()
		var problems []string
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			line = strings.TrimSpace(line)
			allowed := line == ""
			for _, a := range promtoolAllowed {
				allowed = allowed || line == a
			}
			if !allowed {
				problems = append(problems, line)
			}
		}
		if len(problems) > 0 {
			t.Errorf("%s: promtool check metrics (%v):\n%s", role, runErr, strings.Join(problems, "\n"))
		}
		if runErr != nil {
			if _, ok := runErr.(*exec.ExitError); !ok {
				t.Fatalf("promtool: %v", runErr)
			}
		}
		if role == "router" && strings.Contains(text, "\nbaton_kv_pages") {
			t.Errorf("the router exports KV pool gauges, though it holds no pool")
		}
	}
}
