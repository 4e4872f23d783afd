package e2e

import (
	"encoding/json"
	"net/url"
	"slices"
	"testing"
)

// TestRouterFindsWorkersByDNS starts a router that knows its workers only
// by a name (localhost, from /etc/hosts) as it knows a headless Service's
// in Kubernetes: dns+http URLs expand to one worker per address.
func TestRouterFindsWorkersByDNS(t *testing.T) {
	d := startServer(t, "--role", "decode", "--kv-poison")
	p := startServer(t, "--role", "prefill", "--kv-poison")
	port := func(s string) string {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u.Port()
	}
	r := startServer(t, "--role", "router",
		"--prefill", "dns+http://localhost:"+port(p.URL), "--decode", "dns+http://localhost:"+port(d.URL))
	code, _, body := post(t, r.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8}`)
	if code != 200 {
		t.Fatalf("through DNS-found workers: %d %s", code, body)
	}
	var c completion
	if err := json.Unmarshal(body, &c); err != nil || len(c.Choices) != 1 || c.Choices[0].Text == "" {
		t.Fatalf("completion %s (%v)", body, err)
	}
	code, info := get(t, r.URL+"/server_info")
	if code != 200 {
		t.Fatalf("server_info: %d %s", code, info)
	}
	var si struct {
		Workers []struct {
			URL     string `json:"url"`
			Role    string `json:"role"`
			Healthy bool   `json:"healthy"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(info, &si); err != nil {
		t.Fatal(err)
	}
	// localhost may also have ::1, where nothing listens: listed, unhealthy.
	var healthy []string
	for _, w := range si.Workers {
		if w.Healthy {
			healthy = append(healthy, w.Role+" "+w.URL)
		}
	}
	slices.Sort(healthy)
	if want := []string{"decode " + d.URL, "prefill " + p.URL}; !slices.Equal(healthy, want) {
		t.Errorf("healthy workers %q, want %q (the name's 127.0.0.1 address)", healthy, want)
	}
}
