package main

import (
	"slices"
	"testing"
)

// The CORS flags take vLLM's forms (a JSON list) and comma lists; by
// default every origin, method and header is allowed, without
// credentials, as in vLLM and SGLang. A broken list is refused at start,
// and the flags are refused on the worker roles, which serve no browser.
func TestCORSFlags(t *testing.T) {
	fs := serveCmd().Flags()
	def := func(name string) string { return fs.Lookup(name).DefValue }
	if d := def("allow-credentials"); d != "false" {
		t.Errorf("--allow-credentials defaults to %s", d)
	}
	for _, c := range []struct {
		origins string
		creds   bool
		want    []string
	}{
		{def("allowed-origins"), false, []string{"*"}},
		{`["https://a.example","https://b.example"]`, true, []string{"https://a.example", "https://b.example"}},
		{"https://a.example,https://b.example", false, []string{"https://a.example", "https://b.example"}},
	} {
		f := &serveFlags{allowedOrigins: c.origins, allowedMethods: def("allowed-methods"), allowedHeaders: def("allowed-headers"), allowCredentials: c.creds}
		got, err := f.cors()
		if err != nil || !slices.Equal(got.Origins, c.want) || got.Credentials != c.creds ||
			!slices.Equal(got.Methods, []string{"*"}) || !slices.Equal(got.Headers, []string{"*"}) {
			t.Errorf("%s: %+v %v", c.origins, got, err)
		}
	}
	dryRun(t, []string{"--allowed-origins", `["a",`}, "--allowed-origins", "")
	dryRun(t, []string{"--allow-credentials"}, "name the origins allowed", "")
	dryRun(t, []string{"--allow-credentials", "--allowed-origins", "https://a.example,*"}, "name the origins allowed", "")
	dryRun(t, []string{"--allow-credentials", "--allowed-origins", "https://a.example"}, "", "")
	dryRun(t, []string{"--role", "decode", "--allowed-origins", "*"}, "allowed-origins", "")
}
