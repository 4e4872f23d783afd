package gates

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

func runCheck(t *testing.T, c *harness.Cluster, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command(faultsBinary(t), append([]string{"check", "--router", c.Router.URL}, args...)...).CombinedOutput()
	return string(out), err
}

// baton check passes all four gates and the internal plane row (loopback) on
// a sound deployment, needs the API key when one is set, and leaves every page
// where it found it.
func TestCheckCommandPasses(t *testing.T) {
	// Workers keep /server_info behind the same key; check sends it to them.
	c := startCluster(t, setup{routerArgs: []string{"--api-key", "k3y"}, workerArgs: []string{"--api-key", "k3y"}})
	if out, err := runCheck(t, c); err == nil {
		t.Fatalf("check without the API key succeeded:\n%s", out)
	}
	out, err := runCheck(t, c, "--api-key", "k3y")
	if err != nil {
		t.Fatalf("check failed on a sound deployment: %v\n%s", err, out)
	}
	for _, gate := range []string{"pool/context", "reject/admission", "transfer/read", "lifetime/ownership", "prefix cache/tenants", "internal plane"} {
		if !regexp.MustCompile(regexp.QuoteMeta(gate)+`\s+PASS`).MatchString(out) || strings.Count(out, "PASS") != 6 {
			t.Fatalf("missing %s PASS row:\n%s", gate, out)
		}
	}
	if !regexp.MustCompile(`the same tenant again: HTTP 200, cached_tokens [1-9]`).MatchString(out) {
		t.Fatalf("the prefix cache row shows no hit on the repeat:\n%s", out)
	}
	if !strings.Contains(out, `internal_auth "none (loopback only)"`) {
		t.Fatalf("the internal plane row does not say the loopback cluster is unauthenticated:\n%s", out)
	}
	var v violations
	checkClean(t, c, &v)
	requireClean(t, v)
}

// A deployment whose writer corrupts bytes fails the transfer/read gate and
// the command exits non-zero.
func TestCheckCommandFailsOnCorruptHandoff(t *testing.T) {
	c := startCluster(t, setup{prefillFaults: "corrupt=1"})
	out, err := runCheck(t, c)
	if err == nil || !regexp.MustCompile(`transfer/read\s+FAIL`).MatchString(out) {
		t.Fatalf("check did not fail the transfer/read gate: %v\n%s", err, out)
	}
}

// Workers started with --insecure-internal fail the internal plane row, each
// named by its URL, even on loopback: the flag is what would open them on any
// address.
func TestCheckCommandFailsOnInsecurePlane(t *testing.T) {
	c := startCluster(t, setup{workerArgs: []string{"--insecure-internal"}})
	out, err := runCheck(t, c)
	if err == nil || !regexp.MustCompile(`internal plane\s+FAIL`).MatchString(out) || strings.Count(out, "PASS") != 5 {
		t.Fatalf("check did not fail the internal plane row alone: %v\n%s", err, out)
	}
	for _, w := range c.Workers() {
		if !regexp.MustCompile(regexp.QuoteMeta(w.URL) + `: internal_auth "none \(--insecure-internal.*UNAUTHENTICATED`).MatchString(out) {
			t.Fatalf("no evidence naming %s:\n%s", w.URL, out)
		}
	}
}
