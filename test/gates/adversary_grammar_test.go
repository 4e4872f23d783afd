package gates

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// The adversary gate's grammar attacks, by a holder of a valid API key on a
// PD cluster. Constraints are the one request field that makes the server
// run work of the client's design at every step, so:
//
//   - a grammar that admits no first token fails on prefill; the request
//     must end at once on both workers with the client's 400 (it once held
//     decode's reservation for prefill's 30 s event timeout, and 70 of them
//     held the pool), and decode's pages must come back;
//   - a new pattern whose every position is a state of its own makes each
//     mask cost tens of milliseconds; the masks are made off the engine
//     loop, so an unconstrained victim still gets the reference text, and
//     the attacker's request ends with 400 once its mask work passes its
//     bound, counted on the worker that made the masks.
func TestGateAdversaryGrammar(t *testing.T) {
	const key = "gr4mmar-k3y"
	c := startCluster(t, setup{routerArgs: []string{"--api-key", key}, workerArgs: []string{"--kv-poison"}})
	var v violations
	auth := []string{"Authorization", "Bearer " + key}
	ref := loadReference(t)

	// No first token: 24 at once, each a 400 well before any 30 s timeout.
	const holders = 24
	type answer struct {
		code int
		body string
		took time.Duration
	}
	answers := make([]answer, holders)
	var wg sync.WaitGroup
	for i := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"stories260K","prompt":"Once upon a time %d","max_tokens":200,"ebnf":"root ::= [^\\x00-\\U0010FFFF]"}`, i)
			start := time.Now()
			code, b := post(c.Router.URL+"/v1/completions", body, auth...)
			answers[i] = answer{code, b, time.Since(start)}
		}()
	}
	wg.Wait()
	for i, a := range answers {
		if a.code != http.StatusBadRequest || !strings.Contains(a.body, "admits no token") {
			v.add("grammar admitting no token, request %d: %d %s, want 400 naming the constraint", i, a.code, a.body)
		}
		if a.took > 10*time.Second {
			v.add("grammar admitting no token, request %d: answered after %s; the failure must end the request at once, not at a timeout", i, a.took)
		}
	}
	if n := harness.Metrics(t, c.Prefill[0])[`baton_grammar_refusals_total{reason="no_token",role="prefill"}`]; n < holders {
		v.add("prefill counted %v no_token refusals, want %d", n, holders)
	}
	checkClean(t, c, &v)
	if code, text, b := greedy(t, c.Router.URL, ref, auth...); code != 200 || text != ref.GeneratedText {
		v.add("victim after the no-token attack: %d %q %s", code, text, b)
	}

	// Costly masks: three attackers, each a pattern never seen before,
	// while a victim asks for the reference.
	var attackers [3]answer
	for i := range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":100,"regex":"[\\p{L}\\p{N} ]{99%d}"}`, i)
			code, b := post(c.Router.URL+"/v1/completions", body, auth...)
			attackers[i] = answer{code: code, body: b}
		}()
	}
	time.Sleep(200 * time.Millisecond) // the attackers' masks are being made
	start := time.Now()
	code, text, b := greedy(t, c.Router.URL, ref, auth...)
	victim := time.Since(start)
	if code != 200 || text != ref.GeneratedText {
		v.add("victim beside costly grammars: %d %q %s", code, text, b)
	}
	wg.Wait()
	t.Logf("victim's %d tokens beside three costly grammars: %s", len(ref.GeneratedIDs), victim)
	for i, a := range attackers {
		if a.code != http.StatusBadRequest || !strings.Contains(a.body, "took too long to follow") {
			v.add("costly grammar %d: %d %s, want 400 once its mask work passed its bound", i, a.code, a.body)
		}
	}
	// Which worker makes an attacker's last masks depends on the machine's
	// speed (prefill makes the first, decode the rest), so the figures
	// are the cluster's.
	refusals, masks := 0.0, 0.0
	for _, w := range c.Workers() {
		m := harness.Metrics(t, w)
		refusals += m[`baton_grammar_refusals_total`]
		masks += m["baton_grammar_mask_seconds_count"]
	}
	if refusals < holders+3 {
		v.add("%v grammar refusals counted on the workers, want %d", refusals, holders+3)
	}
	if masks < holders+3 {
		v.add("%v masks timed in baton_grammar_mask_seconds on the workers, want one at least for each constrained request (%d)", masks, holders+3)
	}
	checkClean(t, c, &v)
	requireClean(t, v)
}

// post sends a JSON body with header pairs; safe from any goroutine (it
// reports a transport error as status 0).
func post(url, body string, header ...string) (int, string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
