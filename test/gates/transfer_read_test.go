package gates

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// handoffFault is one injected fault and the evidence the gate expects.
type handoffFault struct {
	name   string
	faults string
	// reason is the baton_handoff_failures_total label decode must count;
	// late is a baton_late_messages_dropped_total kind instead.
	reason, late string
}

var handoffFaults = []handoffFault{
	{"short write", "short_write=1", "coverage", ""},
	{"dropped frames", "drop=1", "coverage", ""},
	{"over-claim", "over_claim=1", "over_claim", ""},
	{"corrupt bytes", "corrupt=1", "checksum", ""},
	{"misdirected page", "wrong_page=1", "owner_tag", ""},
	{"wrong epoch", "wrong_epoch=1", "", "admit"},
}

// clientLeak matches what a client must never read of a failed handoff:
// worker addresses and ports, rooms, epochs, pages, writers.
var clientLeak = regexp.MustCompile(`(?i)127\.0\.0\.1|:\d{2,5}\b|\broom|\bepoch|\bwriter|\bpages?\b`)

// scenarioHandoffFault injects one fault into every prefill write and checks
// that the client gets an error (never 200), decode counts the failure under
// the expected check, no NaN was sampled, and every page comes back.
func scenarioHandoffFault(t *testing.T, f handoffFault, guardsOff string) violations {
	ref := loadReference(t)
	var v violations
	c := startCluster(t, setup{prefillFaults: f.faults, guardsOff: guardsOff, workerArgs: []string{"--page-size", "4"}})
	code, text, body := greedy(t, c.Router.URL, ref)
	if code == 200 {
		v.add("%s: the client got 200 (%q matches the reference: %v)", f.name, text, text == ref.GeneratedText)
	} else if leak := clientLeak.Find(body); leak != nil {
		// Which check refused, and whose write, is for the log.
		v.add("%s: the client reads %q in %s", f.name, leak, body)
	}
	m := harness.Metrics(t, c.Decode[0])
	if f.reason != "" {
		if key := fmt.Sprintf(`baton_handoff_failures_total{reason=%q,role="decode"}`, f.reason); m[key] < 1 {
			v.add("%s: decode did not count a %s failure (status %d, %s)", f.name, f.reason, code, body)
		}
	}
	if f.late != "" {
		if key := fmt.Sprintf(`baton_late_messages_dropped_total{kind=%q,role="decode"}`, f.late); m[key] < 1 {
			v.add("%s: decode dropped no late %s (status %d, %s)", f.name, f.late, code, body)
		}
	}
	checkClean(t, c, &v)
	return v
}

// Gate 3, transfer/read: every injected handoff fault ends in a client
// error, a counter, and no read of the page.
func TestGateTransferRead(t *testing.T) {
	for _, f := range handoffFaults {
		t.Run(f.name, func(t *testing.T) { requireClean(t, scenarioHandoffFault(t, f, "")) })
	}
}

// Faults that lose nothing (duplicated, reordered, delayed frames) must not
// change a single token, and with --kv-poison no NaN reaches sampling.
func TestGateHarmlessFaultsKeepExactOutput(t *testing.T) {
	ref := loadReference(t)
	c := startCluster(t, setup{prefillFaults: "seed=3,duplicate=0.5,reorder=0.5,delay=2ms,delay_p=0.5", workerArgs: []string{"--page-size", "1"}})
	for i := 0; i < 5; i++ {
		if code, text, body := greedy(t, c.Router.URL, ref); code != 200 || text != ref.GeneratedText {
			t.Fatalf("request %d: %d %s", i, code, body)
		}
	}
	var v violations
	checkClean(t, c, &v)
	requireClean(t, v)
}

// scenarioReadGate switches the Commit's coverage and checksum guards off
// (and whatever else guardsOff names), so that a short write's missing page
// passes the handoff; its written count still says nothing landed there,
// and the read gate refuses it on decode's first step. The client gets an
// error, decode counts the read gate's refusal (not a NaN), and every page
// comes back.
func scenarioReadGate(t *testing.T, guardsOff string) violations {
	ref := loadReference(t)
	var v violations
	off := "coverage,checksum"
	if guardsOff != "" {
		off += "," + guardsOff
	}
	c := startCluster(t, setup{prefillFaults: "short_write=1", guardsOff: off, workerArgs: []string{"--page-size", "4"}})
	code, text, body := greedy(t, c.Router.URL, ref)
	if code == 200 {
		v.add("the client got 200 from a page nobody wrote (%q)", text)
	}
	m := harness.Metrics(t, c.Decode[0])
	if m["baton_kv_read_gate_failures_total"] < 1 {
		v.add("the read gate refused nothing (status %d, %s; NaN logits %v)", code, body, m["baton_nan_logits_total"])
	}
	checkPagesFree(t, c, &v)
	return v
}

// Gate 3b, the read gate on its own: a page that passed the Commit but was
// never written is not read.
func TestGateReadGate(t *testing.T) { requireClean(t, scenarioReadGate(t, "")) }

// checkPagesFree adds a violation for any worker whose pages are not all
// free (leaked or quarantined) within ten seconds.
func checkPagesFree(t *testing.T, c *harness.Cluster, v *violations) {
	for _, w := range c.Workers() {
		if !waitFor(t, 10*time.Second, func() bool {
			m := harness.Metrics(t, w)
			return m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] == m["baton_kv_pages_capacity"] && m["baton_kv_pages_quarantined"] == 0
		}) {
			v.add("%s: pages not all free: %v", w.URL, harness.Metrics(t, w))
		}
	}
}

// With the read gate off as well (the incident's shape: the claim believed,
// the pages read), the missing page holds NaN under --kv-poison, decode's
// logits are NaN, and the engine fails the request: the client gets an
// error, never a 200 made from KV nobody wrote, and every page comes back.
// The poison is NaN in the KV dtype, so f16 pages are caught as f32 ones.
func TestGatePoisonedReadFailsTheRequest(t *testing.T) {
	ref := loadReference(t)
	for _, dt := range []string{"f32", "f16"} {
		t.Run(dt, func(t *testing.T) {
			c := startCluster(t, setup{prefillFaults: "short_write=1", guardsOff: "coverage,checksum,read_gate",
				workerArgs: []string{"--page-size", "4", "--kv-cache-dtype", dt}})
			code, text, body := greedy(t, c.Router.URL, ref)
			if code == 200 {
				t.Fatalf("the client got 200 from unwritten KV (%q)", text)
			}
			if n := harness.Metrics(t, c.Decode[0])["baton_nan_logits_total"]; n < 1 {
				t.Fatalf("decode sampled no NaN logits (status %d, %s): the unwritten page was never read", code, body)
			}
			var v violations
			checkPagesFree(t, c, &v)
			requireClean(t, v)
		})
	}
}
