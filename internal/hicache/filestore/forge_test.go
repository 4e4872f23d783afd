package filestore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zeebo/xxh3"
)

// legacyFile is a page file as version 1 wrote it, and as anyone could
// write it: its checks are plain xxh3 sums of its own bytes, and its
// tenant field is the caller's unkeyed hash.
func legacyFile(m Meta, salt [16]byte, key [2]uint64, page []byte, sum uint64) []byte {
	var b []byte
	b = append(b, magic...)
	b = binary.LittleEndian.AppendUint16(b, 1)
	b = binary.LittleEndian.AppendUint16(b, 0)
	n := prefixLen + 3*2 + len(m.Fingerprint) + len(m.Layout) + len(m.DType) + 16 + 16 + 4*8
	b = binary.LittleEndian.AppendUint32(b, uint32(n))
	for _, s := range [3]string{m.Fingerprint, m.Layout, m.DType} {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	b = append(b, salt[:]...)
	b = binary.LittleEndian.AppendUint64(b, key[0])
	b = binary.LittleEndian.AppendUint64(b, key[1])
	b = binary.LittleEndian.AppendUint64(b, sum)
	b = binary.LittleEndian.AppendUint64(b, uint64(len(page)))
	b = binary.LittleEndian.AppendUint64(b, xxh3.Hash(page))
	b = binary.LittleEndian.AppendUint64(b, xxh3.Hash(b))
	return append(b, page...)
}

// forgedPage is the attacker's KV: of the right length, not the page.
func forgedPage(n int) []byte { return bytes.Repeat([]byte{0x3c}, n) }

// A forgery rewrites the file at p (of key k, tenant saltX, n payload
// bytes) with what someone who may write the directory, but not read
// the key, can make. atOpen says whether Open catches it from the header
// alone; forged whether the MAC is what refuses it (a version 1 file is
// refused for its version, before any MAC).
type forgery struct {
	name           string
	atOpen, forged bool
	apply          func(t *testing.T, p string, k [2]uint64, n int)
}

func forgeries() []forgery {
	rewrite := func(t *testing.T, p string, f func([]byte) []byte) {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, f(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return []forgery{
		{
			// The attack on version 1: a new payload, and the page
			// checksum, payload sum and header sum where that format kept
			// them recomputed as plain xxh3.
			name: "payload replaced, xxh3 sums recomputed", atOpen: true, forged: true,
			apply: func(t *testing.T, p string, _ [2]uint64, n int) {
				rewrite(t, p, func(b []byte) []byte {
					// Version 1 ended its header with page checksum,
					// payload length, payload sum and header sum.
					h := int(binary.LittleEndian.Uint32(b[8:]))
					b = append(b[:h], forgedPage(n)...)
					binary.LittleEndian.PutUint64(b[h-32:], xxh3.Hash(b[h:]))
					binary.LittleEndian.PutUint64(b[h-16:], xxh3.Hash(b[h:]))
					binary.LittleEndian.PutUint64(b[h-8:], xxh3.Hash(b[:h-8]))
					return b
				})
			},
		},
		{
			name: "payload replaced, header kept", atOpen: false, forged: true,
			apply: func(t *testing.T, p string, _ [2]uint64, n int) {
				rewrite(t, p, func(b []byte) []byte {
					h := int(binary.LittleEndian.Uint32(b[8:]))
					return append(b[:h], forgedPage(n)...)
				})
			},
		},
		{
			// A whole, well-formed file of the attacker's own store.
			name: "sealed under another key", atOpen: true, forged: true,
			apply: func(t *testing.T, p string, k [2]uint64, n int) {
				dir := t.TempDir()
				other := mustOpen(t, dir, metaA, 1<<20)
				defer other.Close()
				if err := other.Put(k, saltX, forgedPage(n), xxh3.Hash(forgedPage(n))); err != nil {
					t.Fatal(err)
				}
				b, err := os.ReadFile(filepath.Join(dir, other.name(k)))
				if err != nil {
					t.Fatal(err)
				}
				rewrite(t, p, func([]byte) []byte { return b })
			},
		},
		{
			name: "version 1 file", atOpen: true, forged: false,
			apply: func(t *testing.T, p string, k [2]uint64, n int) {
				rewrite(t, p, func([]byte) []byte {
					return legacyFile(metaA, saltX, k, forgedPage(n), xxh3.Hash(forgedPage(n)))
				})
			},
		},
	}
}

// counter is an OnForged hook that counts.
type counter struct{ n atomic.Uint64 }

func (c *counter) opt() Option { return OnForged(func() { c.n.Add(1) }) }

// wantRefused checks that Get of k misses without any forged byte in dst,
// that the file went, and that the store counted it.
func wantRefused(t *testing.T, s *Store, p string, k [2]uint64, n int, f forgery, before Stats, hook *counter, hookBefore uint64) {
	t.Helper()
	dst := make([]byte, n)
	if sum, ok := s.Get(k, saltX, dst); ok || sum != 0 {
		t.Fatalf("%s: served (sum %x)", f.name, sum)
	}
	if bytes.Contains(dst, forgedPage(8)) {
		t.Fatalf("%s: the forged payload was left in dst", f.name)
	}
	checkRemoved(t, s, p, k, f, before, hook, hookBefore)
}

func checkRemoved(t *testing.T, s *Store, p string, k [2]uint64, f forgery, before Stats, hook *counter, hookBefore uint64) {
	t.Helper()
	st := s.Stats()
	wantForged := before.Forged
	if f.forged {
		wantForged++
	}
	if st.Corrupt != before.Corrupt+1 || st.Forged != wantForged {
		t.Fatalf("%s: stats %+v -> %+v, want one more Corrupt, Forged %d", f.name, before, st, wantForged)
	}
	if got := hook.n.Load(); got != hookBefore+(wantForged-before.Forged) {
		t.Fatalf("%s: OnForged called %d times, want %d", f.name, got-hookBefore, wantForged-before.Forged)
	}
	if s.Has(k) {
		t.Fatalf("%s: still indexed", f.name)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s: file not removed: %v", f.name, err)
	}
}

// With the store open, a page file rewritten by someone without the key
// is a miss, counted, and removed: never KV the caller could take for the
// page (version 1's plain checksums served the first of these).
func TestForgedFileIsAMiss(t *testing.T) {
	const n = 256
	for _, f := range forgeries() {
		t.Run(f.name, func(t *testing.T) {
			dir := t.TempDir()
			var hook counter
			s, err := Open(dir, metaA, 1<<20, hook.opt())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			k := keyN(41)
			mustPut(t, s, k, saltX, n)
			p := filepath.Join(dir, s.name(k))
			f.apply(t, p, k, n)
			wantRefused(t, s, p, k, n, f, s.Stats(), &hook, 0)
			// The page is written again, sealed, and served.
			mustPut(t, s, k, saltX, n)
			wantHit(t, s, k, saltX, n)
		})
	}
}

// After a restart: a forgery the header shows is removed at Open, before
// anyone asks for the page; one only the payload shows, at the first Get.
func TestForgedFileIsAMissAfterRestart(t *testing.T) {
	const n = 256
	for _, f := range forgeries() {
		t.Run(f.name, func(t *testing.T) {
			dir := t.TempDir()
			s := mustOpen(t, dir, metaA, 1<<20)
			k, other := keyN(42), keyN(43)
			mustPut(t, s, k, saltX, n)
			mustPut(t, s, other, saltX, n)
			p := filepath.Join(dir, s.name(k))
			s.Close()
			f.apply(t, p, k, n)

			var hook counter
			s, err := Open(dir, metaA, 1<<20, hook.opt())
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if f.atOpen {
				checkRemoved(t, s, p, k, f, Stats{}, &hook, 0)
				wantMiss(t, s, k, saltX, n)
			} else {
				if st := s.Stats(); !s.Has(k) || st.Corrupt != 0 {
					t.Fatalf("a file whose header is intact was refused at Open: %+v", st)
				}
				wantRefused(t, s, p, k, n, f, s.Stats(), &hook, 0)
			}
			wantHit(t, s, other, saltX, n)
		})
	}
}

// A version 1 file written for the same tenant, with every check of that
// format right (what the previous release left, or anyone could write):
// refused at Open and at Get, and removed.
func TestVersion1FilesAreRemoved(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, metaA, 1<<20)
	k := keyN(44)
	p := filepath.Join(dir, s.name(k))
	s.Close()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, legacyFile(metaA, saltX, k, pageOf(k, 128), sumOf(k)), 0o600); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	if st := s.Stats(); s.Has(k) || st.Corrupt != 1 || st.Forged != 0 || st.Bytes != 0 {
		t.Fatalf("version 1 file at Open: Has=%v stats %+v", s.Has(k), st)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("version 1 file not removed: %v", err)
	}
	wantMiss(t, s, k, saltX, 128)
}

// tenantField is the tenant as the file of k in s stores it.
func tenantField(t *testing.T, s *Store, dir string, k [2]uint64) [16]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, s.name(k)))
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := parseHeader(b, s.key)
	if err != nil {
		t.Fatal(err)
	}
	// Where version 1 kept the caller's hash: the bytes after the strings.
	off := prefixLen + 3*2 + len(metaA.Fingerprint) + len(metaA.Layout) + len(metaA.DType)
	if !bytes.Equal(b[off:off+16], h.tenant[:]) {
		t.Fatal("tenant field not where the layout says")
	}
	return h.tenant
}

// The tenant field is keyed: the same tenant's page in two stores (two
// keys) carries two unrelated tags, neither of them the caller's hash, so
// the files give no offline test of an API key; and two tenants of one
// store carry two tags, so that one's page is never served to the other.
func TestTenantFieldIsKeyed(t *testing.T) {
	d1, d2 := t.TempDir(), t.TempDir()
	s1, s2 := mustOpen(t, d1, metaA, 1<<20), mustOpen(t, d2, metaA, 1<<20)
	defer s1.Close()
	defer s2.Close()
	k, ky := keyN(51), keyN(52)
	mustPut(t, s1, k, saltX, 64)
	mustPut(t, s2, k, saltX, 64)
	mustPut(t, s1, ky, saltY, 64)
	a, b, y := tenantField(t, s1, d1, k), tenantField(t, s2, d2, k), tenantField(t, s1, d1, ky)
	switch {
	case a == b:
		t.Fatal("two store keys wrote the same tenant field for one tenant: it is not keyed")
	case a == saltX || b == saltX:
		t.Fatal("the caller's unkeyed tenant hash is in the file")
	case a == y:
		t.Fatal("two tenants have one tenant field")
	}
	wantMiss(t, s1, k, saltY, 64)
	wantMiss(t, s1, ky, saltX, 64)
	wantHit(t, s1, k, saltX, 64)
	wantHit(t, s1, ky, saltY, 64)

	// Tenant X's file under tenant Y's key name: refused, never served to Y.
	xb, err := os.ReadFile(filepath.Join(d1, s1.name(k)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d1, s1.name(ky)), xb, 0o600); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, s1, ky, saltY, 64)
}

// The default key file: DIR.key beside the directory, created mode 0600
// with KeyLen random bytes, and reused; refused, with the store, when
// others may read or write it, or it is not a regular file of KeyLen bytes.
func TestKeyFile(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "l3")
	kf := dir + ".key"
	if got, err := DefaultKeyFile(dir + "/"); err != nil || got != kf {
		t.Fatalf("DefaultKeyFile: %q %v, want %q", got, err, kf)
	}
	s := mustOpen(t, dir, metaA, 1<<20)
	k := keyN(61)
	mustPut(t, s, k, saltX, 64)
	s.Close()
	fi, err := os.Lstat(kf)
	if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 || fi.Size() != KeyLen {
		t.Fatalf("key file: %v %v, want a regular file of %d bytes, mode 0600", fi, err, KeyLen)
	}
	key, err := os.ReadFile(kf)
	if err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(base)
	if err != nil || len(ents) != 2 {
		t.Fatalf("beside the directory: %v %v, want the directory and its key only", ents, err)
	}
	if err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if b, _ := os.ReadFile(p); bytes.Contains(b, key) {
				t.Errorf("%s holds the key", p)
			}
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir, metaA, 1<<20) // the same key again
	wantHit(t, s, k, saltX, 64)
	s.Close()

	refused := func(what string) {
		t.Helper()
		if s, err := Open(dir, metaA, 1<<20); !errors.Is(err, ErrKeyFile) {
			if err == nil {
				s.Close()
			}
			t.Fatalf("%s: Open %v, want ErrKeyFile", what, err)
		}
	}
	for _, mode := range []os.FileMode{0o644, 0o604, 0o640, 0o620, 0o602} {
		if err := os.Chmod(kf, mode); err != nil {
			t.Fatal(err)
		}
		refused(mode.String())
	}
	if err := os.Chmod(kf, 0o400); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir, metaA, 1<<20) // read-only to its owner is fine
	wantHit(t, s, k, saltX, 64)
	s.Close()

	for what, content := range map[string][]byte{"short": key[:KeyLen-1], "long": append(key, 0), "zero": make([]byte, KeyLen)} {
		os.Remove(kf)
		if err := os.WriteFile(kf, content, 0o600); err != nil {
			t.Fatal(err)
		}
		refused(what)
	}
	os.Remove(kf)
	target := filepath.Join(base, "elsewhere")
	if err := os.WriteFile(target, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, kf); err != nil {
		t.Fatal(err)
	}
	refused("a symlink at the default place")
	os.Remove(kf)
	if err := os.Mkdir(kf, 0o700); err != nil {
		t.Fatal(err)
	}
	refused("a directory")
	os.Remove(kf)

	// Created again, it is another key: every file of the old one is
	// forged under it, and removed.
	s = mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	if st := s.Stats(); st.Forged != 1 || s.Has(k) {
		t.Fatalf("files of the previous key: stats %+v", st)
	}
}

// A key file named by the operator must exist, is never created, may be a
// symlink (a Kubernetes Secret's are) to a private regular file, and must
// not be inside the store directory.
func TestWithKeyFile(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "l3")
	kf := filepath.Join(base, "secret", "l3.key")
	if _, err := Open(dir, metaA, 1<<20, WithKeyFile(kf)); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("missing key file: %v", err)
	}
	if _, err := os.Stat(kf); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a named key file was created")
	}
	key := bytes.Repeat([]byte{7}, KeyLen)
	if err := os.MkdirAll(filepath.Dir(kf), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, key, 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link.key")
	if err := os.Symlink(kf, link); err != nil {
		t.Fatal(err)
	}
	s, err := Open(dir, metaA, 1<<20, WithKeyFile(link))
	if err != nil {
		t.Fatal(err)
	}
	k := keyN(71)
	mustPut(t, s, k, saltX, 64)
	s.Close()
	if _, err := os.Lstat(dir + ".key"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("the default key file was created beside a store given one")
	}
	s, err = Open(dir, metaA, 1<<20, WithKeyFile(kf))
	if err != nil {
		t.Fatal(err)
	}
	wantHit(t, s, k, saltX, 64)
	s.Close()

	if err := os.Chmod(kf, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, metaA, 1<<20, WithKeyFile(link)); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("group-readable key behind a symlink: %v", err)
	}
	inside := filepath.Join(dir, "l3.key")
	if err := os.WriteFile(inside, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, metaA, 1<<20, WithKeyFile(inside)); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("a key file inside the directory: %v", err)
	}
	if err := os.Symlink(inside, filepath.Join(base, "in.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, metaA, 1<<20, WithKeyFile(filepath.Join(base, "in.key"))); !errors.Is(err, ErrKeyFile) {
		t.Fatalf("a symlink to a key file inside the directory: %v", err)
	}
}

// Stores of two models starting at once over a fresh directory agree on
// one key: neither reads the other's key half written.
func TestKeyFileCreatedOnce(t *testing.T) {
	for range 20 {
		dir := filepath.Join(t.TempDir(), "l3")
		var (
			wg     sync.WaitGroup
			stores [2]*Store
			errs   [2]error
		)
		for i, m := range []Meta{metaA, metaB} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stores[i], errs[i] = Open(dir, m, 1<<20)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if *stores[0].key != *stores[1].key {
			t.Fatal("two stores of one directory took two keys")
		}
		stores[0].Close()
		stores[1].Close()
		ents, _ := os.ReadDir(filepath.Dir(dir))
		if len(ents) != 2 {
			t.Fatalf("beside the directory: %v, want it and its key (no temporary file)", ents)
		}
	}
}
