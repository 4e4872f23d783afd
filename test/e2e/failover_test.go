package e2e

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// failoverBody is a long greedy completion: ignore_eos keeps the decode
// worker generating for the whole max_tokens, so that it is still at work
// when it is killed.
const failoverBody = `{"model":"stories260K","prompt":"Once upon a time","max_tokens":480,"temperature":0,"ignore_eos":true`

// A decode worker killed with SIGKILL while it streams a greedy answer:
// the router continues the request on the other decode worker from the
// tokens the client has, and the client reads one stream equal to an
// uninterrupted greedy run, with usage counting the request once.
func TestPDFailoverMidStream(t *testing.T) {
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 2})
	// The router's round robin gives a fresh router's first request to the
	// first decode worker; the test checks that it did (by its reservations)
	// rather than trust it.
	victim, heir := c.Decode[0], c.Decode[1]
	resp, err := http.Post(c.Router.URL+"/v1/completions", "application/json",
		strings.NewReader(failoverBody+`,"stream":true,"stream_options":{"include_usage":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var text, finish string
	var usage map[string]any
	var chunks int
	killed := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
			Error any            `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		if ch.Error != nil {
			t.Fatalf("error event: %s", data)
		}
		if ch.Usage != nil {
			usage = ch.Usage
		}
		for _, cc := range ch.Choices {
			text += cc.Text
			if cc.FinishReason != nil {
				finish = *cc.FinishReason
			}
			chunks++
		}
		if !killed && chunks >= 3 {
			// Stop it at once, so that it cannot finish the answer while the
			// test looks, then kill it.
			_ = victim.Signal(syscall.SIGSTOP)
			if m := metricsOf(t, heir); m["baton_kv_reservations_total"] != 0 {
				t.Fatalf("the first request went to the second decode worker")
			}
			_ = victim.Signal(syscall.SIGKILL)
			<-victim.Exited()
			killed = true
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if !killed {
		t.Fatal("the stream ended before the decode worker could be killed")
	}
	m := metricsOf(t, c.Router)
	if got, all := m[`baton_router_migrations_total{reason="decode_gone"}`], m["baton_router_migrations_total"]; got != 1 || all != 1 {
		t.Fatalf("decode_gone migrations %v of %v, want 1 (was the worker still generating when killed?)", got, all)
	}

	// The same request, uninterrupted, on the worker that is left.
	code, _, body := post(t, c.Router.URL+"/v1/completions", failoverBody+"}")
	if code != 200 {
		t.Fatalf("reference: %d %s", code, body)
	}
	var ref struct {
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage map[string]any `json:"usage"`
	}
	if err := json.Unmarshal(body, &ref); err != nil || len(ref.Choices) != 1 {
		t.Fatalf("reference: %v %s", err, body)
	}
	if text != ref.Choices[0].Text {
		t.Errorf("streamed text after the failover differs from the uninterrupted run:\n got %q\nwant %q", text, ref.Choices[0].Text)
	}
	if finish != "length" || ref.Choices[0].FinishReason != "length" {
		t.Errorf("finish %q, reference %q", finish, ref.Choices[0].FinishReason)
	}
	if usage == nil || usage["prompt_tokens"] != ref.Usage["prompt_tokens"] || usage["completion_tokens"] != float64(480) {
		t.Errorf("usage %v, reference %v", usage, ref.Usage)
	}
	c.Decode = []*harness.Server{heir}
	c.WaitClean(t)
}
