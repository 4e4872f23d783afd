package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestHTTPSecurityFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--metrics-require-key"}, "needs --api-key"},
		{[]string{"--metrics-require-key", "--api-key", "k"}, ""},
		{[]string{"--role", "decode", "--metrics-require-key", "--api-key", "k"}, ""},
		{[]string{"--request-read-timeout", "0s"}, "must be positive"},
		{[]string{"--request-read-timeout", "5s"}, ""},
	} {
		dryRun(t, c.args, c.err, "")
	}
}

// --dry-run refuses what starting the internal plane would: a worker
// beyond loopback without credentials, half a TLS set, both modes, a
// secret file that is missing or too short. Standalone has no internal
// plane and ignores the flags.
func TestInternalPlaneFlags(t *testing.T) {
	dir := t.TempDir()
	short := dir + "/short"
	good := dir + "/good"
	if err := os.WriteFile(short, []byte("tiny"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, []byte(strings.Repeat("s3cret-", 8)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--role", "decode", "--host", "0.0.0.0"}, "--insecure-internal"},
		{[]string{"--role", "prefill", "--host", "10.1.2.3"}, "--cluster-secret-file"},
		{[]string{"--role", "decode", "--host", "0.0.0.0", "--insecure-internal"}, ""},
		{[]string{"--role", "decode", "--host", "127.0.0.1"}, ""},
		{[]string{"--role", "decode", "--host", "0.0.0.0", "--cluster-secret-file", good}, ""},
		{[]string{"--role", "decode", "--cluster-secret-file", short}, "secret"},
		{[]string{"--role", "decode", "--cluster-secret-file", dir + "/missing"}, "missing"},
		{[]string{"--role", "prefill", "--internal-tls-cert", good}, "--internal-tls-key"},
		{[]string{"--role", "router", "--prefill", "http://a:1", "--decode", "http://b:2", "--internal-tls-ca", good, "--cluster-secret-file", good}, "choose one"},
		{[]string{"--host", "0.0.0.0"}, ""},
	} {
		dryRun(t, c.args, c.err, "")
	}
}

// dryRun runs serve --dry-run with args; wantErr, when set, is part of the
// error it must fail with, else it must pass (printing wantOut if set).
func dryRun(t *testing.T, args []string, wantErr, wantOut string) {
	t.Helper()
	cmd := serveCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"--dry-run"}, args...))
	err := cmd.Execute()
	switch {
	case wantErr == "" && err != nil:
		t.Errorf("%v: %v", args, err)
	case wantErr != "" && (err == nil || !strings.Contains(err.Error(), wantErr)):
		t.Errorf("%v: error %v, want one saying %q", args, err, wantErr)
	case wantOut != "" && !strings.Contains(out.String(), wantOut):
		t.Errorf("%v: %q, want %q", args, out.String(), wantOut)
	}
}

// A flag that does nothing on a role is refused for it, from the command
// line or the environment; the worker roles take each other's flags.
func TestFlagsRefusedOnRolesTheyDoNothingOn(t *testing.T) {
	router := []string{"--role", "router", "--prefill", "http://a:1", "--decode", "http://b:2"}
	for _, c := range []struct {
		args []string
		err  string
	}{
		{append(router, "--max-running-requests", "1"), "--max-running-requests (standalone, prefill, decode only)"},
		{append(router, "--page-size", "4", "--kv-cache-memory", "1GiB"), "--page-size"},
		{append(router, "--max-queued-requests", "1", "--queue-timeout", "5s"), ""},
		{[]string{"--prefill", "http://a:1"}, "--prefill (router only)"},
		{[]string{"--queue-timeout", "5s"}, "--queue-timeout (router only)"},
		{[]string{"--transfer-port", "9000"}, "--transfer-port (decode only)"},
		{[]string{"--cluster-secret-file", "/nonexistent"}, "--cluster-secret-file"},
		{[]string{"--role", "prefill", "--transfer-port", "9000", "--handoff-timeout", "5s"}, ""},
		{[]string{"--role", "decode", "--chunked-prefill-size", "8", "--max-queued-requests", "4"}, ""},
		{[]string{"--max-running-requests", "1", "--preempt-after", "1s"}, ""},
		{append(router, "--queue-timeout", "0s"), "--queue-timeout must be positive"},
		{append(router, "--speculative-algorithm", "ngram"), "--speculative-algorithm (standalone, decode only)"},
		{[]string{"--speculative-algorithm", "ngram", "--speculative-num-draft-tokens", "6"}, ""},
		{[]string{"--role", "decode", "--speculative-algorithm", "ngram"}, ""},
		{[]string{"--speculative-algorithm", "eagle"}, `speculative algorithm "eagle" is not available`},
		{[]string{"--role", "decode", "--spec-guard", "off", "--spec-guard-min-tokens", "64"}, ""},
		{append(router, "--spec-guard", "off"), "--spec-guard (standalone, decode only)"},
		{[]string{"--spec-guard", "maybe"}, `--spec-guard "maybe": on or off`},
		{[]string{"--spec-guard-max-accept-rate", "1.5"}, "maximum accept rate 1.5 is outside 0..1"},
		{[]string{"--spec-guard-min-tokens", "-1"}, "minimum tokens cannot be negative"},
		{[]string{"--speculative-algorithm", "ngram", "--speculative-num-steps", "0"}, "at least one draft token and one step"},
		{[]string{"--speculative-algorithm", "draft"}, "needs --speculative-draft-model-path"},
		{[]string{"--speculative-algorithm", "ngram", "--speculative-draft-model-path", "x.gguf"}, "is for --speculative-algorithm draft"},
		{[]string{"--role", "decode", "--speculative-algorithm", "draft", "--speculative-draft-model-path", "x.gguf", "--speculative-disable-by-batch-size", "8"}, ""},
		{[]string{"--speculative-algorithm", "draft", "--speculative-draft-model-path", "x", "--speculative-draft-load-format", "onnx"}, "unknown --speculative-draft-load-format"},
		{[]string{"--speculative-disable-by-batch-size", "-1"}, "must not be negative"},
		{append(router, "--speculative-draft-model-path", "x.gguf"), "--speculative-draft-model-path (standalone, decode only)"},
	} {
		dryRun(t, c.args, c.err, "")
	}
	t.Setenv("BATON_MAX_RUNNING_REQUESTS", "1")
	dryRun(t, router, "--max-running-requests", "")
}

// Every serve flag has its roles.
func TestEveryFlagHasRoles(t *testing.T) {
	serveCmd().Flags().VisitAll(func(f *pflag.Flag) {
		if _, ok := flagRoles[f.Name]; !ok {
			t.Errorf("--%s has no entry in flagRoles", f.Name)
		}
	})
	for name := range flagRoles {
		if serveCmd().Flags().Lookup(name) == nil {
			t.Errorf("flagRoles names --%s, which serve does not have", name)
		}
	}
}
