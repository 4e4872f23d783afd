package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// Set at link time by `make build` and `make dist` (deploy/dist.mk):
//
//	-ldflags "-X main.version=v0.1.0 -X main.commit=35c97da -X main.date=2026-12-04T12:00:00Z"
//
// A plain `go build` sets none of them; the toolchain's own record of the
// checkout (vcs.revision, vcs.modified, vcs.time) fills in what it can, so
// a binary built either way says which source it came from.
var (
	version string
	commit  string
	date    string
)

// buildInfo is what `baton version` reports.
type buildInfo struct {
	Version string
	Commit  string
	Date    string // when it was built (link time only)
	// From the toolchain's record alone: the commit's own time (it has no
	// build time) and whether the checkout had uncommitted changes.
	Committed string
	Modified  bool
}

func (b buildInfo) String() string {
	s := "baton " + b.Version
	var extra []string
	if b.Commit != "" {
		c := "commit " + b.Commit
		if b.Modified {
			c += ", modified"
		}
		extra = append(extra, c)
	}
	if b.Committed != "" {
		extra = append(extra, "committed "+b.Committed)
	}
	if b.Date != "" {
		extra = append(extra, "built "+b.Date)
	}
	if len(extra) > 0 {
		s += " (" + strings.Join(extra, ", ") + ")"
	}
	return s
}

// currentBuild is this binary's build: the link-time values, and for each
// one left unset, the toolchain's.
func currentBuild() buildInfo {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return resolveBuild(version, commit, date, bi)
}

// resolveBuild prefers the link-time values, since only the Makefile knows
// the tag; the build record fills the gaps. Its Main.Version is a tag only
// for `go install module@version`; a local build says "(devel)" or a
// pseudo-version, which is still more than "dev".
func resolveBuild(version, commit, date string, bi *debug.BuildInfo) buildInfo {
	b := buildInfo{Version: version, Commit: commit, Date: date}
	if bi != nil {
		if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			b.Version = bi.Main.Version
		}
		var rev, when string
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if b.Commit == "" && rev != "" {
			b.Commit = rev[:min(len(rev), 12)]
			b.Committed = when
			b.Modified = modified
		}
	}
	if b.Version == "" {
		b.Version = "dev"
	}
	return b
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and build date",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), currentBuild()) },
	}
}
