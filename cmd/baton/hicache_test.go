package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/batonlm/baton/internal/hicache"
)

// The tiers' flags are checked before anything loads: a policy or a
// backend baton does not know, a file store without its directory (or the
// other way round, or a key file without a file store), tiers under a
// prefix cache that is off, and the router, which holds no cache.
func TestHiCacheFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"--hicache-size", "1"}, ""},
		{[]string{"--hicache-size", "1", "--hicache-write-policy", "write_back"}, ""},
		{[]string{"--hicache-size", "1", "--hicache-write-policy", "write_around"}, "write_through or write_back"},
		{[]string{"--hicache-size", "-1"}, "must not be negative"},
		{[]string{"--hicache-storage-backend", "s3", "--hicache-storage-dir", "/tmp/x"}, "unknown --hicache-storage-backend"},
		{[]string{"--hicache-storage-backend", "file"}, "needs --hicache-storage-dir"},
		{[]string{"--hicache-storage-dir", "/tmp/x"}, "needs --hicache-storage-backend file"},
		{[]string{"--hicache-storage-backend", "file", "--hicache-storage-dir", "/tmp/x"}, ""},
		{[]string{"--hicache-storage-key-file", "/tmp/x.key"}, "--hicache-storage-key-file needs --hicache-storage-backend file"},
		{[]string{"--hicache-storage-backend", "file", "--hicache-storage-dir", "/tmp/x", "--hicache-storage-key-file", "/tmp/x.key"}, ""},
		{[]string{"--hicache-size", "1", "--disable-radix-cache"}, "which --disable-radix-cache turns off"},
		{[]string{"--role", "prefill", "--hicache-size", "1"}, ""},
		{[]string{"--role", "decode", "--hicache-size", "1"}, "need --disaggregation-decode-enable-radix-cache"},
		{[]string{"--role", "decode", "--hicache-size", "1", "--disaggregation-decode-enable-radix-cache"}, ""},
		{[]string{"--role", "router", "--hicache-size", "1"}, "hicache-size"},
	} {
		dryRun(t, c.args, c.err, "")
	}
}

// L3 as serve opens it: a file rewritten without the key is counted in
// the forged counter /metrics exports, and a refused key file is named by
// its flag.
func TestFileStoreForgedCounter(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "l3")
	meta := hicache.Meta{Fingerprint: "fp", Layout: "page 4", DType: "f32"}
	forged := prometheus.NewCounter(prometheus.CounterOpts{Name: "forged"})
	st, _, closer, err := openFileStore(dir, "", meta, 1<<20, forged)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Put([2]uint64{1, 2}, [16]byte{3}, make([]byte, 64), 5); err != nil {
		t.Fatal(err)
	}
	closer.Close()
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".kv") {
			files = append(files, p)
		}
		return err
	})
	if len(files) != 1 {
		t.Fatalf("page files: %v", files)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(files[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	st, _, closer, err = openFileStore(dir, "", meta, 1<<20, forged)
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	if _, ok := st.Get([2]uint64{1, 2}, [16]byte{3}, make([]byte, 64)); ok {
		t.Fatal("a rewritten payload was served")
	}
	var m dto.Metric
	if err := forged.Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Fatalf("forged counter %v (%v), want 1", m.GetCounter().GetValue(), err)
	}

	kf := filepath.Join(base, "loose.key")
	if err := os.WriteFile(kf, make([]byte, 32), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := openFileStore(filepath.Join(base, "other"), kf, meta, 1<<20, forged); err == nil || !strings.HasPrefix(err.Error(), "--hicache-storage-key-file: ") {
		t.Fatalf("a world-readable key file: %v, want an error naming --hicache-storage-key-file", err)
	}
}
