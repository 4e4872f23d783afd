package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestHTTPSecurityFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--metrics-require-key"}, "needs --api-key"},
		{[]string{"--metrics-require-key", "--api-key", "k"}, ""},
		{[]string{"--role", "decode", "--metrics-require-key", "--api-key", "k"}, ""},
		{[]string{"--request-read-timeout", "0s"}, "must be positive"},
		{[]string{"--request-read-timeout", "5s"}, ""},
	} {
		cmd := serveCmd()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"--dry-run"}, c.args...))
		err := cmd.Execute()
		switch {
		case c.err == "" && err != nil:
			t.Errorf("%v: %v", c.args, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%v: error %v, want one saying %q", c.args, err, c.err)
		}
	}
}
