package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// roleServers starts every role (standalone, and a router with a prefill
// and a decode worker) and returns each one's base URL and /metrics as
// served.
func roleServers(t *testing.T) map[string]scraped {
	t.Helper()
	s := startServer(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1})
	out := map[string]scraped{}
	for role, srv := range map[string]*server{"standalone": s, "router": c.Router, "prefill": c.Prefill[0], "decode": c.Decode[0]} {
		code, body := get(t, srv.URL+"/metrics")
		if code != 200 {
			t.Fatalf("%s /metrics: %d", role, code)
		}
		out[role] = scraped{url: srv.URL, metrics: string(body)}
	}
	return out
}

type scraped struct{ url, metrics string }

var typeLine = regexp.MustCompile(`(?m)^# TYPE (baton_[a-z_]+) `)

// families are the baton_ metric names a /metrics page declares.
func families(text string) map[string]bool {
	out := map[string]bool{}
	for _, m := range typeLine.FindAllStringSubmatch(text, -1) {
		out[m[1]] = true
	}
	return out
}

// readmeSection is the README's text from the heading head to the next
// heading of the same level.
func readmeSection(t *testing.T, head string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n"+head+"\n")
	if i < 0 {
		t.Fatalf("README has no %q", head)
	}
	text = text[i+1:]
	if j := strings.Index(text[len(head):], "\n## "); j >= 0 {
		text = text[:len(head)+j]
	}
	return text
}

var (
	metricRow   = regexp.MustCompile("(?m)^\\| `(baton_[a-z_]+)(\\{[a-z_,]*\\})?` \\| ([^|]+) \\|")
	allRoles    = []string{"standalone", "prefill", "decode", "router"}
	infoLine    = regexp.MustCompile("(?m)^- ([a-z, ]+): (.*)$")
	parenthesis = regexp.MustCompile(`\([^()]*\)`)
	backticked  = regexp.MustCompile("`([a-z_]+)`")
)

// checkREADMEMetrics holds the README's Metrics table to what real
// processes serve: each metric it names exists on exactly the roles it
// says, and each metric a role serves is named.
func checkREADMEMetrics(t *testing.T, roles map[string]scraped) {
	rows := metricRow.FindAllStringSubmatch(readmeSection(t, "## Metrics"), -1)
	if len(rows) == 0 {
		t.Fatal("no metrics in the README's Metrics table")
	}
	named := map[string]bool{}
	for _, r := range rows {
		name, want := r[1], map[string]bool{}
		named[name] = true
		for _, role := range strings.Split(r[3], ",") {
			role = strings.TrimSpace(role)
			if role == "all" {
				for _, a := range allRoles {
					want[a] = true
				}
				continue
			}
			want[role] = true
		}
		for _, role := range allRoles {
			if has := families(roles[role].metrics)[name]; has != want[role] {
				t.Errorf("README: %s on %s is %v; /metrics there: %v", name, role, want[role], has)
			}
		}
	}
	for _, role := range allRoles {
		for name := range families(roles[role].metrics) {
			if !named[name] {
				t.Errorf("%s serves %s, which the README's Metrics table does not name", role, name)
			}
		}
	}
}

// checkREADMEServerInfo holds the README's list of /server_info fields by
// role to what each role answers.
func checkREADMEServerInfo(t *testing.T, roles map[string]scraped) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "`/server_info` answers")
	if i < 0 {
		t.Fatal("README does not list /server_info's fields")
	}
	text = text[i:]
	// The list runs from its first "- " line to the blank line after it.
	first := strings.Index(text, "\n- ")
	if end := strings.Index(text[first:], "\n\n"); first >= 0 && end >= 0 {
		text = text[:first+end]
	}
	seen := map[string]bool{}
	for _, m := range infoLine.FindAllStringSubmatch(text, -1) {
		want := map[string]bool{}
		for _, f := range backticked.FindAllStringSubmatch(parenthesis.ReplaceAllString(m[2], ""), -1) {
			want[f[1]] = true
		}
		for _, role := range strings.Split(m[1], ",") {
			role = strings.TrimSpace(role)
			seen[role] = true
			srv, ok := roles[role]
			if !ok {
				t.Fatalf("README lists /server_info for an unknown role %q", role)
			}
			code, body := get(t, srv.url+"/server_info")
			var got map[string]any
			if code != 200 || json.Unmarshal(body, &got) != nil {
				t.Fatalf("%s /server_info: %d %s", role, code, body)
			}
			for k := range got {
				if !want[k] {
					t.Errorf("%s /server_info has %q, which the README does not list", role, k)
				}
			}
			for k := range want {
				if _, ok := got[k]; !ok {
					t.Errorf("the README lists %q in %s's /server_info, which has no such field", k, role)
				}
			}
		}
	}
	for _, role := range allRoles {
		if !seen[role] {
			t.Errorf("the README does not list %s's /server_info fields", role)
		}
	}
}

// Every role's /metrics passes `promtool check metrics` (Debian's
// prometheus package), the linter Prometheus users run on exporters, and
// the README's Metrics table and /server_info fields say what real
// processes serve.
func TestMetricsEveryRole(t *testing.T) {
	roles := roleServers(t)
	t.Run("README metrics", func(t *testing.T) { checkREADMEMetrics(t, roles) })
	t.Run("README server_info", func(t *testing.T) { checkREADMEServerInfo(t, roles) })
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed: `apt-get install prometheus` (Debian) provides it; .ci/run installs it")
	}
	for role, sc := range roles {
		text := sc.metrics
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = strings.NewReader(text)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		runErr := cmd.Run()
		// promtool's word is final: nothing it says is allowed through.
		var problems []string
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			if line = strings.TrimSpace(line); line != "" {
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
		// SGLang's convention: every serving series names the model.
		for _, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "baton_") && !strings.Contains(line, `model_name="stories260K"`) {
				t.Errorf("%s: %s has no model_name label", role, line)
				break
			}
		}
		if role == "router" && strings.Contains(text, "\nbaton_kv_pages") {
			t.Errorf("the router exports KV pool gauges, though it holds no pool")
		}
	}
}
