package bench

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// echoInstruction follows the text of an echo prompt; the text's first
// echoLead words come after it, as the start of the answer.
const (
	echoInstruction = "\n\nRepeat the text above exactly, word for word:\n\n"
	echoLead        = 8
)

// echoPrompt makes text an input-echoing request (the shape of "edit" or
// "summarise this" work, whose output copies the input): the text, an
// instruction to repeat it, and the repeat's first words. A model that
// follows the instruction copies the text, which speculative decoding
// drafts from the prompt.
func echoPrompt(text string) string {
	w := strings.Fields(text)
	return text + echoInstruction + strings.Join(w[:min(echoLead, len(w))], " ")
}

// specCounters reads the server's speculative decoding counters from its
// Prometheus /metrics (baton_spec_draft_tokens_total and
// baton_spec_accepted_tokens_total, summed over their labels); ok is
// false when the server exposes none.
func specCounters(ctx context.Context, client *http.Client, base, apiKey string) (drafted, accepted float64, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return 0, 0, false
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, false
	}
	defer drainClose(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return 0, 0, false
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, found := strings.Cut(line, " ")
		if !found || strings.HasPrefix(line, "#") {
			continue
		}
		name, _, _ = strings.Cut(name, "{")
		if i := strings.LastIndexByte(line, ' '); i >= 0 {
			rest = line[i+1:]
		}
		v, err := strconv.ParseFloat(rest, 64)
		if err != nil {
			continue
		}
		switch name {
		case "baton_spec_draft_tokens_total":
			drafted += v
			ok = true
		case "baton_spec_accepted_tokens_total":
			accepted += v
			ok = true
		}
	}
	return drafted, accepted, ok
}
