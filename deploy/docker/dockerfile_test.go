// Package docker holds baton's container image definition. No Docker is
// needed to test it: the tests read the Dockerfile and check it against
// the repository (Go version, make target, flags) and against what the
// image must be (non-root, baton as entrypoint, a health check).
package docker

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/batonlm/baton/test/harness"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

// stage is one FROM and what follows it.
type stage struct {
	from, name string
	ins        []instruction
}

func parse(t *testing.T) (args map[string]string, stages []*stage) {
	t.Helper()
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	args = map[string]string{}
	var cur *stage
	var line strings.Builder
	for raw := range strings.SplitSeq(string(b), "\n") {
		trimmed := strings.TrimSpace(raw)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && line.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			line.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		line.WriteString(trimmed)
		text := line.String()
		line.Reset()
		cmd, rest, _ := strings.Cut(text, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(rest)}
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(in.args)
			cur = &stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				cur.name = f[2]
			}
			stages = append(stages, cur)
		case cur == nil && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			args[k] = v
		case cur != nil:
			cur.ins = append(cur.ins, in)
		}
	}
	return args, stages
}

func (s *stage) all(cmd string) []string {
	var out []string
	for _, in := range s.ins {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

func TestDockerfile(t *testing.T) {
	args, stages := parse(t)
	byName := map[string]*stage{}
	for _, s := range stages {
		byName[s.name] = s
	}

	// The image builds with the Go release go.mod asks for.
	mod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if tc := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindSubmatch(mod); tc != nil {
		goVersion = tc
	}
	if goVersion == nil || args["GO_VERSION"] != string(goVersion[1]) {
		t.Errorf("ARG GO_VERSION=%s, go.mod wants Go %s", args["GO_VERSION"], goVersion[1])
	}

	// Build: the same make target as `make dist`.
	b := byName["build"]
	if b == nil {
		t.Fatal("no build stage")
	}
	if !slices.ContainsFunc(b.all("RUN"), func(r string) bool { return strings.Contains(r, "make -f deploy/dist.mk dist") }) {
		t.Error("the build stage does not run `make -f deploy/dist.mk dist`")
	}

	// Variants: a CPU image and one on NVIDIA's CUDA runtime, picked by
	// VARIANT, both with the libraries the binary links.
	if args["VARIANT"] != "cpu" {
		t.Errorf("ARG VARIANT=%q, want cpu by default", args["VARIANT"])
	}
	if !strings.HasPrefix(args["CUDA_IMAGE"], "nvidia/cuda:") || !strings.Contains(args["CUDA_IMAGE"], "-runtime-") {
		t.Errorf("CUDA_IMAGE=%q is not an NVIDIA CUDA runtime image", args["CUDA_IMAGE"])
	}
	for _, v := range []string{"cpu", "cuda"} {
		s := byName["runtime-"+v]
		if s == nil {
			t.Errorf("no runtime-%s stage", v)
			continue
		}
		run := strings.Join(s.all("RUN"), " ")
		for _, pkg := range []string{"libopenblas0", "libucx0", "curl"} {
			if !strings.Contains(run, pkg) {
				t.Errorf("runtime-%s does not install %s", v, pkg)
			}
		}
	}
	final := stages[len(stages)-1]
	if final.from != "runtime-${VARIANT}" {
		t.Errorf("the final stage is FROM %s, want runtime-${VARIANT}", final.from)
	}
	if !slices.Contains(final.all("COPY"), "--from=build /src/dist/ /usr/local/") {
		t.Errorf("the final stage copies %q; want what make dist made, into /usr/local", final.all("COPY"))
	}

	// Runs as a non-root user, baton as its entrypoint, with a health
	// check on the HTTP port.
	users := final.all("USER")
	if len(users) == 0 {
		t.Error("no USER: the image would run as root")
	} else if u, _, _ := strings.Cut(users[len(users)-1], ":"); u == "0" || u == "root" || strings.Trim(u, "0123456789") != "" {
		t.Errorf("USER %s: want a numeric non-root UID (runAsNonRoot can verify only a number)", users[len(users)-1])
	}
	var entry []string
	if e := final.all("ENTRYPOINT"); len(e) != 1 || json.Unmarshal([]byte(e[0]), &entry) != nil || !slices.Equal(entry, []string{"baton"}) {
		t.Errorf("ENTRYPOINT %s, want the exec form [\"baton\"]", strings.Join(e, " | "))
	}
	hc := final.all("HEALTHCHECK")
	if len(hc) != 1 || !strings.Contains(hc[0], "/health") || !strings.Contains(hc[0], "${BATON_PORT}") {
		t.Errorf("HEALTHCHECK %q, want one asking /health on BATON_PORT", hc)
	}

	// Every BATON_* the image sets is a flag of `baton serve` (an unknown
	// one would be ignored without a word).
	help, err := exec.Command(batonBinary(t), "serve", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("baton serve --help: %v\n%s", err, help)
	}
	for _, env := range final.all("ENV") {
		for _, kv := range strings.Fields(env) {
			k, _, _ := strings.Cut(kv, "=")
			if name, ok := strings.CutPrefix(k, "BATON_"); ok {
				flag := "--" + strings.ReplaceAll(strings.ToLower(name), "_", "-") + " "
				if !strings.Contains(string(help), flag) {
					t.Errorf("ENV %s: baton serve has no %s", k, flag)
				}
			}
		}
	}
}

// TestDistTarget checks what `make dist` runs, without the minute-long
// release build: a trimmed, versioned, cgo build into dist/.
func TestDistTarget(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	out, err := exec.Command("make", "-n", "-C", filepath.Join("..", ".."), "-f", "deploy/dist.mk", "dist", "VERSION=9.8.7", "DIST=/nonexistent/d").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n dist: %v\n%s", err, out)
	}
	for _, want := range []string{"CGO_ENABLED=1", "-trimpath", "-X main.version=9.8.7", "-o /nonexistent/d/bin/baton ./cmd/baton",
		"internal/bundled/LICENSE.md", "/nonexistent/d/bin/baton version"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("make dist does not run %q:\n%s", want, out)
		}
	}
}

func batonBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("BATON_TEST_BINARY"); p != "" {
		return p
	}
	return harness.Build(t, "")
}

func TestMain(m *testing.M) {
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}
