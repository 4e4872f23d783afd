package gates

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/test/harness"
)

// Gate 2, reject/admission: a rejected request creates no reservation, no
// transport session and no queue entry; valid and queued requests still run.
func TestGateRejectAdmission(t *testing.T) {
	ref := loadReference(t)
	c := startCluster(t, setup{prefillArgs: []string{"--max-total-tokens", "64", "--page-size", "16", "--max-running-requests", "1"}})
	d, p := c.Decode[0], c.Prefill[0]

	// Through the router: over the prefill pool.
	long := strings.Repeat("The dog ran. ", 12)
	if code, _, body := harness.Post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":2}`, long)); code != 400 {
		t.Fatalf("over the prefill pool: %d %s", code, body)
	}
	// Straight to prefill's door, with a reservation that names the real decode worker.
	dinfo := serverInfo(t, d)
	_, err := prefillClient(t, p).Prefill(timeout(t), &pdv1.PrefillRequest{RequestId: "reject", Prompt: tokens(100),
		Reservation: &pdv1.Reservation{Room: 999, Epoch: 999, Pages: make([]int32, 7), PromptTokens: 100, Capability: make([]byte, 32),
			Layout: mustInfo(t, p).Layout, Transport: "tcp", TransferAddr: dinfo["transfer_addr"].(string), DecodeAddr: dinfo["grpc_addr"].(string)}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("prefill door let a 100-token prompt into a 64-token pool: %v", err)
	}
	mp, md := harness.Metrics(t, p), harness.Metrics(t, d)
	if mp["baton_kv_transfer_sessions_total"] != 0 || mp["baton_requests_queued_total"] != 0 || md["baton_kv_reservations_total"] != 0 {
		t.Fatalf("a rejected request left traces: sessions %v, queued %v, reservations %v",
			mp["baton_kv_transfer_sessions_total"], mp["baton_requests_queued_total"], md["baton_kv_reservations_total"])
	}
	if mp[`baton_requests_rejected_total{reason="too_long",role="prefill"}`] != 1 {
		t.Fatalf("prefill rejection not counted: %v", mp)
	}

	// Valid requests, more than prefill may run at once: they queue and all finish.
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, text, body := greedy(t, c.Router.URL, ref); code != 200 || text != ref.GeneratedText {
				t.Errorf("queued request: %d %s", code, body)
			}
		}()
	}
	wg.Wait()
	if q := harness.Metrics(t, p)["baton_requests_queued_total"]; q != 6 {
		t.Fatalf("prefill queued %v requests, want 6", q)
	}
	var v violations
	checkClean(t, c, &v)
	requireClean(t, v)
}

func mustInfo(t *testing.T, s *harness.Server) *pdv1.WorkerInfo {
	t.Helper()
	info, err := prefillClient(t, s).Info(timeout(t), &pdv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// Preempted requests re-enter admission holding their pages, are never
// rejected, and still produce the reference token for token.
func TestGatePreemptedRequestsReenter(t *testing.T) {
	ref := loadReference(t)
	s := harness.StartWith(t, harness.Options{Binary: faultsBinary(t)}, "--kv-poison", "--max-running-requests", "1", "--preempt-after", "1ms")
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, text, body := greedy(t, s.URL, ref); code != 200 || text != ref.GeneratedText {
				t.Errorf("a preempted request: %d %s", code, body)
			}
		}()
	}
	wg.Wait()
	m := harness.Metrics(t, s)
	if m["baton_preemptions_total"] == 0 {
		t.Fatal("no request was preempted")
	}
	if m["baton_requests_rejected_total"] != 0 || m["baton_kv_release_errors"] != 0 || m["baton_nan_logits_total"] != 0 {
		t.Fatalf("rejections %v, release errors %v, NaN %v", m["baton_requests_rejected_total"], m["baton_kv_release_errors"], m["baton_nan_logits_total"])
	}
	harness.WaitPagesFree(t, s)
}
