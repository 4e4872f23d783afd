// Package filestore is the L3 tier of the hierarchical KV cache: evicted
// prefix pages kept as files on local storage, so that they outlive the
// pool and the process.
//
// What it keeps (issue 18, "Integrity across restarts"): a page read back
// is byte for byte the page that was written, by the same model, layout
// and dtype, for the same tenant; anything else is a miss, counted, and
// never data the caller could take for a page.
//
// Against whoever may write the directory: every file is sealed with
// HMAC-SHA-256 under a store key kept outside it (header.go, seal.go), by
// default in DIR.key beside it, created mode 0600 at the first Open. A
// file that fails its MAC (forged, moved to another name, or damaged) is
// a miss, counted as Forged, and removed; the tenant is kept only as a
// keyed tag, so the files give no offline test of an API key. What the
// key cannot stop: reading the pages, deleting them, or filling the disk.
//
// One file per page, written to a temporary name and renamed, so a crash
// never leaves a half-written file under a page's name. Put does not fsync:
// this is a cache, and a file that a power loss leaves short or zeroed
// fails the length or checksum check on the next Get (or the header check
// at Open) and is dropped as corrupt. Skipping fsync keeps Put at memory
// speed on the eviction path.
//
// Names: DIR/<kk>/<key hex>-<meta hex>.kv, where kk is the first byte of
// the key in hex and meta hex is a hash of the Meta. Every name is built
// from hex digits only, and every access goes through an os.Root on DIR,
// so neither a key nor a symlink planted in DIR can reach outside it.
//
// Several models may share DIR: the Meta hash in the name keeps their
// files apart, each Store indexes, counts and evicts only its own, and
// another Meta's files are counted as Foreign at Open and left alone
// (they are another Store's to evict). Only one Store per (DIR, Meta) at a
// time: Open takes an exclusive lock file and fails if another Store
// holds it, so two workers never fight over one budget.
package filestore

import (
	"container/list"
	"crypto/hmac"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// Meta says what the pages of a store are: KV from another model, another
// page layout or another dtype is never read back as a page of this one.
type Meta struct {
	Fingerprint string // model fingerprint
	Layout      string // KV page layout description
	DType       string // kv cache dtype name
}

// Stats counts what the store did. Every Get is one Hit or one Miss;
// Corrupt and Foreign count files (at Open and at Get) and are part of the
// misses when a Get met them. Forged counts the corrupt files whose MAC
// did not verify under the store key. Bytes is what this store's files
// take on disk, headers included.
type Stats struct {
	Hits, Misses, Corrupt, Forged, Foreign, Written, Evicted uint64
	Bytes                                                    int64
}

// Errors.
var (
	ErrClosed   = errors.New("filestore: closed")
	ErrTooLarge = errors.New("filestore: page larger than the store's capacity")
	ErrLocked   = errors.New("filestore: directory in use by another store of the same model")
)

// Store is one model's pages in one directory. Safe for concurrent use.
type Store struct {
	root     *os.Root
	lock     *os.File
	key      *sealKey
	onForged func()
	meta     Meta
	metaHex  string
	hdrLen   int
	capacity int64

	mu      sync.Mutex
	closed  bool
	ops     sync.WaitGroup // Puts and Gets in flight; Close waits for them
	index   map[[2]uint64]*list.Element
	lru     list.List // of *entry, most recently used first
	pending map[[2]uint64]struct{}
	shards  [256]bool // shard directories known to exist
	st      Stats
}

type entry struct {
	key  [2]uint64
	size int64
}

// Option changes how Open sets a store up.
type Option func(*options)

type options struct {
	keyFile  string
	onForged func()
}

// WithKeyFile seals the files under the key in path (KeyLen bytes, mode
// 0600 or stricter, this user's or root's, outside dir), which must exist.
// Without it the key is DefaultKeyFile(dir), created if absent.
func WithKeyFile(path string) Option { return func(o *options) { o.keyFile = path } }

// OnForged has f called once for every file removed because its MAC did
// not verify (at Open and at Get), outside the store's lock. f must not
// block.
func OnForged(f func()) Option { return func(o *options) { o.onForged = f } }

// Open opens (creating it, mode 0700) the store in dir for pages of meta,
// holding at most capacityBytes of files. It indexes the files of meta
// already there (header and its MAC checked; payload checked at Get),
// removes those that are truncated, corrupt or forged and temporary files
// left by a crash, and evicts the least recently written if they exceed
// capacityBytes.
func Open(dir string, meta Meta, capacityBytes int64, opts ...Option) (*Store, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if capacityBytes <= 0 {
		return nil, fmt.Errorf("filestore: capacity %d: want > 0", capacityBytes)
	}
	for _, s := range [3]string{meta.Fingerprint, meta.Layout, meta.DType} {
		if len(s) > maxStringLen {
			return nil, fmt.Errorf("filestore: meta field of %d bytes: at most %d", len(s), maxStringLen)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("filestore: %w", err)
	}
	keyFile, create := o.keyFile, o.keyFile == ""
	if create {
		var err error
		if keyFile, err = DefaultKeyFile(dir); err != nil {
			return nil, err
		}
	}
	key, err := loadKey(dir, keyFile, create)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("filestore: %w", err)
	}
	s := &Store{
		root:     root,
		key:      key,
		onForged: o.onForged,
		meta:     meta,
		metaHex:  metaHash(meta),
		hdrLen:   headerLen(meta),
		capacity: capacityBytes,
		index:    make(map[[2]uint64]*list.Element),
		pending:  make(map[[2]uint64]struct{}),
	}
	if s.lock, err = lockFile(root, ".lock-"+s.metaHex); err != nil {
		root.Close()
		return nil, err
	}
	forged, err := s.scan()
	if err != nil {
		s.lock.Close()
		root.Close()
		return nil, err
	}
	s.reportForged(forged)
	s.mu.Lock()
	s.evictLocked()
	s.mu.Unlock()
	return s, nil
}

// metaHash names a Meta in file names: xxh3-64 of the length-prefixed
// strings, so ("ab","c") and ("a","bc") differ.
func metaHash(m Meta) string {
	var b []byte
	for _, s := range [3]string{m.Fingerprint, m.Layout, m.DType} {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	return fmt.Sprintf("%016x", xxh3.Hash(b))
}

func keyHex(key [2]uint64) string { return fmt.Sprintf("%016x%016x", key[0], key[1]) }

func (s *Store) name(key [2]uint64) string {
	k := keyHex(key)
	return k[:2] + "/" + k + "-" + s.metaHex + ".kv"
}

func (s *Store) tmpName(key [2]uint64) string {
	k := keyHex(key)
	return k[:2] + "/." + k + "-" + s.metaHex + ".tmp"
}

func (s *Store) reportForged(n uint64) {
	if s.onForged == nil {
		return
	}
	for range n {
		s.onForged()
	}
}

// scan indexes this Meta's files, oldest first by modification time, so
// that after a restart the least recently written go first. It returns
// how many it removed as forged.
func (s *Store) scan() (uint64, error) {
	top, err := readDir(s.root, ".")
	if err != nil {
		return 0, err
	}
	type found struct {
		key  [2]uint64
		size int64
		mod  time.Time
	}
	var all []found
	for _, d := range top {
		if len(d.Name()) != 2 || !isHex(d.Name()) || !d.IsDir() { // IsDir is false for a symlink
			continue
		}
		files, err := readDir(s.root, d.Name())
		if err != nil {
			return 0, err
		}
		for _, f := range files {
			p := d.Name() + "/" + f.Name()
			key, mh, tmp, ok := parseName(f.Name())
			if !ok || key[0]>>56 != mustHexByte(d.Name()) {
				continue // not a page file name, or in the wrong shard: not ours
			}
			if mh != s.metaHex {
				if !tmp {
					s.st.Foreign++
				}
				continue
			}
			if tmp {
				s.root.Remove(p) // a Put cut short by a crash; the lock says no Put is running
				continue
			}
			size, mod, out := s.checkFile(p, f, key)
			if out != hit {
				s.st.Corrupt++
				if out == forged {
					s.st.Forged++
				}
				s.root.Remove(p)
				continue
			}
			all = append(all, found{key, size, mod})
		}
	}
	slices.SortFunc(all, func(a, b found) int {
		if c := a.mod.Compare(b.mod); c != 0 {
			return c
		}
		return slices.Compare(a.key[:], b.key[:])
	})
	for _, f := range all {
		s.index[f.key] = s.lru.PushFront(&entry{key: f.key, size: f.size})
		s.st.Bytes += f.size
	}
	return s.st.Forged, nil
}

// checkFile reads the header of a file found at Open and says whether it
// is a page of this store (hit) whose length is right, forged (its header
// MAC fails), or corrupt. A foreign Meta under this Meta's name (a copied
// or altered file) is corrupt here.
func (s *Store) checkFile(p string, d fs.DirEntry, key [2]uint64) (int64, time.Time, outcome) {
	if !d.Type().IsRegular() {
		return 0, time.Time{}, corrupt
	}
	f, err := s.root.Open(p)
	if err != nil {
		return 0, time.Time{}, corrupt
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return 0, time.Time{}, corrupt
	}
	var buf [maxHeaderLen]byte
	h, n, err := readHeader(f, &buf, s.key)
	switch {
	case errors.Is(err, errForged):
		return 0, time.Time{}, forged
	case err != nil || h.meta != s.meta || h.key != key || int64(n)+int64(h.payloadLen) != fi.Size():
		return 0, time.Time{}, corrupt
	}
	return fi.Size(), fi.ModTime(), hit
}

func readDir(root *os.Root, p string) ([]fs.DirEntry, error) {
	d, err := root.Open(p)
	if err != nil {
		return nil, fmt.Errorf("filestore: %w", err)
	}
	defer d.Close()
	ents, err := d.ReadDir(-1)
	if err != nil {
		return nil, fmt.Errorf("filestore: %w", err)
	}
	return ents, nil
}

// parseName splits "<32 hex>-<16 hex>.kv" or ".<32 hex>-<16 hex>.tmp".
func parseName(n string) (key [2]uint64, metaHex string, tmp, ok bool) {
	switch {
	case strings.HasSuffix(n, ".kv"):
		n = n[:len(n)-3]
	case strings.HasPrefix(n, ".") && strings.HasSuffix(n, ".tmp"):
		n, tmp = n[1:len(n)-4], true
	default:
		return key, "", false, false
	}
	if len(n) != 32+1+16 || n[32] != '-' || !isHex(n[:32]) || !isHex(n[33:]) {
		return key, "", false, false
	}
	key[0], _ = strconv.ParseUint(n[:16], 16, 64)
	key[1], _ = strconv.ParseUint(n[16:32], 16, 64)
	return key, n[33:], tmp, true
}

// isHex accepts only the lower-case digits keyHex writes, so one key has
// one name.
func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

func mustHexByte(s string) uint64 {
	b, _ := hex.DecodeString(s)
	return uint64(b[0])
}

// readHeader reads exactly one header from r into buf and parses it.
func readHeader(r io.Reader, buf *[maxHeaderLen]byte, k *sealKey) (header, int, error) {
	if _, err := io.ReadFull(r, buf[:prefixLen]); err != nil {
		return header{}, 0, errShort
	}
	n, err := declaredLen(buf[:prefixLen])
	if err != nil {
		return header{}, 0, err
	}
	if _, err := io.ReadFull(r, buf[prefixLen:n]); err != nil {
		return header{}, 0, errShort
	}
	return parseHeader(buf[:n], k)
}

// Put stores page under key for the tenant saltHash, with the caller's
// checksum of it. A key already stored (or being stored) is left as it is:
// keys are content addresses.
func (s *Store) Put(key [2]uint64, saltHash [16]byte, page []byte, checksum uint64) error {
	size := int64(s.hdrLen) + int64(len(page))
	if size > s.capacity || len(page) > maxPayload {
		return ErrTooLarge
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if e, ok := s.index[key]; ok {
		s.lru.MoveToFront(e)
		s.mu.Unlock()
		return nil
	}
	if _, ok := s.pending[key]; ok {
		s.mu.Unlock()
		return nil
	}
	s.pending[key] = struct{}{}
	s.ops.Add(1)
	shard := byte(key[0] >> 56)
	haveShard := s.shards[shard]
	s.mu.Unlock()
	defer s.ops.Done()

	tmp, err := s.writeTemp(key, saltHash, page, checksum, haveShard)

	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, key)
	if err != nil {
		return err
	}
	s.shards[shard] = true
	if err := s.root.Rename(tmp, s.name(key)); err != nil {
		s.root.Remove(tmp)
		return fmt.Errorf("filestore: %w", err)
	}
	// Renaming under the lock keeps the index and the directory in step:
	// an eviction or a corrupt-file removal never unlinks a newer file.
	s.index[key] = s.lru.PushFront(&entry{key: key, size: size})
	s.st.Bytes += size
	s.st.Written++
	s.evictLocked()
	return nil
}

func (s *Store) writeTemp(key [2]uint64, saltHash [16]byte, page []byte, checksum uint64, haveShard bool) (string, error) {
	mkdir := func() error {
		if err := s.root.Mkdir(keyHex(key)[:2], 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("filestore: %w", err)
		}
		return nil
	}
	if !haveShard {
		if err := mkdir(); err != nil {
			return "", err
		}
	}
	h := header{
		meta:       s.meta,
		tenant:     s.key.tenant(saltHash),
		key:        key,
		pageSum:    checksum,
		payloadLen: uint64(len(page)),
	}
	hb := appendFields(make([]byte, 0, s.hdrLen), &h)
	pm := s.key.payloadMAC(hb)
	pm.Write(page)
	pm.Sum(h.payloadMAC[:0])
	hb = appendHeader(hb[:0], &h, s.key)
	tmp := s.tmpName(key)
	// O_EXCL never follows a symlink planted under the temporary name; a
	// stale temporary file (only ours can match) is removed once.
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrNotExist) && haveShard {
		// The shard directory was removed behind the store's back (an
		// operator clearing space): make it again.
		if err := mkdir(); err != nil {
			return "", err
		}
		f, err = s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if errors.Is(err, fs.ErrExist) {
		s.root.Remove(tmp)
		f, err = s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return "", fmt.Errorf("filestore: %w", err)
	}
	_, err = f.Write(hb)
	if err == nil {
		_, err = f.Write(page)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		s.root.Remove(tmp)
		return "", fmt.Errorf("filestore: %w", err)
	}
	return tmp, nil
}

// evictLocked removes least recently used files until the store fits its
// capacity.
func (s *Store) evictLocked() {
	for s.st.Bytes > s.capacity {
		back := s.lru.Back()
		if back == nil {
			return
		}
		e := back.Value.(*entry)
		s.dropLocked(back)
		s.root.Remove(s.name(e.key))
		s.st.Evicted++
	}
}

func (s *Store) dropLocked(el *list.Element) {
	e := el.Value.(*entry)
	s.lru.Remove(el)
	delete(s.index, e.key)
	s.st.Bytes -= e.size
}

// outcome of reading one file.
type outcome int

const (
	hit outcome = iota
	miss
	corrupt
	forged // corrupt, and its MAC failed
	foreign
	gone
)

// Get fills dst with the page stored under key for the tenant saltHash and
// returns the caller's checksum kept with it. ok is true only when the
// file is whole, of this store's Meta, for this key and tenant, len(dst)
// bytes long and both its MACs verify; otherwise dst is zeroed (whatever
// was read into it is not left there) and the miss is counted. Corrupt
// and forged files are removed.
func (s *Store) Get(key [2]uint64, saltHash [16]byte, dst []byte) (checksum uint64, ok bool) {
	s.mu.Lock()
	el, found := s.index[key]
	if s.closed || !found {
		s.st.Misses++
		s.mu.Unlock()
		return 0, false
	}
	s.lru.MoveToFront(el)
	s.ops.Add(1)
	s.mu.Unlock()
	defer s.ops.Done()

	sum, out, touched := s.read(key, saltHash, dst)
	if out != hit && touched {
		clear(dst)
	}

	if out == forged && s.onForged != nil {
		defer s.onForged() // after the unlock deferred below: never under s.mu
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch out {
	case hit:
		s.st.Hits++
		return sum, true
	case corrupt, forged:
		s.st.Corrupt++
		if out == forged {
			s.st.Forged++
		}
		// Only if the index still holds the entry this Get read: a newer
		// Put of the same key after an eviction has its own file.
		if cur, ok := s.index[key]; ok && cur == el {
			s.dropLocked(el)
			s.root.Remove(s.name(key))
		}
	case gone:
		// Removed behind the store's back: forget it.
		if cur, ok := s.index[key]; ok && cur == el {
			s.dropLocked(el)
		}
	case foreign:
		// Another Meta's file under this Meta's name: not ours to delete,
		// but no longer ours to serve or count against capacity.
		s.st.Foreign++
		if cur, ok := s.index[key]; ok && cur == el {
			s.dropLocked(el)
		}
	}
	s.st.Misses++
	return 0, false
}

// read checks one file and reads its payload into dst. touched says
// whether dst may have been written.
func (s *Store) read(key [2]uint64, saltHash [16]byte, dst []byte) (uint64, outcome, bool) {
	f, err := s.root.Open(s.name(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, gone, false
		}
		return 0, miss, false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, miss, false
	}
	if !fi.Mode().IsRegular() {
		return 0, corrupt, false
	}
	var buf [maxHeaderLen]byte
	h, n, err := readHeader(f, &buf, s.key)
	switch {
	case errors.Is(err, errForged):
		return 0, forged, false
	case err != nil:
		return 0, corrupt, false
	case h.meta != s.meta:
		return 0, foreign, false
	case h.key != key || int64(n)+int64(h.payloadLen) != fi.Size():
		return 0, corrupt, false
	case h.tenant != s.key.tenant(saltHash) || h.payloadLen != uint64(len(dst)):
		// Another tenant's page under a colliding key, or a page of another
		// size than the caller's: intact, just not this caller's.
		return 0, miss, false
	}
	if _, err := io.ReadFull(f, dst); err != nil {
		return 0, corrupt, true
	}
	pm := s.key.payloadMAC(buf[:n-2*tagLen])
	pm.Write(dst)
	if !hmac.Equal(pm.Sum(nil), h.payloadMAC[:]) {
		return 0, forged, true
	}
	return h.pageSum, hit, true
}

// Has reports whether key is stored (for any tenant; Get checks the
// tenant). It reads no file and does not count as a use.
func (s *Store) Has(key [2]uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.index[key]
	return ok && !s.closed
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// Close waits for Puts and Gets in flight, then releases the directory.
// The files stay for the next Open. Later calls fail (Put) or miss (Get).
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.ops.Wait()
	err := s.lock.Close() // closing the descriptor drops the lock
	if rerr := s.root.Close(); err == nil {
		err = rerr
	}
	return err
}
