package filestore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

var (
	metaA = Meta{Fingerprint: "fp-model-a", Layout: "L2 H4 D64 P16", DType: "f16"}
	metaB = Meta{Fingerprint: "fp-model-a", Layout: "L2 H4 D64 P16", DType: "q8_0"}
	saltX = [16]byte{1, 2, 3}
	saltY = [16]byte{9, 9, 9}
)

// pageOf is the page stored under key in these tests: its bytes follow
// from the key, so a reader can tell whose page it got.
func pageOf(key [2]uint64, n int) []byte {
	r := rand.New(rand.NewPCG(key[0], key[1]))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sumOf(key [2]uint64) uint64 { return key[0]*31 + key[1] + 7 }

func keyN(i int) [2]uint64 { return [2]uint64{uint64(i)*0x9e3779b97f4a7c15 + 1, uint64(i)} }

func mustOpen(t testing.TB, dir string, m Meta, capacity int64) *Store {
	t.Helper()
	s, err := Open(dir, m, capacity)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustPut(t testing.TB, s *Store, key [2]uint64, salt [16]byte, n int) {
	t.Helper()
	if err := s.Put(key, salt, pageOf(key, n), sumOf(key)); err != nil {
		t.Fatal(err)
	}
}

// wantHit checks that Get returns the page written under key.
func wantHit(t testing.TB, s *Store, key [2]uint64, salt [16]byte, n int) {
	t.Helper()
	dst := make([]byte, n)
	sum, ok := s.Get(key, salt, dst)
	if !ok {
		t.Fatalf("Get %x: miss, stats %+v", key, s.Stats())
	}
	if sum != sumOf(key) || !bytes.Equal(dst, pageOf(key, n)) {
		t.Fatalf("Get %x: wrong page or checksum", key)
	}
}

// wantMiss checks that Get misses and leaves in dst nothing read from the
// file: dst is either untouched or zeroed.
func wantMiss(t testing.TB, s *Store, key [2]uint64, salt [16]byte, n int) {
	t.Helper()
	dst := bytes.Repeat([]byte{0xAA}, n)
	sum, ok := s.Get(key, salt, dst)
	if ok || sum != 0 {
		t.Fatalf("Get %x: ok=%v sum=%x, want a miss", key, ok, sum)
	}
	if !bytes.Equal(dst, bytes.Repeat([]byte{0xAA}, n)) && !bytes.Equal(dst, make([]byte, n)) {
		t.Fatalf("Get %x: a miss left file data in dst", key)
	}
}

func TestRoundTrip(t *testing.T) {
	s := mustOpen(t, t.TempDir(), metaA, 1<<20)
	defer s.Close()
	k := keyN(1)
	mustPut(t, s, k, saltX, 4096)
	if !s.Has(k) || s.Has(keyN(2)) {
		t.Fatal("Has is wrong")
	}
	wantHit(t, s, k, saltX, 4096)
	wantMiss(t, s, keyN(2), saltX, 4096)

	// Content-addressed: a second Put of the key changes nothing.
	if err := s.Put(k, saltX, make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	wantHit(t, s, k, saltX, 4096)

	st := s.Stats()
	want := Stats{Hits: 2, Misses: 1, Written: 1, Bytes: int64(headerLen(metaA) + 4096)}
	if st != want {
		t.Fatalf("stats %+v, want %+v", st, want)
	}
}

func TestWrongSizeIsAMissNotCorrupt(t *testing.T) {
	s := mustOpen(t, t.TempDir(), metaA, 1<<20)
	defer s.Close()
	k := keyN(1)
	mustPut(t, s, k, saltX, 256)
	wantMiss(t, s, k, saltX, 255)
	wantMiss(t, s, k, saltX, 257)
	if st := s.Stats(); st.Corrupt != 0 || st.Misses != 2 {
		t.Fatalf("stats %+v", st)
	}
	wantHit(t, s, k, saltX, 256)
}

func TestRestartReuse(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, metaA, 1<<20)
	for i := range 20 {
		mustPut(t, s, keyN(i), saltX, 1000+i)
	}
	bytesBefore := s.Stats().Bytes
	if _, err := Open(dir, metaA, 1<<20); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open of the same dir and Meta: %v, want ErrLocked", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(keyN(99), saltX, []byte{1}, 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close: %v", err)
	}

	s = mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	if st := s.Stats(); st.Bytes != bytesBefore || st.Corrupt != 0 || st.Foreign != 0 {
		t.Fatalf("after restart: stats %+v, want Bytes %d", st, bytesBefore)
	}
	for i := range 20 {
		if !s.Has(keyN(i)) {
			t.Fatalf("key %d not indexed after restart", i)
		}
		wantHit(t, s, keyN(i), saltX, 1000+i)
	}
}

func TestTemporaryFilesOfACrashAreRemoved(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, metaA, 1<<20)
	k := keyN(3)
	mustPut(t, s, k, saltX, 100)
	tmp := filepath.Join(dir, s.tmpName(keyN(4)))
	s.Close()
	if err := os.MkdirAll(filepath.Dir(tmp), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmp, []byte("half a page"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	if _, err := os.Lstat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temporary file survived Open: %v", err)
	}
	if s.Has(keyN(4)) {
		t.Fatal("a temporary file was indexed")
	}
	wantHit(t, s, k, saltX, 100)
}

// damage changes the file of key in place, with the store open (caught at
// Get) and, after a reopen, at Open; either way it must be a counted miss
// and the file must go.
// Open catches what atOpen says (header or length damage) before any Get.
func checkDamage(t *testing.T, what string, atOpen func(off int) bool, damage func(path string, off int)) {
	dir := t.TempDir()
	const n = 64
	k := keyN(5)
	s := mustOpen(t, dir, metaA, 1<<20)
	defer func() { s.Close() }()
	p := filepath.Join(dir, s.name(k))
	size := headerLen(metaA) + n

	for off := range size {
		// At Get.
		mustPut(t, s, k, saltX, n)
		damage(p, off)
		before := s.Stats()
		wantMiss(t, s, k, saltX, n)
		after := s.Stats()
		if after.Corrupt != before.Corrupt+1 || after.Misses != before.Misses+1 {
			t.Fatalf("%s at %d: stats %+v -> %+v, want one more Corrupt and Miss", what, off, before, after)
		}
		if s.Has(k) || after.Bytes != 0 {
			t.Fatalf("%s at %d: still indexed", what, off)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s at %d: corrupt file not removed", what, off)
		}

		// At Open.
		mustPut(t, s, k, saltX, n)
		s.Close()
		damage(p, off)
		s = mustOpen(t, dir, metaA, 1<<20)
		// Open checks headers and lengths only; damage in the payload is
		// found by the first Get.
		if atOpen(off) && (s.Has(k) || s.Stats().Corrupt != 1) {
			t.Fatalf("%s at %d: not caught at Open: stats %+v", what, off, s.Stats())
		}
		wantMiss(t, s, k, saltX, n)
		st := s.Stats()
		if s.Has(k) || st.Corrupt != 1 || st.Bytes != 0 || st.Misses != 1 {
			t.Fatalf("%s at %d, reopened: Has=%v stats %+v", what, off, s.Has(k), st)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s at %d: corrupt file not removed after reopen", what, off)
		}
	}
}

func TestTruncationAtEveryOffsetIsAMiss(t *testing.T) {
	checkDamage(t, "truncate", func(int) bool { return true }, func(p string, off int) {
		if err := os.Truncate(p, int64(off)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestBitFlipAnywhereIsAMiss(t *testing.T) {
	checkDamage(t, "bit flip", func(off int) bool { return off < headerLen(metaA) }, func(p string, off int) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[off] ^= 1 << (off % 8)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
}

func TestTrailingBytesAreAMiss(t *testing.T) {
	checkDamage(t, "append", func(int) bool { return true }, func(p string, off int) {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.Write(make([]byte, 1+off%3)); err != nil {
			t.Fatal(err)
		}
	})
}

func TestForeignMetaIsAMissAndKept(t *testing.T) {
	dir := t.TempDir()
	k := keyN(7)
	a := mustOpen(t, dir, metaA, 1<<20)
	mustPut(t, a, k, saltX, 512)
	a.Close()

	// Another dtype on the same directory: A's page is not B's.
	b := mustOpen(t, dir, metaB, 1<<20)
	if st := b.Stats(); st.Foreign != 1 || st.Bytes != 0 {
		t.Fatalf("B at Open: stats %+v, want Foreign 1", st)
	}
	if b.Has(k) {
		t.Fatal("B indexed A's page")
	}
	wantMiss(t, b, k, saltX, 512)
	// B writes its own page under the same key; A's file stays.
	if err := b.Put(k, saltX, bytes.Repeat([]byte{0xBB}, 512), 1); err != nil {
		t.Fatal(err)
	}
	b.Close()

	a = mustOpen(t, dir, metaA, 1<<20)
	defer a.Close()
	if st := a.Stats(); st.Foreign != 1 {
		t.Fatalf("A reopened: stats %+v, want Foreign 1 (B's page)", st)
	}
	wantHit(t, a, k, saltX, 512)

	// A file of B under A's name (copied by hand) is refused at Get as
	// foreign, and left on disk.
	b = mustOpen(t, dir, metaB, 1<<20)
	defer b.Close()
	bf, err := os.ReadFile(filepath.Join(dir, b.name(k)))
	if err != nil {
		t.Fatal(err)
	}
	ap := filepath.Join(dir, a.name(k))
	if err := os.WriteFile(ap, bf, 0o600); err != nil {
		t.Fatal(err)
	}
	before := a.Stats()
	wantMiss(t, a, k, saltX, 512)
	after := a.Stats()
	if after.Foreign != before.Foreign+1 || after.Corrupt != before.Corrupt || a.Has(k) {
		t.Fatalf("B's bytes under A's name: stats %+v -> %+v", before, after)
	}
	if _, err := os.Stat(ap); err != nil {
		t.Fatalf("foreign file removed: %v", err)
	}
}

func TestWrongSaltIsAMiss(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	k := keyN(8)
	mustPut(t, s, k, saltX, 300)
	wantMiss(t, s, k, saltY, 300)
	if st := s.Stats(); st.Misses != 1 || st.Corrupt != 0 || st.Foreign != 0 {
		t.Fatalf("stats %+v", st)
	}
	// Another tenant's Put of a colliding key does not replace the page.
	if err := s.Put(k, saltY, pageOf(keyN(9), 300), 0); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, s, k, saltY, 300)
	wantHit(t, s, k, saltX, 300)
}

func TestEvictionOrder(t *testing.T) {
	dir := t.TempDir()
	const n = 1000
	fileSize := int64(headerLen(metaA) + n)
	s := mustOpen(t, dir, metaA, 4*fileSize)
	for i := 1; i <= 4; i++ {
		mustPut(t, s, keyN(i), saltX, n)
	}
	wantHit(t, s, keyN(1), saltX, n) // 1 is now the most recent
	mustPut(t, s, keyN(5), saltX, n) // evicts 2
	present := func(want ...int) {
		t.Helper()
		in := map[int]bool{}
		for _, i := range want {
			in[i] = true
		}
		for i := 1; i <= 8; i++ {
			_, err := os.Stat(filepath.Join(dir, s.name(keyN(i))))
			if s.Has(keyN(i)) != in[i] || (err == nil) != in[i] {
				t.Fatalf("key %d: Has=%v file err=%v, want present=%v", i, s.Has(keyN(i)), err, in[i])
			}
		}
	}
	present(1, 3, 4, 5)
	mustPut(t, s, keyN(3), saltX, n) // a Put of a stored key is a use too
	mustPut(t, s, keyN(6), saltX, n) // evicts 4
	present(1, 3, 5, 6)
	if st := s.Stats(); st.Evicted != 2 || st.Bytes != 4*fileSize || st.Written != 6 {
		t.Fatalf("stats %+v", st)
	}
	if err := s.Put(keyN(7), saltX, make([]byte, 4*fileSize), 0); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("page over capacity: %v", err)
	}
	s.Close()

	// Reopened with room for two, it keeps the two most recently written
	// (by modification time; set here so equal clock ticks cannot tie).
	base := time.Now().Add(-time.Hour)
	for i, k := range []int{6, 1, 5, 3} {
		p := filepath.Join(dir, s.name(keyN(k)))
		if err := os.Chtimes(p, base, base.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	s = mustOpen(t, dir, metaA, 2*fileSize)
	defer s.Close()
	present(5, 3)
	if st := s.Stats(); st.Evicted != 2 || st.Bytes != 2*fileSize {
		t.Fatalf("reopened: stats %+v", st)
	}
}

func TestConcurrentPutGet(t *testing.T) {
	const (
		keys    = 64
		n       = 2048
		workers = 8
		ops     = 400
	)
	s := mustOpen(t, t.TempDir(), metaA, 32*int64(headerLen(metaA)+n))
	defer s.Close()
	var wg sync.WaitGroup
	var gets [workers]uint64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			dst := make([]byte, n)
			for range ops {
				k := keyN(r.IntN(keys))
				if r.IntN(2) == 0 {
					if err := s.Put(k, saltX, pageOf(k, n), sumOf(k)); err != nil {
						t.Error(err)
						return
					}
					continue
				}
				gets[w]++
				sum, ok := s.Get(k, saltX, dst)
				if ok && (sum != sumOf(k) || !bytes.Equal(dst, pageOf(k, n))) {
					t.Errorf("Get %x returned another page", k)
					return
				}
				s.Has(k)
				s.Stats()
			}
		}()
	}
	wg.Wait()
	var total uint64
	for _, g := range gets {
		total += g
	}
	st := s.Stats()
	if st.Hits+st.Misses != total || st.Corrupt != 0 || st.Foreign != 0 {
		t.Fatalf("stats %+v after %d gets", st, total)
	}
	if st.Bytes > 32*int64(headerLen(metaA)+n) || st.Evicted == 0 || st.Hits == 0 {
		t.Fatalf("stats %+v: want evictions, hits and Bytes within capacity", st)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestNoFDLeak(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("counts /proc/self/fd")
	}
	dir := t.TempDir()
	use := func() {
		s := mustOpen(t, dir, metaA, 40*int64(headerLen(metaA)+512))
		for i := range 200 {
			k := keyN(i % 60)
			mustPut(t, s, k, saltX, 512)
			s.Get(k, saltX, make([]byte, 512))
			s.Get(k, saltY, make([]byte, 512)) // wrong tenant
			s.Get(k, saltX, make([]byte, 10))  // wrong size
			s.Get(keyN(1000+i), saltX, make([]byte, 512))
			if i%7 == 0 { // corrupt, then read
				os.Truncate(filepath.Join(dir, s.name(k)), 30)
				s.Get(k, saltX, make([]byte, 512))
			}
		}
		if _, err := Open(dir, metaA, 1<<20); !errors.Is(err, ErrLocked) {
			t.Fatalf("second Open: %v", err)
		}
		b := mustOpen(t, dir, metaB, 1<<20) // scans A's files as foreign
		b.Close()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	use() // the runtime's own descriptors (poller) open on first use
	before := openFDs(t)
	for range 3 {
		use()
	}
	if after := openFDs(t); after != before {
		t.Fatalf("open descriptors: %d before, %d after", before, after)
	}
}

func TestNothingOutsideDir(t *testing.T) {
	for _, rel := range []bool{false, true} {
		t.Run(fmt.Sprintf("relative=%v", rel), func(t *testing.T) {
			base := t.TempDir()
			dir := filepath.Join(base, "store")
			outside := filepath.Join(base, "outside")
			for _, d := range []string{dir, outside} {
				if err := os.Mkdir(d, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			target := outside
			if rel {
				target = "../outside"
			}
			s := mustOpen(t, dir, metaA, 1<<20)
			defer s.Close()

			// A shard directory that is a symlink out of dir.
			k := keyN(11)
			shard := filepath.Dir(filepath.Join(dir, s.name(k)))
			if err := os.Symlink(target, shard); err != nil {
				t.Fatal(err)
			}
			if err := s.Put(k, saltX, pageOf(k, 100), 1); err == nil {
				t.Fatal("Put through a symlinked shard succeeded")
			}
			if s.Has(k) {
				t.Fatal("failed Put indexed")
			}

			// A page name and a temporary name that are symlinks out of dir.
			k2 := keyN(12)
			if keyHex(k2)[:2] == keyHex(k)[:2] {
				t.Fatal("test keys share a shard")
			}
			if err := os.Mkdir(filepath.Dir(filepath.Join(dir, s.name(k2))), 0o700); err != nil {
				t.Fatal(err)
			}
			for i, n := range []string{s.name(k2), s.tmpName(k2)} {
				tg := filepath.Join(outside, fmt.Sprint("f", i))
				if rel {
					tg = filepath.Join("../..", "outside", fmt.Sprint("f", i))
				}
				if err := os.Symlink(tg, filepath.Join(dir, n)); err != nil {
					t.Fatal(err)
				}
			}
			mustPut(t, s, k2, saltX, 100)
			wantHit(t, s, k2, saltX, 100)
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Fatalf("files written outside dir: %v", ents)
			}
			fi, err := os.Lstat(filepath.Join(dir, s.name(k2)))
			if err != nil || !fi.Mode().IsRegular() {
				t.Fatalf("page file is not a regular file: %v %v", fi, err)
			}

			// Reopening does not follow the symlinked shard either.
			s.Close()
			if err := os.WriteFile(filepath.Join(outside, "x"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
			s = mustOpen(t, dir, metaA, 1<<20)
			if _, err := os.Stat(filepath.Join(outside, "x")); err != nil {
				t.Fatal("Open removed a file outside dir")
			}
			wantHit(t, s, k2, saltX, 100)
		})
	}
}

func TestOpenRefusesBadArguments(t *testing.T) {
	if _, err := Open(t.TempDir(), metaA, 0); err == nil {
		t.Fatal("capacity 0 accepted")
	}
	long := metaA
	long.Layout = string(make([]byte, maxStringLen+1))
	if _, err := Open(t.TempDir(), long, 1<<20); err == nil {
		t.Fatal("over-long Meta accepted")
	}
	dir := filepath.Join(t.TempDir(), "a", "b")
	s := mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("dir: %v %v, want mode 0700", fi, err)
	}
}

func benchStore(b *testing.B) (*Store, []byte) {
	const n = 64 << 10
	s := mustOpen(b, b.TempDir(), metaA, 1<<40)
	b.Cleanup(func() { s.Close() })
	b.SetBytes(n)
	return s, pageOf(keyN(0), n)
}

// BenchmarkPut writes distinct 64 KiB pages (no fsync; into the page cache).
func BenchmarkPut(b *testing.B) {
	s, page := benchStore(b)
	i := 0
	for b.Loop() {
		if err := s.Put(keyN(i), saltX, page, 1); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// BenchmarkGet reads back 64 KiB pages with every check (from the page cache).
func BenchmarkGet(b *testing.B) {
	s, page := benchStore(b)
	const keys = 256
	for i := range keys {
		if err := s.Put(keyN(i), saltX, page, 1); err != nil {
			b.Fatal(err)
		}
	}
	dst := make([]byte, len(page))
	i := 0
	for b.Loop() {
		if _, ok := s.Get(keyN(i%keys), saltX, dst); !ok {
			b.Fatal("miss")
		}
		i++
	}
}

func TestFileOfAnotherKeyIsCorrupt(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, metaA, 1<<20)
	k1, k2 := keyN(21), keyN(22)
	mustPut(t, s, k1, saltX, 128)
	mustPut(t, s, k2, saltX, 128)
	b, err := os.ReadFile(filepath.Join(dir, s.name(k1)))
	if err != nil {
		t.Fatal(err)
	}
	// k1's intact file under k2's name, with the store open ...
	if err := os.WriteFile(filepath.Join(dir, s.name(k2)), b, 0o600); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, s, k2, saltX, 128)
	if st := s.Stats(); st.Corrupt != 1 || s.Has(k2) {
		t.Fatalf("stats %+v", st)
	}
	wantHit(t, s, k1, saltX, 128)
	// ... and at Open.
	s.Close()
	if err := os.WriteFile(filepath.Join(dir, s.name(k2)), b, 0o600); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	if st := s.Stats(); st.Corrupt != 1 || s.Has(k2) || !s.Has(k1) {
		t.Fatalf("reopened: stats %+v", st)
	}
}

// Close while Puts and Gets run: every Put that returned nil is on disk
// for the next Open, and no temporary file is left behind.
func TestCloseWaitsForPuts(t *testing.T) {
	dir := t.TempDir()
	for round := range 10 {
		s := mustOpen(t, dir, metaA, 1<<30)
		var (
			mu     sync.Mutex
			stored [][2]uint64
			wg     sync.WaitGroup
			start  = make(chan struct{})
		)
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; ; i++ {
					k := [2]uint64{uint64(round*1000+w*100+i)<<40 | 1, uint64(i)}
					err := s.Put(k, saltX, pageOf(k, 4096), sumOf(k))
					if errors.Is(err, ErrClosed) {
						return
					}
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					stored = append(stored, k)
					mu.Unlock()
					s.Get(k, saltX, make([]byte, 4096))
				}
			}()
		}
		close(start)
		for s.Stats().Written < 20 {
			runtime.Gosched()
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if filepath.Ext(p) == ".tmp" {
				t.Errorf("temporary file left after Close: %s", p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		s = mustOpen(t, dir, metaA, 1<<30)
		for _, k := range stored {
			if !s.Has(k) {
				t.Fatalf("round %d: a stored page is gone after Close", round)
			}
		}
		s.Close()
	}
}

// Files removed behind the store's back are misses, not errors, and the
// store writes them again.
func TestFilesRemovedFromOutside(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, metaA, 1<<20)
	defer s.Close()
	k := keyN(31)
	mustPut(t, s, k, saltX, 200)
	if err := os.RemoveAll(filepath.Dir(filepath.Join(dir, s.name(k)))); err != nil {
		t.Fatal(err)
	}
	wantMiss(t, s, k, saltX, 200)
	if st := s.Stats(); s.Has(k) || st.Bytes != 0 || st.Corrupt != 0 {
		t.Fatalf("after removal: Has=%v stats %+v", s.Has(k), st)
	}
	mustPut(t, s, k, saltX, 200)
	wantHit(t, s, k, saltX, 200)
}
