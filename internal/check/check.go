// Package check runs the four acceptance checks of the incident report
// against a live deployment, through its router and its workers' public
// endpoints: pool/context, reject/admission, transfer/read and
// lifetime/ownership; and it reports how the internal plane between them is
// authenticated, since an open one hands any request's KV to whoever reaches
// it, which none of the four can see from outside. It sends a handful of
// small requests and leaves the deployment as it found it.
package check

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/batonlm/baton/internal/metrics"
)

// Options say which deployment to check.
type Options struct {
	Router string // base URL, e.g. http://127.0.0.1:8000
	APIKey string
	Client *http.Client
	// Settle bounds the wait for pages to come back after the lifetime probe.
	Settle time.Duration
}

// Row is one gate's verdict with its evidence.
type Row struct {
	Gate     string
	Pass     bool
	Evidence []string
}

// Report is the outcome of a run.
type Report struct{ Rows []Row }

// OK reports whether every gate passed.
func (r *Report) OK() bool {
	for _, row := range r.Rows {
		if !row.Pass {
			return false
		}
	}
	return len(r.Rows) > 0
}

// Print writes the table.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GATE\tRESULT\tEVIDENCE")
	for _, row := range r.Rows {
		res := "PASS"
		if !row.Pass {
			res = "FAIL"
		}
		for i, e := range row.Evidence {
			if i == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", row.Gate, res, e)
			} else {
				fmt.Fprintf(tw, "\t\t%s\n", e)
			}
		}
		if len(row.Evidence) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t\n", row.Gate, res)
		}
	}
	tw.Flush()
}

type worker struct {
	URL  string `json:"url"`
	Role string `json:"role"`
	// InternalAuth is what the worker told the router over the control
	// plane; empty when the router has not reached it.
	InternalAuth string `json:"internal_auth"`
	Error        string `json:"error"`
}

type checker struct {
	o          Options
	model      string
	maxSeq     int
	routerAuth string
	workers    []worker
}

// Run checks the deployment behind o.Router.
func Run(ctx context.Context, o Options) (*Report, error) {
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 60 * time.Second}
	}
	if o.Settle <= 0 {
		o.Settle = 15 * time.Second
	}
	c := &checker{o: o}
	if err := c.discover(ctx); err != nil {
		return nil, err
	}
	rep := &Report{}
	rep.Rows = append(rep.Rows, c.poolContext(ctx), c.rejectPath(ctx), c.transferRead(ctx), c.lifetime(ctx), c.prefixTenants(ctx), c.internalPlane(ctx))
	return rep, nil
}

// do sends the key to workers as well as the router: a cluster shares one
// key, and workers keep /server_info (and, if asked, /metrics) behind it.
func (c *checker) do(ctx context.Context, method, url, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.o.APIKey)
	}
	resp, err := c.o.Client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (c *checker) discover(ctx context.Context) error {
	code, b, err := c.do(ctx, http.MethodGet, c.o.Router+"/server_info", "")
	if err != nil {
		return fmt.Errorf("router /server_info: %w", err)
	}
	if code != 200 {
		return fmt.Errorf("router /server_info: HTTP %d: %s", code, b)
	}
	var info struct {
		Role         string   `json:"role"`
		Model        string   `json:"model"`
		MaxSeq       int      `json:"effective_context_length"`
		InternalAuth string   `json:"internal_auth"`
		Workers      []worker `json:"workers"`
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return fmt.Errorf("router /server_info: %w", err)
	}
	if info.Role != "router" || len(info.Workers) == 0 {
		return fmt.Errorf("%s is not a baton router with workers (role %q, %d workers)", c.o.Router, info.Role, len(info.Workers))
	}
	c.model, c.maxSeq, c.routerAuth, c.workers = info.Model, info.MaxSeq, info.InternalAuth, info.Workers
	return nil
}

// metrics sums each baton_ metric of a worker over its labels.
func (c *checker) metrics(ctx context.Context, w worker) (map[string]float64, error) {
	code, b, err := c.do(ctx, http.MethodGet, w.URL+"/metrics", "")
	if err != nil || code != 200 {
		return nil, fmt.Errorf("%s/metrics: HTTP %d %v", w.URL, code, err)
	}
	return metrics.ParseText(string(b)), nil
}

// totals sums metrics over every worker of a role ("" for all).
func (c *checker) totals(ctx context.Context, role string) (map[string]float64, error) {
	sum := map[string]float64{}
	for _, w := range c.workers {
		if role != "" && w.Role != role {
			continue
		}
		m, err := c.metrics(ctx, w)
		if err != nil {
			return nil, err
		}
		for k, v := range m {
			sum[k] += v
		}
	}
	return sum, nil
}

func (c *checker) poolContext(ctx context.Context) Row {
	row := Row{Gate: "pool/context", Pass: true}
	for _, w := range c.workers {
		code, b, err := c.do(ctx, http.MethodGet, w.URL+"/server_info", "")
		var info struct {
			Context   int `json:"context_length"`
			Effective int `json:"effective_context_length"`
			Pool      int `json:"kv_pool_tokens"`
		}
		if err != nil || code != 200 || json.Unmarshal(b, &info) != nil {
			row.Pass = false
			row.Evidence = append(row.Evidence, fmt.Sprintf("%s %s: no /server_info (HTTP %d %v)", w.Role, w.URL, code, err))
			continue
		}
		ok := info.Effective > 0 && info.Effective <= info.Pool && info.Effective <= info.Context
		row.Pass = row.Pass && ok
		verdict := "admits only what the pool holds"
		if !ok {
			verdict = "ADMITS MORE THAN THE POOL HOLDS"
		}
		row.Evidence = append(row.Evidence, fmt.Sprintf("%s %s: context %d, pool %d tokens, effective max %d: %s",
			w.Role, w.URL, info.Context, info.Pool, info.Effective, verdict))
	}
	return row
}

func (c *checker) rejectPath(ctx context.Context) Row {
	row := Row{Gate: "reject/admission"}
	before, err := c.totals(ctx, "")
	if err != nil {
		return Row{Gate: row.Gate, Evidence: []string{err.Error()}}
	}
	// A prompt one token longer than the deployment can hold, as token ids so
	// its length does not depend on the tokenizer.
	ids := make([]string, c.maxSeq+1)
	ids[0] = "1"
	for i := 1; i < len(ids); i++ {
		ids[i] = "3"
	}
	body := fmt.Sprintf(`{"model":%q,"prompt":[%s],"max_tokens":1}`, c.model, strings.Join(ids, ","))
	code, b, err := c.do(ctx, http.MethodPost, c.o.Router+"/v1/completions", body)
	after, err2 := c.totals(ctx, "")
	if err != nil || err2 != nil {
		return Row{Gate: row.Gate, Evidence: []string{fmt.Sprint(err, err2)}}
	}
	var e struct {
		Error struct{ Type string } `json:"error"`
	}
	_ = json.Unmarshal(b, &e)
	d := func(k string) float64 { return after[k] - before[k] }
	row.Pass = code == 400 && e.Error.Type == "invalid_request_error" && d("baton_kv_reservations_total") == 0 &&
		d("baton_kv_transfer_sessions_total") == 0 && d("baton_requests_queued_total") == 0
	row.Evidence = []string{
		fmt.Sprintf("a %d-token prompt (effective max %d): HTTP %d %s", c.maxSeq+1, c.maxSeq, code, e.Error.Type),
		fmt.Sprintf("new reservations %v, transport sessions %v, queue entries %v", d("baton_kv_reservations_total"),
			d("baton_kv_transfer_sessions_total"), d("baton_requests_queued_total")),
	}
	return row
}

// prefixTenants checks that the prefix cache keeps tenants apart: two
// tenants (the run's API key with two cache_salt values, so that it works
// behind one --api-key) send the same new prompt; the second reads nothing
// of the first's pages, and the first again reads them (when the cache is
// on and the repeat reached the same worker) and answers the same.
func (c *checker) prefixTenants(ctx context.Context) Row {
	row := Row{Gate: "prefix cache/tenants"}
	nonce := time.Now().UnixNano()
	prompt := strings.Repeat(fmt.Sprintf("Check %d. Once upon a time there was a little girl named Lily who loved to play in the park. ", nonce), 3)
	ask := func(salt string) (int, string, int) {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":8,"temperature":0,"cache_salt":"baton-check-%s-%d"}`, c.model, prompt, salt, nonce)
		code, b, err := c.do(ctx, http.MethodPost, c.o.Router+"/v1/completions", body)
		if err != nil {
			return 0, "", 0
		}
		var r struct {
			Choices []struct{ Text string } `json:"choices"`
			Usage   struct {
				Details struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 {
			return code, "", 0
		}
		return code, r.Choices[0].Text, r.Usage.Details.CachedTokens
	}
	codeA, textA, _ := ask("a")
	codeB, textB, cachedB := ask("b")
	codeA2, textA2, cachedA2 := ask("a")
	row.Pass = codeA == 200 && codeB == 200 && codeA2 == 200 && cachedB == 0 && textA2 == textA && textB == textA
	row.Evidence = []string{
		fmt.Sprintf("another tenant's same prompt: HTTP %d, cached_tokens %d", codeB, cachedB),
		fmt.Sprintf("the same tenant again: HTTP %d, cached_tokens %d, same text %v", codeA2, cachedA2, textA2 == textA && textB == textA),
	}
	if cachedA2 == 0 {
		row.Evidence = append(row.Evidence, "no hit on the repeat: the prefix cache is off, or the repeat went to another prefill worker")
	}
	return row
}

// complete sends one greedy completion and returns its text.
func (c *checker) complete(ctx context.Context, prompt string, maxTokens int) (int, string) {
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"temperature":0}`, c.model, prompt, maxTokens)
	code, b, err := c.do(ctx, http.MethodPost, c.o.Router+"/v1/completions", body)
	if err != nil {
		return 0, ""
	}
	var r struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	if json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 {
		return code, ""
	}
	return code, r.Choices[0].Text
}

func (c *checker) transferRead(ctx context.Context) Row {
	row := Row{Gate: "transfer/read"}
	before, err := c.totals(ctx, "")
	if err != nil {
		return Row{Gate: row.Gate, Evidence: []string{err.Error()}}
	}
	const prompt = "Once upon a time"
	code1, t1 := c.complete(ctx, prompt, 16)
	code2, t2 := c.complete(ctx, prompt, 16)
	after, err := c.totals(ctx, "")
	if err != nil {
		return Row{Gate: row.Gate, Evidence: []string{err.Error()}}
	}
	d := func(k string) float64 { return after[k] - before[k] }
	row.Pass = code1 == 200 && code2 == 200 && t1 == t2 && t1 != "" && d("baton_handoff_failures_total") == 0 &&
		d("baton_kv_read_gate_failures_total") == 0 && after["baton_nan_logits_total"] == 0
	row.Evidence = []string{
		fmt.Sprintf("two greedy handoffs: HTTP %d and %d, same text: %v", code1, code2, t1 == t2 && t1 != ""),
		fmt.Sprintf("handoff failures %v (total %v), read gate failures %v, NaN logits %v, KV bytes moved %v",
			d("baton_handoff_failures_total"), after["baton_handoff_failures_total"], d("baton_kv_read_gate_failures_total"),
			after["baton_nan_logits_total"], d("baton_kv_transfer_bytes_total")),
	}
	return row
}

func (c *checker) lifetime(ctx context.Context) Row {
	row := Row{Gate: "lifetime/ownership"}
	before, err := c.totals(ctx, "")
	if err != nil {
		return Row{Gate: row.Gate, Evidence: []string{err.Error()}}
	}
	// A stream its client abandons after the first chunk: its pages must come back.
	sctx, cancel := context.WithCancel(ctx)
	body := fmt.Sprintf(`{"model":%q,"prompt":"Once upon a time","max_tokens":64,"stream":true,"ignore_eos":true}`, c.model)
	req, _ := http.NewRequestWithContext(sctx, http.MethodPost, c.o.Router+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if c.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.o.APIKey)
	}
	if resp, err := c.o.Client.Do(req); err == nil {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() && !strings.HasPrefix(sc.Text(), "data: {") {
		}
		cancel()
		resp.Body.Close()
	}
	cancel()
	deadline := time.Now().Add(c.o.Settle)
	var after map[string]float64
	for {
		after, err = c.totals(ctx, "")
		if err != nil {
			return Row{Gate: row.Gate, Evidence: []string{err.Error()}}
		}
		back := after["baton_kv_pages_quarantined"] <= before["baton_kv_pages_quarantined"] &&
			unheld(after) >= unheld(before)
		if back || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	// On a busy deployment other requests move the free count too: run the
	// check when it is quiet, or give pages longer with Settle.
	row.Pass = after["baton_kv_pages_quarantined"] <= before["baton_kv_pages_quarantined"] &&
		unheld(after) >= unheld(before) && after["baton_kv_release_errors"] == 0
	row.Evidence = []string{
		fmt.Sprintf("after an abandoned stream: quarantined pages %v (before %v), free or cached %v of %v (before %v)",
			after["baton_kv_pages_quarantined"], before["baton_kv_pages_quarantined"], unheld(after),
			after["baton_kv_pages_capacity"], unheld(before)),
		fmt.Sprintf("refused (double or wrong-owner) releases %v; late messages dropped %v; drains waited on %v",
			after["baton_kv_release_errors"], after["baton_late_messages_dropped_total"], after["baton_drain_wait_seconds_count"]),
	}
	return row
}

// The internal_auth values a member reports (auth.Plane.Describe).
const (
	planeMTLS     = "mtls"
	planeSecret   = "secret"
	planeLoopback = "none (loopback only)"
	planeInsecure = "none (--insecure-internal"
)

// planeVerdict judges one member's internal_auth: authenticated, or
// unauthenticated only where nothing but this host can reach it.
func planeVerdict(mode string) (bool, string) {
	switch {
	case mode == planeMTLS:
		return true, "mutual TLS"
	case mode == planeSecret:
		return true, "cluster secret (authenticated, not encrypted)"
	case mode == planeLoopback:
		return true, "unauthenticated, listening on loopback only"
	case strings.HasPrefix(mode, planeInsecure):
		return false, "UNAUTHENTICATED BEYOND LOOPBACK (--insecure-internal): whoever reaches its ports can read, write or abort any request's KV"
	case mode == "":
		return false, "DOES NOT SAY how its internal plane is authenticated"
	default:
		return false, "UNKNOWN internal plane authentication"
	}
}

// planeKind is the mode without its explanation: members of one kind only
// can talk to each other.
func planeKind(mode string) string {
	kind, _, _ := strings.Cut(mode, " ")
	return kind
}

// internalPlane reports how each member proves itself on the control and
// transfer ports, as the router's /server_info shows it. A worker the router
// has not reached is asked itself, and is judged on what it says.
func (c *checker) internalPlane(ctx context.Context) Row {
	row := Row{Gate: "internal plane", Pass: true}
	ok, verdict := planeVerdict(c.routerAuth)
	row.Pass = ok
	row.Evidence = append(row.Evidence, fmt.Sprintf("router %s: internal_auth %q: %s", c.o.Router, c.routerAuth, verdict))
	for _, w := range c.workers {
		mode, seen := w.InternalAuth, ""
		if mode == "" {
			mode = c.workerAuth(ctx, w)
			seen = " (from the worker: the router has not reached it"
			if w.Error != "" {
				seen += ": " + w.Error
			}
			seen += ")"
		}
		ok, verdict := planeVerdict(mode)
		if ok && c.routerAuth != "" && planeKind(mode) != planeKind(c.routerAuth) {
			ok, verdict = false, fmt.Sprintf("DIFFERS FROM THE ROUTER'S %q: they cannot talk", c.routerAuth)
		}
		row.Pass = row.Pass && ok
		row.Evidence = append(row.Evidence, fmt.Sprintf("%s %s: internal_auth %q: %s%s", w.Role, w.URL, mode, verdict, seen))
	}
	return row
}

// workerAuth is the internal_auth a worker's own /server_info reports, or
// "" when it cannot be had.
func (c *checker) workerAuth(ctx context.Context, w worker) string {
	code, b, err := c.do(ctx, http.MethodGet, w.URL+"/server_info", "")
	var info struct {
		InternalAuth string `json:"internal_auth"`
	}
	if err != nil || code != 200 || json.Unmarshal(b, &info) != nil {
		return ""
	}
	return info.InternalAuth
}

// unheld is how many pages no request holds: free, or kept by the prefix
// cache with no pin (eviction hands those out as if free).
func unheld(m map[string]float64) float64 {
	return m["baton_kv_pages_free"] + m["baton_kv_pages_cached"]
}
