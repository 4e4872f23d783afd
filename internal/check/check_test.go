package check

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeMember serves /server_info with info.
func fakeMember(t *testing.T, info map[string]any) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/server_info" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(info)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestInternalPlaneRow(t *testing.T) {
	const insecure = "none (--insecure-internal: anyone who reaches the ports is trusted)"
	for _, tc := range []struct {
		name      string
		router    string
		seen      [2]string // internal_auth of prefill, decode in the router's view
		own       [2]string // what each worker's own /server_info says
		pass      bool
		evidence  string // in the evidence of the worker that decides
		whoDecide int    // 0 prefill, 1 decode, -1 the router
	}{
		{name: "mtls", router: "mtls", seen: [2]string{"mtls", "mtls"}, pass: true, evidence: "mutual TLS"},
		{name: "secret", router: "secret", seen: [2]string{"secret", "secret"}, pass: true, evidence: "not encrypted"},
		{name: "loopback", router: "none (loopback only)", seen: [2]string{"none (loopback only)", "none (loopback only)"}, pass: true, evidence: "loopback only"},
		{name: "insecure decode", router: "none (loopback only)", seen: [2]string{"none (loopback only)", insecure}, whoDecide: 1, evidence: "--insecure-internal"},
		{name: "unreached, other mode", router: "mtls", seen: [2]string{"mtls", ""}, own: [2]string{"", "secret"}, whoDecide: 1, evidence: "DIFFERS"},
		{name: "unreached, silent", router: "mtls", seen: [2]string{"", "mtls"}, evidence: "DOES NOT SAY"},
		{name: "insecure router", router: insecure, seen: [2]string{insecure, insecure}, whoDecide: -1, evidence: "UNAUTHENTICATED"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var workers []map[string]any
			var urls []string
			for i, role := range []string{"prefill", "decode"} {
				w := fakeMember(t, map[string]any{"role": role, "internal_auth": tc.own[i]})
				urls = append(urls, w.URL)
				workers = append(workers, map[string]any{"url": w.URL, "role": role, "internal_auth": tc.seen[i], "healthy": tc.seen[i] != ""})
			}
			r := fakeMember(t, map[string]any{"role": "router", "model": "m", "internal_auth": tc.router, "workers": workers})
			c := &checker{o: Options{Router: r.URL, Client: http.DefaultClient}}
			if err := c.discover(context.Background()); err != nil {
				t.Fatal(err)
			}
			row := c.internalPlane(context.Background())
			if row.Gate != "internal plane" || row.Pass != tc.pass || len(row.Evidence) != 3 {
				t.Fatalf("row %+v, want pass %v with three lines", row, tc.pass)
			}
			line, who := row.Evidence[1+tc.whoDecide], r.URL
			if tc.whoDecide >= 0 {
				who = urls[tc.whoDecide]
			}
			if !strings.Contains(line, who) || !strings.Contains(line, tc.evidence) {
				t.Fatalf("evidence %q does not name %s and say %q", line, who, tc.evidence)
			}
		})
	}
}
