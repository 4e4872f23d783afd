package gates

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/test/harness"
)

// chaosRequests is how many requests TestChaos sends: a short run in
// `make test`, BATON_CHAOS_REQUESTS=1000 in `make chaos`.
func chaosRequests(t *testing.T) int {
	if s := os.Getenv("BATON_CHAOS_REQUESTS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("BATON_CHAOS_REQUESTS=%q", s)
		}
		return n
	}
	return 120
}

// TestChaos sends seeded random traffic through 2 prefill + 2 decode
// workers whose writers inject random faults, with random client
// disconnects. Every client must get either the exact greedy text or an
// error; afterwards no page is leaked or quarantined, none was released
// twice, and no NaN reached sampling.
func TestChaos(t *testing.T) {
	n := chaosRequests(t)
	rng := rand.New(rand.NewPCG(42, 7))
	prompts := []string{"Once upon a time", "The little dog", "Lily and Ben went to the park. They saw", "One day, a bird",
		longPrompt}
	// The expected greedy text of each prompt, from a clean standalone server.
	sa := harness.StartWith(t, harness.Options{Binary: faultsBinary(t)}, "--kv-poison")
	want := map[string]string{}
	for _, p := range prompts {
		code, _, body := harness.Post(t, sa.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":24,"temperature":0}`, p))
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if code != 200 || json.Unmarshal(body, &c) != nil {
			t.Fatalf("reference for %q: %d %s", p, code, body)
		}
		want[p] = c.Choices[0].Text
	}
	_ = sa.Stop()

	faultMix := "drop=0.01,duplicate=0.05,reorder=0.05,corrupt=0.01,wrong_page=0.01,short_write=0.02,over_claim=0.02,wrong_epoch=0.02,lost_drained=0.1,delay=3ms,delay_p=0.1"
	c := startCluster(t, setup{prefill: 2, decode: 2, prefillFaults: "seed=11," + faultMix,
		workerArgs: []string{"--page-size", "4", "--chunked-prefill-size", "16"}})

	var mu sync.Mutex
	var exact, failed, cut int
	sem := make(chan struct{}, 12)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		p := prompts[rng.IntN(len(prompts))]
		stream := rng.IntN(2) == 0
		cutAfter := time.Duration(0)
		if rng.IntN(8) == 0 {
			cutAfter = time.Duration(1+rng.IntN(30)) * time.Millisecond
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			text, ok, wasCut := chaosRequest(c.Router.URL, p, stream, cutAfter)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case wasCut:
				cut++
			case !ok:
				failed++
			case text == want[p]:
				exact++
			default:
				t.Errorf("prompt %q: a 200 with the wrong text %q (want %q)", p, text, want[p])
			}
		}()
	}
	wg.Wait()
	t.Logf("chaos: %d requests: %d exact, %d errors, %d cut by their client", n, exact, failed, cut)
	if exact < n/2 {
		t.Fatalf("only %d of %d requests succeeded", exact, n)
	}
	var v violations
	checkClean(t, c, &v)
	requireClean(t, v)
}

// chaosRequest returns the generated text and whether the request succeeded
// (200 and, when streamed, no error event and a [DONE]); wasCut reports a
// client-side cancel.
func chaosRequest(url, prompt string, stream bool, cutAfter time.Duration) (text string, ok, wasCut bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if cutAfter > 0 {
		time.AfterFunc(cutAfter, cancel)
	}
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":24,"temperature":0,"stream":%v}`, prompt, stream)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", false, cutAfter > 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return "", false, false
	}
	if !stream {
		var c struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || len(c.Choices) != 1 {
			return "", false, cutAfter > 0
		}
		return c.Choices[0].Text, true, false
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		data, found := strings.CutPrefix(sc.Text(), "data: ")
		if !found {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var ch struct {
			Choices []struct{ Text string }   `json:"choices"`
			Error   *struct{ Message string } `json:"error"`
		}
		if json.Unmarshal([]byte(data), &ch) != nil || ch.Error != nil {
			return "", false, false
		}
		for _, c := range ch.Choices {
			text += c.Text
		}
	}
	if sc.Err() != nil {
		return "", false, cutAfter > 0
	}
	return text, done, false
}
