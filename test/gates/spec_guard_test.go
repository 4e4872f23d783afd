package gates

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/tokenizer"
	"github.com/batonlm/baton/test/harness"
)

// The speculative decoding guard as a detector of corrupted KV (an
// incident report's rule): with the checksum and owner-tag guards off, one
// decode worker's landed prompt KV is flattened after the handoff
// (BATON_FAULTS=flatten_landed=true: every K and V value 1.0), and the
// bundled model, attending over KV that no longer tells the prompt's
// positions apart, repeats one token. The guard on that worker stops the
// loop once 128 tokens are out; the router continues the request on the
// healthy decode worker from the tokens the client has, and the client's
// answer is those tokens followed by exactly what a healthy server
// generates after them, streamed or not. With --spec-guard off the loop
// reaches the client.

const (
	specGuardTokens = 200
	// loopRun is how many equal tokens in a row the gate calls a loop
	// (the flattened worker's runs are 50 and more; the healthy text
	// repeats sentences, never one token).
	loopRun = 32
	// tripBy is where the guard has stopped a loop: past 128 tokens, at
	// the end of the verifying step (4 drafts and the target's token).
	tripBy = 128 + 5
)

// specAnswer is one completion as the client read it.
type specAnswer struct {
	code     int
	body     string
	ids      []int32 // the completion's tokens, from its logprobs
	text     string
	usage    int // completion_tokens
	errEvent bool
}

// pieces maps each token's text (as logprobs name it) back to its id.
func pieces(t *testing.T) map[string]int32 {
	f, err := gguf.Parse(bundled.Stories260K)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	// A text that is both a byte-fallback token and a piece (",") maps to
	// the piece, the later id: what the model generates for it.
	m := map[string]int32{}
	for id := range int32(tok.VocabSize()) {
		m[tok.TokenText(id)] = id
	}
	return m
}

// askSpec sends the gate's greedy completion of prompt (text or token ids
// as JSON) for max tokens with logprobs, whole or streamed.
func askSpec(t *testing.T, url, prompt string, max int, stream bool, ids map[string]int32) specAnswer {
	t.Helper()
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%s,"max_tokens":%d,"temperature":0,"ignore_eos":true,"logprobs":1,"stream":%v`, prompt, max, stream)
	if stream {
		body += `,"stream_options":{"include_usage":true}`
	}
	code, _, b := harness.Post(t, url+"/v1/completions", body+"}")
	a := specAnswer{code: code, body: string(b)}
	type chunk struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs *struct {
				Tokens []string `json:"tokens"`
			} `json:"logprobs"`
		} `json:"choices"`
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error *struct{} `json:"error"`
	}
	var chunks []chunk
	if stream {
		for _, line := range strings.Split(a.body, "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok || data == "[DONE]" {
				continue
			}
			var c chunk
			if json.Unmarshal([]byte(data), &c) != nil {
				t.Fatalf("chunk %q", data)
			}
			chunks = append(chunks, c)
		}
	} else if code == 200 {
		var c chunk
		if json.Unmarshal(b, &c) != nil {
			t.Fatalf("body %q", b)
		}
		chunks = append(chunks, c)
	}
	for _, c := range chunks {
		a.errEvent = a.errEvent || c.Error != nil
		if c.Usage != nil {
			a.usage = c.Usage.CompletionTokens
		}
		for _, ch := range c.Choices {
			a.text += ch.Text
			if ch.Logprobs == nil {
				continue
			}
			for _, s := range ch.Logprobs.Tokens {
				id, ok := ids[s]
				if !ok {
					t.Fatalf("token %q is not in the vocabulary", s)
				}
				a.ids = append(a.ids, id)
			}
		}
	}
	return a
}

// longestRun is the length of the longest run of one token in ids.
func longestRun(ids []int32) int {
	best, run := 0, 0
	for i := range ids {
		if i > 0 && ids[i] == ids[i-1] {
			run++
		} else {
			run = 1
		}
		best = max(best, run)
	}
	return best
}

func jsonIDs(ids []int32) string {
	b, _ := json.Marshal(ids)
	return string(b)
}

var deliveredRE = regexp.MustCompile(`continuing on another pair" .* reason=spec_guard .*delivered=(\d+)`)

// startSpecCluster starts 2 prefill and 2 decode workers with ngram
// speculation and the checksum and owner-tag guards off, decode 0 with
// its landed KV flattened, and a router; decodes says how many decode
// workers (1: the flattening one alone).
func startSpecCluster(t *testing.T, decodes int, guard string, extra ...string) *harness.Cluster {
	t.Helper()
	bin := faultsBinary(t)
	off := "BATON_GUARDS_OFF=checksum,owner_tag"
	c := &harness.Cluster{}
	args := append([]string{"--kv-poison", "--page-size", "4"}, extra...)
	for i := range 2 {
		_ = i
		c.Prefill = append(c.Prefill, harness.StartWith(t, harness.Options{Binary: bin, Env: []string{off}}, append([]string{"--role", "prefill"}, args...)...))
	}
	for i := range decodes {
		env := []string{off}
		if i == 0 {
			env = append(env, "BATON_FAULTS=flatten_landed=true")
		}
		c.Decode = append(c.Decode, harness.StartWith(t, harness.Options{Binary: bin, Env: env},
			append([]string{"--role", "decode", "--speculative-algorithm", "ngram", "--spec-guard", guard}, args...)...))
	}
	rargs := []string{"--role", "router"}
	for _, w := range c.Prefill {
		rargs = append(rargs, "--prefill", w.URL)
	}
	for _, w := range c.Decode {
		rargs = append(rargs, "--decode", w.URL)
	}
	c.Router = harness.StartWith(t, harness.Options{Binary: bin}, append(rargs, extra...)...)
	return c
}

// scenarioSpecGuard sends greedy completions, streamed and whole in
// turn, until each kind has been stopped on the flattened worker and
// continued (at most 3 of each): every answer is max_tokens long with no
// loop, and one that was continued is the tokens the flattened worker
// sent (a loop) followed by what a healthy server generates after them.
func scenarioSpecGuard(t *testing.T, guard string) violations {
	var v violations
	ref := loadReference(t)
	ids := pieces(t)
	healthy := harness.StartWith(t, harness.Options{Binary: faultsBinary(t)}, "--kv-poison")
	c := startSpecCluster(t, 2, guard)
	continued := map[bool]bool{}
	for i := 0; i < 6 && !(continued[true] && continued[false]); i++ {
		stream := i%2 == 0
		if continued[stream] {
			continue
		}
		before := harness.Metrics(t, c.Decode[0])["baton_spec_anomalies_total"]
		a := askSpec(t, c.Router.URL, strconv.Quote(ref.Prompt), specGuardTokens, stream, ids)
		what := fmt.Sprintf("request %d (stream %v)", i, stream)
		if a.code != 200 || a.errEvent || len(a.ids) != specGuardTokens || a.usage != specGuardTokens {
			v.add("%s: status %d, %d tokens, usage %d: %.300s", what, a.code, len(a.ids), a.usage, a.body)
			continue
		}
		if n := longestRun(a.ids[tripBy:]); n >= loopRun {
			v.add("%s: the loop reached the client past %d tokens: %d equal tokens in a row in %q", what, tripBy, n, a.text)
		}
		if harness.Metrics(t, c.Decode[0])["baton_spec_anomalies_total"] == before {
			continue // ran on the healthy worker, or was not stopped
		}
		continued[stream] = true
		m := deliveredRE.FindAllStringSubmatch(c.Router.Stderr(), -1)
		if len(m) == 0 {
			v.add("%s: the router did not log a continuation", what)
			continue
		}
		k, _ := strconv.Atoi(m[len(m)-1][1])
		if k < 128 || k > tripBy || longestRun(a.ids[:k]) < loopRun {
			v.add("%s: continued after %d tokens: want the flattened worker's loop, stopped past 128 (%v)", what, k, a.ids[:min(k, len(a.ids))])
			continue
		}
		want := askSpec(t, healthy.URL, jsonIDs(append(slices.Clone(ref.PromptIDs), a.ids[:k]...)), specGuardTokens-k, false, ids)
		if want.code != 200 || !slices.Equal(a.ids[k:], want.ids) {
			v.add("%s: after the %d tokens of the flattened worker the client got %v, a healthy server generates %v", what, k, a.ids[k:], want.ids)
		}
	}
	for _, stream := range []bool{true, false} {
		if !continued[stream] {
			v.add("no request (stream %v) was stopped by the spec guard and continued", stream)
		}
	}
	m := harness.Metrics(t, c.Router)
	if got, want := m[`baton_router_retries_total{stage="spec_anomaly"}`], harness.Metrics(t, c.Decode[0])["baton_spec_anomalies_total"]; got != want {
		v.add("router continued %v requests, decode's guard stopped %v", got, want)
	}
	if n := harness.Metrics(t, c.Decode[1])["baton_spec_anomalies_total"]; n != 0 {
		v.add("the healthy decode worker's guard stopped %v requests", n)
	}
	checkClean(t, c, &v)
	return v
}

func TestGateSpecGuard(t *testing.T) { requireClean(t, scenarioSpecGuard(t, "on")) }

// With the guard off, the flattened worker's loop reaches the client.
func TestGateSpecGuardOff(t *testing.T) {
	v := scenarioSpecGuard(t, "off")
	if len(v) == 0 {
		t.Fatal("with --spec-guard off, the gate still passes")
	}
	t.Logf("with --spec-guard off the gate fails with:\n- %s", strings.Join(v, "\n- "))
}

// With the flattened worker the only decode worker, a request its guard
// stops ends in an error: streamed, the tokens before the trip and then
// an error event; whole, a 502. Nothing after the trip reaches the client.
func TestGateSpecGuardOneDecodeWorker(t *testing.T) {
	var v violations
	ref := loadReference(t)
	ids := pieces(t)
	c := startSpecCluster(t, 1, "on")
	s := askSpec(t, c.Router.URL, strconv.Quote(ref.Prompt), specGuardTokens, true, ids)
	if s.code != 200 || !s.errEvent || len(s.ids) < 128 || len(s.ids) > 128+4 || !strings.HasSuffix(strings.TrimSpace(s.body), "data: [DONE]") {
		v.add("streamed: status %d, error event %v, %d tokens: %.300s", s.code, s.errEvent, len(s.ids), s.body)
	}
	w := askSpec(t, c.Router.URL, strconv.Quote(ref.Prompt), specGuardTokens, false, ids)
	if w.code != 502 || !strings.Contains(w.body, `"error"`) || !strings.Contains(w.body, "spec_anomaly") {
		v.add("whole: status %d: %.300s", w.code, w.body)
	}
	if n := harness.Metrics(t, c.Decode[0])["baton_spec_anomalies_total"]; n != 2 {
		v.add("decode's guard stopped %v requests, want 2", n)
	}
	checkClean(t, c, &v)
	requireClean(t, v)
}
