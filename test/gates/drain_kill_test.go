package gates

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// drainStreams is how many streams are mid-generation when one decode
// worker is killed and another drained; drainTokens each one's length.
const drainStreams, drainTokens = 32, 400

// drainPrompts are the streams' prompts, in turn.
var drainPrompts = []string{"Once upon a time", "The little dog", "Lily and Ben went to the park. They saw", "One day, a bird", longPrompt}

func drainBody(prompt string, stream bool) string {
	opts := ""
	if stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":%v%s}`,
		prompt, drainTokens, stream, opts)
}

// drainResult is what one streaming client read.
type drainResult struct {
	text      string
	done      bool   // [DONE] came
	errEvent  string // an error event's data
	completed int    // usage.completion_tokens
	status    int
	err       error
}

// drainStream reads one streaming completion to its end; started is told
// once three chunks of text arrived (or the stream ended first).
func drainStream(ctx context.Context, url, prompt string, started func()) (r drainResult) {
	defer started()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(drainBody(prompt, true)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if r.status = resp.StatusCode; r.status != 200 {
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			r.done = true
			continue
		}
		var ch struct {
			Choices []struct{ Text string } `json:"choices"`
			Usage   *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &ch); err != nil || ch.Error != nil {
			r.errEvent = data
			continue
		}
		if ch.Usage != nil {
			r.completed = ch.Usage.CompletionTokens
		}
		for _, c := range ch.Choices {
			r.text += c.Text
			if chunks++; chunks == 3 {
				started()
			}
		}
	}
	r.err = sc.Err()
	return r
}

// TestGateDrainAndKill: 32 greedy streams run on three decode workers; one
// is killed with SIGKILL and another sent SIGTERM (--drain-grace 100ms)
// while they generate. Every stream completes with exactly the text of an
// uninterrupted greedy run and each token counted once (usage), the killed
// worker's streams go on elsewhere as decode_gone migrations and the
// drained worker's as drain migrations, the drained worker exits 0 within
// seconds, and every page is back on the survivors: the prefill worker's
// (including those of requests whose decode died) and the decode worker
// left's, none quarantined, no release refused.
func TestGateDrainAndKill(t *testing.T) {
	bin := faultsBinary(t)
	// The uninterrupted greedy run of each prompt.
	sa := harness.StartWith(t, harness.Options{Binary: bin}, "--kv-poison")
	want := map[string]string{}
	for _, p := range drainPrompts {
		code, _, body := harness.Post(t, sa.URL+"/v1/completions", drainBody(p, false))
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if code != 200 || json.Unmarshal(body, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("reference for %q: %d %s", p, code, body)
		}
		want[p] = c.Choices[0].Text
	}
	_ = sa.Stop()

	c := startCluster(t, setup{prefill: 1, decode: 3, decodeArgs: []string{"--drain-grace", "100ms"}})
	killed, drained := c.Decode[0], c.Decode[1]

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	results := make([]drainResult, drainStreams)
	var wg, started sync.WaitGroup
	for i := range drainStreams {
		wg.Add(1)
		started.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			results[i] = drainStream(ctx, c.Router.URL, drainPrompts[i%len(drainPrompts)], func() { once.Do(started.Done) })
		}()
	}
	started.Wait()
	if err := killed.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if err := drained.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-drained.Exited():
		t.Logf("the drained decode worker exited %v after SIGTERM", time.Since(sent).Round(time.Millisecond))
		if err := drained.ExitErr(); err != nil {
			t.Errorf("the drained decode worker exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Errorf("the drained decode worker still runs 15s after SIGTERM")
	}
	wg.Wait()

	var v violations
	for i, r := range results {
		p := drainPrompts[i%len(drainPrompts)]
		switch {
		case r.err != nil || r.status != 200:
			v.add("stream %d: status %d, %v", i, r.status, r.err)
		case r.errEvent != "" || !r.done:
			v.add("stream %d: error event %q, [DONE] %v", i, r.errEvent, r.done)
		case r.text != want[p]:
			v.add("stream %d (%q): text differs from the uninterrupted run:\n got %q\nwant %q", i, p, r.text, want[p])
		case r.completed != drainTokens:
			v.add("stream %d: usage counts %d completion tokens, want %d", i, r.completed, drainTokens)
		}
	}
	m := harness.Metrics(t, c.Router)
	gone, drain := m[`baton_router_migrations_total{reason="decode_gone"}`], m[`baton_router_migrations_total{reason="drain"}`]
	t.Logf("migrations: decode_gone %v, drain %v, all %v", gone, drain, m["baton_router_migrations_total"])
	if gone == 0 || drain == 0 {
		v.add("decode_gone %v and drain %v migrations: a worker stopped after its streams ended, and the gate proved nothing", gone, drain)
	}
	c.Decode = c.Decode[2:]
	checkClean(t, c, &v)
	requireClean(t, v)
}
