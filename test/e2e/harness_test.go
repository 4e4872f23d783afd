// Package e2e runs the baton binary as a separate process and talks to it over
// HTTP, the way users and the official clients do.
package e2e

import (
	"context"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// The helpers below are short names for test/harness, shared with test/gates.

type server = harness.Server

func TestMain(m *testing.M) {
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}

func startServer(t *testing.T, args ...string) *server { t.Helper(); return harness.Start(t, args...) }

func repoRoot(t testing.TB) string { return harness.RepoRoot(t) }

func cleanEnv() []string { return harness.CleanEnv() }

func runCommand(ctx context.Context, timeout time.Duration, dir string, env []string, name string, args ...string) (string, error) {
	return harness.RunCommand(ctx, timeout, dir, env, name, args...)
}

func post(t *testing.T, url, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	return harness.Post(t, url, body, header...)
}

func get(t *testing.T, url string) (int, []byte) { t.Helper(); return harness.Get(t, url) }

func metricsOf(t *testing.T, s *server) map[string]float64 { t.Helper(); return harness.Metrics(t, s) }

func waitPagesFree(t *testing.T, s *server) { t.Helper(); harness.WaitPagesFree(t, s) }

func batonBinary(t testing.TB) string { return harness.Binary(t) }
