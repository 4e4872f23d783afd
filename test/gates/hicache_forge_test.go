package gates

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"

	"github.com/batonlm/baton/test/harness"
)

// The L3 forgery gate: whoever may write a worker's --hicache-storage-dir
// (but cannot read its key, kept beside it) rewrites the page files a
// standalone server left there, and the server is restarted over them. No
// forged KV may be read: the answer is the one computed in the first
// place, each forged file is counted in baton_hicache_forged_files_total and
// removed, and every page of the pool comes back.
//
// Two forgeries: a new payload with the checks recomputed as the version 1
// format kept them (plain xxh3 sums that anyone can recompute; that format
// served it), which the header MAC refuses at start; and a new payload
// behind an untouched header, which start-up indexes and the payload MAC
// refuses when the page is read.

func TestGateHiCacheForgedL3(t *testing.T) { requireClean(t, scenarioHiCacheForgedL3(t, "")) }

func scenarioHiCacheForgedL3(t *testing.T, guardsOff string) violations {
	var v violations
	dir := filepath.Join(t.TempDir(), "l3")
	start := func() *harness.Server {
		return startCached(t, guardsOff, "", "--max-total-tokens", "160",
			"--hicache-storage-backend", "file", "--hicache-storage-dir", dir)
	}
	stop := func(s *harness.Server) bool {
		if err := s.Stop(); err != nil {
			v.add("stop: %v", err)
			return false
		}
		return true
	}

	s := start()
	want := askAs(t, s, "alice", longPrompt, 16)
	if want.code != 200 || want.cached != 0 || want.text == "" {
		v.add("computing the prompt on a fresh directory: %d, %d cached: %s", want.code, want.cached, want.body)
		return v
	}
	if !stop(s) {
		return v
	}
	files := l3PageFiles(t, dir)
	if len(files) < 2 {
		v.add("the server left %d page files in its L3 directory, want the prompt's pages", len(files))
		return v
	}

	// 1. Each file's payload replaced by another page's KV (plausible, and
	// wrong here), with version 1's page checksum, payload sum and header
	// sum recomputed over it.
	payloads := make([][]byte, len(files))
	for i, f := range files {
		payloads[i] = payloadOf(t, f)
	}
	for i, f := range files {
		rewriteFile(t, f, func(b []byte) []byte {
			h := int(binary.LittleEndian.Uint32(b[8:]))
			b = append(b[:h], payloads[(i+1)%len(files)]...)
			binary.LittleEndian.PutUint64(b[h-32:], xxh3.Hash(b[h:]))
			binary.LittleEndian.PutUint64(b[h-16:], xxh3.Hash(b[h:]))
			binary.LittleEndian.PutUint64(b[h-8:], xxh3.Hash(b[:h-8]))
			return b
		})
	}
	s = start()
	m := harness.Metrics(t, s)
	if got := m["baton_hicache_forged_files_total"]; got != float64(len(files)) {
		v.add("rewritten headers: %v files counted forged at start, want %d", got, len(files))
	}
	for _, f := range files {
		if _, err := os.Stat(f); !errors.Is(err, fs.ErrNotExist) {
			v.add("forged file %s not removed at start (%v)", filepath.Base(f), err)
		}
	}
	got := askAs(t, s, "alice", longPrompt, 16)
	if got.code != 200 || got.text != want.text || got.cached != 0 {
		v.add("over forged files: %d %q with %d cached tokens, want %q computed: %s", got.code, got.text, got.cached, want.text, got.body)
	}
	checkL3Clean(t, s, &v)
	if !stop(s) {
		return v
	}

	// 2. The server wrote the pages again. Each payload replaced, header
	// untouched: indexed at start, refused when read.
	files = l3PageFiles(t, dir)
	if len(files) != len(payloads) {
		v.add("after the restart the server left %d page files, want %d", len(files), len(payloads))
		return v
	}
	for i, f := range files {
		payloads[i] = payloadOf(t, f)
	}
	forged := make(map[string][]byte, len(files))
	for i, f := range files {
		rewriteFile(t, f, func(b []byte) []byte {
			h := int(binary.LittleEndian.Uint32(b[8:]))
			return append(b[:h], payloads[(i+1)%len(files)]...)
		})
		forged[f], _ = os.ReadFile(f)
	}
	s = start()
	if m := harness.Metrics(t, s); m["baton_hicache_forged_files_total"] != 0 {
		v.add("intact headers: %v files counted forged at start, want 0 (found when read)", m["baton_hicache_forged_files_total"])
	}
	got = askAs(t, s, "alice", longPrompt, 16)
	if got.code != 200 || got.text != want.text {
		v.add("over forged payloads: %d %q, want %q computed: %s", got.code, got.text, want.text, got.body)
	}
	m = harness.Metrics(t, s)
	n := m["baton_hicache_forged_files_total"]
	if n == 0 || m["baton_hicache_load_failures_total"] == 0 || m["baton_hicache_loaded_bytes_total"] != 0 {
		v.add("forged payloads: %v counted forged, %v load failures, %v bytes loaded; want forged and failures > 0, nothing loaded",
			n, m["baton_hicache_load_failures_total"], m["baton_hicache_loaded_bytes_total"])
	}
	// A forged file read is removed (and its page, computed, may be
	// written again, sealed); the loads after the first failure read none.
	left := 0
	for f, b := range forged {
		if now, err := os.ReadFile(f); err == nil && bytes.Equal(now, b) {
			left++
		}
	}
	if float64(len(files)-left) != n {
		v.add("%d of %d forged files are gone or rewritten, but %v were counted forged", len(files)-left, len(files), n)
	}
	checkL3Clean(t, s, &v)
	return v
}

// checkL3Clean: nothing read before its load ended, and every page back.
func checkL3Clean(t *testing.T, s *harness.Server, v *violations) {
	t.Helper()
	if m := harness.Metrics(t, s); m["baton_kv_read_before_ready_total"] != 0 {
		v.add("%v reads of pages still loading", m["baton_kv_read_before_ready_total"])
	}
	checkStandaloneClean(t, s, v)
}

func l3PageFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && strings.HasSuffix(p, ".kv") {
			out = append(out, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// payloadOf is what follows the header of a page file: its length is at
// bytes 8 to 12 in every version.
func payloadOf(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	h := int(binary.LittleEndian.Uint32(b[8:]))
	if h > len(b) {
		t.Fatalf("%s: header of %d bytes in a file of %d", p, h, len(b))
	}
	return b[h:]
}

func rewriteFile(t *testing.T, p string, f func([]byte) []byte) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, f(b), 0o600); err != nil {
		t.Fatal(err)
	}
}
