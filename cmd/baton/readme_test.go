package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// flagRow is one row of the README's table of serve flags:
// | `--name` | roles | `default` or — | what |
var flagRow = regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| ([^|]+) \\| ([^|]+) \\|")

var readmeRoles = map[string]bool{"all": true, "standalone": true, "prefill": true, "decode": true, "router": true}

// The README's table of serve flags is the operator's reference: every
// flag `baton serve --help` shows is in it with its default, and every row
// names a flag that exists.
func TestREADMEFlagTable(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "### `baton serve` flags")
	if i < 0 {
		t.Fatal("README has no \"### `baton serve` flags\" section")
	}
	section := text[i:]
	if j := strings.Index(section[1:], "\n#"); j >= 0 {
		section = section[:j+1]
	}
	rows := map[string][2]string{}
	for _, line := range strings.Split(section, "\n") {
		m := flagRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("--%s is in the table twice", m[1])
		}
		rows[m[1]] = [2]string{strings.TrimSpace(m[2]), strings.TrimSpace(m[3])}
	}
	fs := serveCmd().Flags()
	// cobra adds --help at run time; it needs no row.
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		row, ok := rows[f.Name]
		if !ok {
			t.Errorf("--%s is in serve --help but not in the README's table", f.Name)
			return
		}
		want := "`" + f.DefValue + "`"
		if f.DefValue == "" || f.DefValue == "[]" {
			want = "—"
		}
		if row[1] != want {
			t.Errorf("--%s: the README says the default is %s, serve --help %s", f.Name, row[1], want)
		}
		var roles []string
		for _, r := range strings.Split(row[0], ",") {
			r, _, _ = strings.Cut(strings.TrimSpace(r), " ")
			if !readmeRoles[r] {
				t.Errorf("--%s: unknown role %q in the README's table", f.Name, r)
			}
			if r == "all" {
				roles = append(roles, allRoles...)
			} else {
				roles = append(roles, r)
			}
		}
		// The roles the README names are those serve accepts the flag on.
		accepted := slices.Clone(flagRoles[f.Name])
		slices.Sort(roles)
		slices.Sort(accepted)
		if !slices.Equal(roles, accepted) {
			t.Errorf("--%s: the README says roles %v, serve accepts it on %v", f.Name, roles, accepted)
		}
	})
	for name := range rows {
		if f := fs.Lookup(name); f == nil || f.Hidden {
			t.Errorf("the README's table lists --%s, which serve does not have", name)
		}
	}
	if len(rows) == 0 {
		t.Fatal("no rows in the README's table of serve flags")
	}
}
