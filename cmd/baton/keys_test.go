package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/auth"
)

func runKeys(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := rootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append([]string{"keys", "derive"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// TestKeysDerive: the operator's path from one master secret to the file
// each role mounts, and serve taking each for its own role only.
func TestKeysDerive(t *testing.T) {
	dir := t.TempDir()
	master := filepath.Join(dir, "master")
	if err := os.WriteFile(master, []byte("0123456789abcdef0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "keys")
	got, err := runKeys(t, "--master", master, "--role", "all", "--out", out)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range auth.Roles {
		path := filepath.Join(out, string(r)+".key")
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", path, fi.Mode().Perm())
		}
		if !strings.Contains(got, path+": "+string(r)+" key ") {
			t.Errorf("output does not name %s: %q", path, got)
		}
		for _, role := range auth.Roles {
			f := &internalFlags{secretFile: path}
			err := f.check(string(role), "0.0.0.0")
			switch {
			case role == r && err != nil:
				t.Errorf("the %s key for --role %s: %v", r, role, err)
			case role != r && (err == nil || !strings.Contains(err.Error(), "holds the "+string(r)+" key")):
				t.Errorf("the %s key for --role %s: %v, want it refused", r, role, err)
			}
		}
	}
	// One role at a time gives the same file.
	one := filepath.Join(dir, "one")
	if _, err := runKeys(t, "--master", master, "--role", "prefill", "--out", one); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(out, "prefill.key"))
	b, _ := os.ReadFile(filepath.Join(one, "prefill.key"))
	if !bytes.Equal(a, b) {
		t.Error("deriving the prefill key alone gave another file")
	}
	if _, err := os.Stat(filepath.Join(one, "router.key")); err == nil {
		t.Error("--role prefill wrote the router's key too")
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--master", master, "--role", "admin", "--out", one}, "unknown role"},
		{[]string{"--master", filepath.Join(out, "router.key"), "--role", "all", "--out", one}, "role key file, not the master"},
		{[]string{"--master", filepath.Join(dir, "missing"), "--role", "all", "--out", one}, "--master"},
		{[]string{"--role", "all", "--out", one}, "needs --master"},
	} {
		if _, err := runKeys(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestMaxPagesPerPeer: by default one caller may hold half of a decode
// worker's pool, never all of it.
func TestMaxPagesPerPeer(t *testing.T) {
	fl := serveCmd().Flags().Lookup("max-pages-per-peer")
	if fl == nil || fl.DefValue != "50%" {
		t.Fatalf("--max-pages-per-peer default %v, want 50%%", fl)
	}
	var def peerPages
	if err := def.Set(fl.DefValue); err != nil {
		t.Fatal(err)
	}
	for _, total := range []int{1, 2, 128, 1001} {
		if got, want := def.of(total, 1), max(1, total/2); got != want {
			t.Errorf("default bound of a pool of %d pages: %d, want %d", total, got, want)
		}
	}
	// A request of the whole context is never refused by the share alone.
	if got := def.of(128, 96); got != 96 {
		t.Errorf("half of 128 pages with 96-page requests: %d, want 96", got)
	}
	if got := def.of(128, 500); got != 128 {
		t.Errorf("a context longer than the pool: %d, want the pool, 128", got)
	}
	for _, tc := range []struct {
		in    string
		total int
		want  int
		bad   bool
	}{
		{"0", 100, 0, false},
		{"64", 100, 64, false},
		{"25%", 100, 25, false},
		{"100%", 100, 100, false},
		{"12.5%", 80, 10, false},
		{"0%", 100, 0, true},
		{"101%", 100, 0, true},
		{"-1", 100, 0, true},
		{"half", 100, 0, true},
	} {
		var v peerPages
		err := v.Set(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if !tc.bad && v.of(tc.total, 1) != tc.want {
			t.Errorf("%q of %d pages: %d, want %d", tc.in, tc.total, v.of(tc.total, 1), tc.want)
		}
	}
}
