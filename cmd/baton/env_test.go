package main

import (
	"bytes"
	"strings"
	"testing"
)

// A BATON_ variable that sets no flag is named at start-up, with the
// variable it most likely meant; the right ones and those read by other
// means pass in silence.
func TestMisspelledEnvWarns(t *testing.T) {
	t.Setenv("BATON_PAGESIZE", "32")
	t.Setenv("BATON_MAX_RUNNING_REQUEST", "4")
	t.Setenv("BATON_PAGE_SIZE", "32")
	t.Setenv("BATON_FAULTS", "")
	t.Setenv("BATON_ROUTER", "http://x") // baton check's flag
	t.Setenv("BATON_CPU_AVX512", "1")    // the cpu backend's switches
	t.Setenv("BATON_CPU_VNNI", "1")
	cmd := serveCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{"--dry-run"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"BATON_PAGESIZE matches no flag (did you mean BATON_PAGE_SIZE?)",
		"BATON_MAX_RUNNING_REQUEST matches no flag (did you mean BATON_MAX_RUNNING_REQUESTS?)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("no warning %q in:\n%s", want, got)
		}
	}
	for _, quiet := range []string{"BATON_PAGE_SIZE ", "BATON_FAULTS", "BATON_ROUTER", "BATON_CPU_AVX512", "BATON_CPU_VNNI"} {
		if strings.Contains(got, quiet) {
			t.Errorf("a warning about %s in:\n%s", quiet, got)
		}
	}
}
