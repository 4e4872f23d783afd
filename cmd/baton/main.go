// Command baton is the inference server: every role (standalone, prefill,
// decode, router) is this one binary.
package main

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	if err := rootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "baton:", err)
		os.Exit(1)
	}
}

func rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "baton",
		Short:         "Disaggregated prefill/decode LLM inference server",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), versionCmd(), envCmd(), checkCmd(), modelCmd(), benchCmd(), keysCmd(), planCmd(), simCmd())
	return root
}

// applyEnv sets every flag the command line left alone from BATON_<FLAG_NAME>
// (dashes become underscores), so containers can configure by environment.
func applyEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || partnerChanged(fs, f.Name) {
			return
		}
		key := envKey(f.Name)
		if v, ok := os.LookupEnv(key); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", key, v, e)
			}
		}
	})
	return err
}

// envNotFlags are BATON_ variables read by other means than a flag: fault
// injection in test builds, the test harnesses', and the cpu backend's
// switches of its AVX-512 and VNNI paths.
var envNotFlags = []string{"BATON_FAULTS", "BATON_GUARDS_OFF", "BATON_TEST_BINARY", "BATON_REQUIRE_GPU", "BATON_CHAOS_REQUESTS", "BATON_CUDA_CHILD",
	"BATON_CPU_AVX512", "BATON_CPU_VNNI"}

func envKey(flag string) string {
	return "BATON_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// unknownEnv lists the BATON_ variables of environ that set no flag of any
// command and are read by nothing else, each with the nearest flag's
// variable when one is close: a misspelled variable otherwise leaves its
// setting at the default without a word.
func unknownEnv(environ []string) []string {
	known := map[string]bool{}
	for _, n := range envNotFlags {
		known[n] = true
	}
	var keys []string
	for _, c := range rootCmd().Commands() {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if k := envKey(f.Name); !known[k] {
				known[k] = true
				keys = append(keys, k)
			}
		})
	}
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "BATON_") || known[name] {
			continue
		}
		msg := name + " matches no flag"
		if near := nearest(name, keys); near != "" {
			msg += " (did you mean " + near + "?)"
		}
		out = append(out, msg)
	}
	slices.Sort(out)
	return out
}

// nearest is the key closest to name by edit distance, if it is close
// enough to be a likely misspelling.
func nearest(name string, keys []string) string {
	best, bestD := "", 0
	for _, k := range keys {
		if d := editDistance(name, k); best == "" || d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" || bestD > max(2, len(name)/4) {
		return ""
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// partnerChanged says whether the command line set name's other spelling
// (baton's or SGLang's, see sglangNames): the command line wins over the
// environment under either name.
func partnerChanged(fs *pflag.FlagSet, name string) bool {
	for _, n := range sglangNames {
		if (n[0] == name && fs.Changed(n[1])) || (n[1] == name && fs.Changed(n[0])) {
			return true
		}
	}
	return false
}
