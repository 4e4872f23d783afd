package harness

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/metrics"
)

// Post sends a JSON body and returns status, headers and body; header holds
// name/value pairs.
func Post(t testing.TB, url, body string, header ...string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

// Get fetches a URL and returns status and body.
func Get(t testing.TB, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// Metrics scrapes a server's /metrics. Each baton_ series is keyed by name
// plus labels as printed, and each name alone holds the sum of its series.
func Metrics(t testing.TB, s *Server) map[string]float64 {
	t.Helper()
	code, body := Get(t, s.URL+"/metrics")
	if code != 200 {
		t.Fatalf("%s/metrics: %d", s.URL, code)
	}
	return metrics.ParseText(string(body))
}

// WaitPagesFree waits until no request holds a KV page of s: every page is
// back on the free list or kept in the prefix cache with no pin (cached
// pages are free for the taking: eviction hands them out).
func WaitPagesFree(t testing.TB, s *Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := Metrics(t, s)
		if m["baton_kv_pages_capacity"] > 0 && m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] == m["baton_kv_pages_capacity"] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: pages not released: free %v and cached %v of %v, quarantined %v", s.URL, m["baton_kv_pages_free"],
				m["baton_kv_pages_cached"], m["baton_kv_pages_capacity"], m["baton_kv_pages_quarantined"])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Cluster is a router with its prefill and decode workers, each a real
// process on loopback.
type Cluster struct {
	Router          *Server
	Prefill, Decode []*Server
}

// ClusterOptions configure StartCluster.
type ClusterOptions struct {
	Prefill, Decode int
	WorkerArgs      []string // both roles
	PrefillArgs     []string
	DecodeArgs      []string
	RouterArgs      []string
	PrefillEnv      []string // e.g. BATON_FAULTS for the writer
	DecodeEnv       []string
	Binary          string
	// NoRouter starts the workers only, for tests that start their own
	// routers in front of them.
	NoRouter bool
	// AutoKV: the workers keep their default KV dtype (Options.AutoKV).
	AutoKV bool
}

// StartCluster starts the workers (in parallel) and then the router.
func StartCluster(t *testing.T, o ClusterOptions) *Cluster {
	t.Helper()
	c := &Cluster{Prefill: make([]*Server, o.Prefill), Decode: make([]*Server, o.Decode)}
	var wg sync.WaitGroup
	start := func(dst **Server, env []string, args ...string) {
		defer wg.Done()
		*dst = StartWith(t, Options{Binary: o.Binary, Env: env, AutoKV: o.AutoKV}, args...)
	}
	for i := range c.Decode {
		wg.Add(1)
		go start(&c.Decode[i], o.DecodeEnv, append(append([]string{"--role", "decode", "--kv-poison"}, o.WorkerArgs...), o.DecodeArgs...)...)
	}
	for i := range c.Prefill {
		wg.Add(1)
		go start(&c.Prefill[i], o.PrefillEnv, append(append([]string{"--role", "prefill", "--kv-poison"}, o.WorkerArgs...), o.PrefillArgs...)...)
	}
	wg.Wait()
	for _, s := range append(append([]*Server{}, c.Prefill...), c.Decode...) {
		if s == nil || s.URL == "" {
			t.FailNow()
		}
	}
	if o.NoRouter {
		return c
	}
	args := []string{"--role", "router"}
	for _, p := range c.Prefill {
		args = append(args, "--prefill", p.URL)
	}
	for _, d := range c.Decode {
		args = append(args, "--decode", d.URL)
	}
	c.Router = StartWith(t, Options{Binary: o.Binary}, append(args, o.RouterArgs...)...)
	return c
}

// Workers lists the prefill then decode workers.
func (c *Cluster) Workers() []*Server { return append(append([]*Server{}, c.Prefill...), c.Decode...) }

// WaitClean waits until every worker has every page free and none in
// quarantine, and no release was refused as a double or wrong-owner release.
func (c *Cluster) WaitClean(t testing.TB) {
	t.Helper()
	for _, w := range c.Workers() {
		WaitPagesFree(t, w)
		m := Metrics(t, w)
		if q := m["baton_kv_pages_quarantined"]; q != 0 {
			t.Fatalf("%s: %v pages quarantined", w.URL, q)
		}
	}
}
