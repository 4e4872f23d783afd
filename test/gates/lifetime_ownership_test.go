package gates

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// streamUntil runs a streaming request until ctx ends (the client leaves).
func streamUntil(ctx context.Context, url, prompt string) {
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":16,"stream":true}`, prompt)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// scenarioAbortDuringTransfer aborts a request while a slow writer, which
// ignores the abort, keeps writing its pages. The pages must wait in
// quarantine (drain wait), the writes arriving after the abort must be
// dropped and counted (late-message drop), and the next request, which
// reuses pages, must read only its own KV.
func scenarioAbortDuringTransfer(t *testing.T, guardsOff string) violations {
	return abortDuringTransfer(t, guardsOff, false)
}

// scenarioAbortDuringTransferIPC is the same over cuda-ipc: the slow
// writer's REF frames each make decode copy a page out of prefill's arena,
// and the drain proof is decode's own copies ending with the session.
func scenarioAbortDuringTransferIPC(t *testing.T, guardsOff string) violations {
	return abortDuringTransfer(t, guardsOff, true)
}

func abortDuringTransfer(t *testing.T, guardsOff string, cudaIPC bool) violations {
	ref := loadReference(t)
	var v violations
	c := startCluster(t, setup{prefillFaults: "slow_writer=120ms,ignore_abort=true", guardsOff: guardsOff, cudaIPC: cudaIPC,
		workerArgs: []string{"--page-size", "4"}, decodeArgs: []string{"--max-total-tokens", "256"}})
	d := c.Decode[0]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { streamUntil(ctx, c.Router.URL, longPrompt); close(done) }()
	// The client leaves once a page has landed: the writer, which ignores
	// the abort, still has most of the prompt to write.
	if !waitFor(t, 5*time.Second, func() bool { return harness.Metrics(t, d)["baton_kv_transfer_bytes_total"] > 0 }) {
		v.add("no page of the request reached decode")
	}
	cancel()

	// Watch decode while the writer is still writing: the pages must stay
	// quarantined for as long as it writes (several frames of the slow
	// writer), not for the instant between the abort and their release.
	var firstQ, lastQ time.Time
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		m := harness.Metrics(t, d)
		if m["baton_kv_pages_quarantined"] > 0 {
			if firstQ.IsZero() {
				firstQ = time.Now()
			}
			lastQ = time.Now()
		}
		if m[`baton_requests_total{outcome="aborted",role="decode"}`] >= 1 && m["baton_kv_pages_quarantined"] == 0 &&
			m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] == m["baton_kv_pages_capacity"] {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	<-done
	if held := lastQ.Sub(firstQ); firstQ.IsZero() || held < 100*time.Millisecond {
		v.add("the aborted request's pages left quarantine after %v while its writer was still writing", held)
	}
	// The slow writer is done by now (its session closed); the late writes it
	// made after the abort must have been dropped.
	if !waitFor(t, 5*time.Second, func() bool {
		return harness.Metrics(t, d)[`baton_late_messages_dropped_total{kind="write",role="decode"}`] >= 1
	}) {
		v.add("no late write was dropped after the abort")
	}
	// The next owner of those pages reads only its own KV.
	if code, text, body := greedy(t, c.Router.URL, ref); code != 200 || text != ref.GeneratedText {
		v.add("the next request after the abort: %d %s", code, body)
	}
	if cudaIPC {
		if m := harness.Metrics(t, c.Prefill[0]); m[`baton_kv_pages_shipped_total{from="device",role="prefill"}`] == 0 || m[`baton_kv_pages_shipped_total{from="host",role="prefill"}`] != 0 {
			v.add("over cuda-ipc, prefill shipped %v pages staged on the device and %v through host memory", m[`baton_kv_pages_shipped_total{from="device",role="prefill"}`], m[`baton_kv_pages_shipped_total{from="host",role="prefill"}`])
		}
	}
	checkClean(t, c, &v)
	return v
}

// waitFor polls ok until it holds or d passes, and says which: a caller
// that needs the condition must treat false as a failure.
func waitFor(t *testing.T, d time.Duration, ok func() bool) bool {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// Gate 4, lifetime/ownership.
func TestGateAbortDuringTransfer(t *testing.T) { requireClean(t, scenarioAbortDuringTransfer(t, "")) }

func TestGateAbortDuringTransferCUDAIPC(t *testing.T) {
	requireClean(t, scenarioAbortDuringTransferIPC(t, ""))
}

// kill -9 of prefill in the middle of a transfer: decode notices (the
// session's connection is gone) and ends with zero leaked pages.
func TestGateKillPrefillMidTransfer(t *testing.T) { killPrefillMidTransfer(t, false) }

// The same over cuda-ipc: decode keeps its mapping of the dead prefill's
// arena until the session it served ends, and frees its pages by the
// same rules.
func TestGateKillPrefillMidTransferCUDAIPC(t *testing.T) { killPrefillMidTransfer(t, true) }

func killPrefillMidTransfer(t *testing.T, cudaIPC bool) {
	c := startCluster(t, setup{prefillFaults: "kill_after_frames=2", cudaIPC: cudaIPC, workerArgs: []string{"--page-size", "4"}})
	code, _, body := harness.Post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":8}`, longPrompt))
	if code == 200 {
		t.Fatalf("a request whose prefill died got 200: %s", body)
	}
	select {
	case <-c.Prefill[0].Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("the prefill worker did not die")
	}
	var v violations
	checkClean(t, &harness.Cluster{Decode: c.Decode}, &v)
	requireClean(t, v)
}

// kill -9 of decode in the middle of a transfer: prefill's writes fail, and
// it ends with zero leaked pages of its own.
func TestGateKillDecodeMidTransfer(t *testing.T) { killDecodeMidTransfer(t, false) }

// The same over cuda-ipc: decode dies between its copies out of the
// arena; prefill's session ends unconfirmed and its staged bytes wait out
// the quarantine, its pool pages none of it.
func TestGateKillDecodeMidTransferCUDAIPC(t *testing.T) { killDecodeMidTransfer(t, true) }

func killDecodeMidTransfer(t *testing.T, cudaIPC bool) {
	c := startCluster(t, setup{prefillFaults: "slow_writer=100ms", cudaIPC: cudaIPC, workerArgs: []string{"--page-size", "4"}})
	done := make(chan int, 1)
	go func() {
		code, _, _ := harness.Post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":8}`, longPrompt))
		done <- code
	}()
	// Mid-transfer: a page has landed, and the slow writer has more to send.
	if !waitFor(t, 5*time.Second, func() bool { return harness.Metrics(t, c.Decode[0])["baton_kv_transfer_bytes_total"] > 0 }) {
		t.Fatal("no page reached decode")
	}
	_ = c.Decode[0].Signal(syscall.SIGKILL)
	if code := <-done; code == 200 {
		t.Fatal("a request whose decode worker died got 200")
	}
	var v violations
	checkClean(t, &harness.Cluster{Prefill: c.Prefill}, &v)
	requireClean(t, v)
}
