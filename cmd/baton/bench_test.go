package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/batonlm/baton/internal/bench"
)

// sseServer answers every completion with n chunks and usage, or with
// HTTP 503 when fail is set.
func sseServer(t *testing.T, fail bool) (*httptest.Server, *atomic.Int32) {
	failEvery := 0
	if fail {
		failEvery = 1
	}
	return sseServerFailing(t, failEvery)
}

// sseServerFailing is sseServer that answers every failEvery-th request
// (0: none) with HTTP 503.
func sseServerFailing(t *testing.T, failEvery int) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" || r.Header.Get("Authorization") != "Bearer k" {
			// /tokenize too: this server is one without it.
			http.Error(w, `{"error":{"message":"wrong path or key"}}`, http.StatusNotFound)
			return
		}
		n := calls.Add(1)
		fail := failEvery > 0 && int(n)%failEvery == 0
		if fail {
			http.Error(w, `{"error":{"message":"overloaded"}}`, http.StatusServiceUnavailable)
			return
		}
		var body struct {
			MaxTokens int `json:"max_tokens"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range body.MaxTokens {
			fin := "null"
			if i == body.MaxTokens-1 {
				fin = `"length"`
			}
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"x\",\"finish_reason\":%s}]}\n\n", fin)
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d}}\n\ndata: [DONE]\n\n", body.MaxTokens)
	}))
	t.Cleanup(s.Close)
	return s, &calls
}

func runBench(args ...string) (string, error) {
	cmd := benchCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestBenchServeCommand(t *testing.T) {
	s, calls := sseServer(t, false)
	out, err := runBench("serve", "--url", s.URL, "--model", "m", "--api-key", "k", "--num-prompts", "6", "--concurrency", "2",
		"--input-len", "4", "--output-len", "3", "--seed", "9")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// One warm-up request (the default) and the 6 measured.
	if calls.Load() != 7 || !regexp.MustCompile(`Successful requests: +6\n`).MatchString(out) || !strings.Contains(out, "P99 ITL (ms):") ||
		!regexp.MustCompile(`Warm-up requests \(not counted\): +1\n`).MatchString(out) {
		t.Errorf("%d calls; output:\n%s", calls.Load(), out)
	}
	// Not a terminal: no progress bar in the output.
	if strings.Contains(out, "requests ") && strings.Contains(out, "%") {
		t.Errorf("progress bar drawn into a non-terminal:\n%s", out)
	}

	out, err = runBench("serve", "--url", s.URL+"/v1", "--model", "m", "--api-key", "k", "--num-prompts", "2", "--output-len", "4", "--request-rate", "100", "--json", "--warmup-requests", "0")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rep bench.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output is not one JSON report: %v\n%s", err, out)
	}
	if rep.Completed != 2 || rep.TotalOutputTokens != 8 || rep.RequestRate != 100 || rep.Model != "m" || rep.WarmupRequests != 0 || calls.Load() != 9 {
		t.Errorf("report %+v", rep)
	}
}

func TestBenchServeFailures(t *testing.T) {
	s, _ := sseServer(t, true)
	// A server that fails every request fails the warm-up: no run, no figures.
	if out, err := runBench("serve", "--url", s.URL, "--model", "m", "--api-key", "k", "--num-prompts", "2", "--output-len", "2"); err == nil || !strings.Contains(err.Error(), "warm-up request failed") || strings.Contains(out, "Successful requests:") {
		t.Errorf("a failing warm-up: %v\n%s", err, out)
	}
	out, err := runBench("serve", "--url", s.URL, "--model", "m", "--api-key", "k", "--num-prompts", "2", "--output-len", "2", "--warmup-requests", "0")
	if err == nil || !strings.Contains(err.Error(), "overloaded") {
		t.Errorf("every request failed, yet err = %v", err)
	}
	if !strings.Contains(out, "Failed requests:") || !strings.Contains(out, "HTTP 503: overloaded") {
		t.Errorf("the report of a failed run is not printed:\n%s", out)
	}
	// Some failed: the run still fails, unless --allow-failures says the
	// figures of the rest are wanted anyway.
	some, _ := sseServerFailing(t, 2)
	out, err = runBench("serve", "--url", some.URL, "--model", "m", "--api-key", "k", "--num-prompts", "4", "--output-len", "2", "--warmup-requests", "0")
	if err == nil || !strings.Contains(err.Error(), "2 of 4 requests failed") {
		t.Errorf("half the requests failed, yet err = %v", err)
	}
	if !strings.Contains(out, "Failed requests:") {
		t.Errorf("the report of a partly failed run is not printed:\n%s", out)
	}
	if _, err := runBench("serve", "--url", some.URL, "--model", "m", "--api-key", "k", "--num-prompts", "4", "--output-len", "2", "--allow-failures", "--warmup-requests", "0"); err != nil {
		t.Errorf("--allow-failures: %v", err)
	}
	if _, err := runBench("serve", "--url", s.URL, "--no-such-flag"); err == nil || !strings.Contains(err.Error(), "unknown flag") {
		t.Errorf("unknown flag: %v", err)
	}
	if _, err := runBench("serve", "--url", s.URL, "--num-prompts", "0"); err == nil {
		t.Error("--num-prompts 0 accepted")
	}
}
