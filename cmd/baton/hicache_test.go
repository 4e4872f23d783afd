package main

import "testing"

// The tiers' flags are checked before anything loads: a policy or a
// backend baton does not know, a file store without its directory (or the
// other way round), tiers under a prefix cache that is off, and the
// router, which holds no cache.
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
		{[]string{"--hicache-size", "1", "--disable-radix-cache"}, "which --disable-radix-cache turns off"},
		{[]string{"--role", "prefill", "--hicache-size", "1"}, ""},
		{[]string{"--role", "decode", "--hicache-size", "1"}, "need --disaggregation-decode-enable-radix-cache"},
		{[]string{"--role", "decode", "--hicache-size", "1", "--disaggregation-decode-enable-radix-cache"}, ""},
		{[]string{"--role", "router", "--hicache-size", "1"}, "hicache-size"},
	} {
		dryRun(t, c.args, c.err, "")
	}
}
