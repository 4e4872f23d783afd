package filestore

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// KeyLen is the length of a store key: its key file holds exactly this
// many bytes (e.g. `head -c 32 /dev/urandom`).
const KeyLen = 32

// tagLen is the length of a MAC in a header (a whole HMAC-SHA-256).
const tagLen = sha256.Size

// The labels keep the three uses of one key apart: no tenant tag or
// payload MAC can be passed off as a header MAC. Each ends in a NUL, so
// none is a prefix of another.
const (
	labelTenant  = "baton hicache L3 tenant v2\x00"
	labelPayload = "baton hicache L3 payload v2\x00"
	labelHeader  = "baton hicache L3 header v2\x00"
)

// ErrKeyFile wraps every refusal of a store's key file, so that a caller
// can name the setting to fix.
var ErrKeyFile = errors.New("filestore: key file refused")

// sealKey is the store key the files are sealed under.
type sealKey [KeyLen]byte

func (k *sealKey) mac(label string) hash.Hash {
	m := hmac.New(sha256.New, k[:])
	m.Write([]byte(label))
	return m
}

// tenant is what a file keeps of the tenant saltHash. The caller's hash
// is an unkeyed function of the API key, so storing it would let anyone
// who reads the directory test guesses of the key offline; under the
// store key it tells them only which files share a tenant.
func (k *sealKey) tenant(saltHash [16]byte) (t [16]byte) {
	m := k.mac(labelTenant)
	m.Write(saltHash[:])
	copy(t[:], m.Sum(nil))
	return t
}

// payloadMAC starts the payload MAC of a file whose header fields (up to
// the payload MAC) are fields; the payload is written to it next.
func (k *sealKey) payloadMAC(fields []byte) hash.Hash {
	m := k.mac(labelPayload)
	m.Write(fields)
	return m
}

// DefaultKeyFile is where Open keeps the key of dir when given none: DIR.key
// beside dir. Not inside it: whoever may write the directory must not be
// able to replace or read the key with it.
func DefaultKeyFile(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("filestore: %w", err)
	}
	if filepath.Dir(abs) == abs {
		return "", fmt.Errorf("%w: %s has no parent directory to keep its key in; give a key file", ErrKeyFile, dir)
	}
	return abs + ".key", nil
}

// loadKey reads the store key from path, after creating it there with a
// fresh random key if create is set and nothing is there yet.
func loadKey(dir, path string, create bool) (*sealKey, error) {
	if err := keyOutside(dir, path); err != nil {
		return nil, err
	}
	if create {
		if err := createKey(path); err != nil {
			return nil, err
		}
	}
	// A key file we create is never a symlink, so one found at the default
	// place was planted; one the operator named may be (a Kubernetes
	// Secret's files are), and what it points at is checked instead.
	return readKey(path, !create)
}

// keyOutside refuses a key file inside dir, where the writers it guards
// against could replace it.
func keyOutside(dir, path string) error {
	d, err := realPath(dir)
	if err != nil {
		return fmt.Errorf("filestore: %w", err)
	}
	p, err := realPath(path)
	if err != nil {
		return fmt.Errorf("filestore: %w", err)
	}
	rel, err := filepath.Rel(d, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil
	}
	return fmt.Errorf("%w: %s is inside the store directory %s; keep it outside", ErrKeyFile, path, dir)
}

// realPath resolves p's symlinks as far as they exist: a key file not yet
// created is resolved through its parent.
func realPath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if r, err := filepath.EvalSymlinks(abs); err == nil {
		return r, nil
	}
	if r, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(r, filepath.Base(abs)), nil
	}
	return abs, nil
}

// createKey puts a fresh random key at path unless something is there. The
// key is written whole under a temporary name and linked into place, which
// fails if path exists: two stores starting at once over one directory
// agree on one key, and none reads a key half written.
func createKey(path string) error {
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return nil // there (or unreadable): readKey says whether it will do
	}
	var k sealKey
	rand.Read(k[:])
	var n [8]byte
	rand.Read(n[:])
	tmp := fmt.Sprintf("%s.%x.tmp", path, n)
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("%w: create %s: %v (or give a key file)", ErrKeyFile, path, err)
	}
	_, err = f.Write(k[:])
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Link(tmp, path)
	}
	os.Remove(tmp)
	if err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%w: create %s: %v", ErrKeyFile, path, err)
	}
	return nil
}

// readKey reads a key file, refusing one that others could read or have
// written: not a regular file (a symlink too, unless follow), readable or
// writable by group or others, owned by another user than this one or
// root (private.go), or not exactly KeyLen bytes.
func readKey(path string, follow bool) (*sealKey, error) {
	refuse := func(format string, args ...any) (*sealKey, error) {
		return nil, fmt.Errorf("%w: %s: %s", ErrKeyFile, path, fmt.Sprintf(format, args...))
	}
	stat := os.Lstat
	if follow {
		stat = os.Stat
	}
	// Stat before opening, so that a FIFO planted there cannot block the
	// open.
	before, err := stat(path)
	if err != nil {
		return refuse("%v", err)
	}
	if !before.Mode().IsRegular() {
		return refuse("not a regular file (%v)", before.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return refuse("%v", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return refuse("%v", err)
	}
	if !os.SameFile(before, fi) {
		return refuse("replaced while being opened")
	}
	if err := private(fi); err != nil {
		return refuse("%v", err)
	}
	if fi.Size() != KeyLen {
		return refuse("%d bytes, want %d", fi.Size(), KeyLen)
	}
	var k sealKey
	if _, err := io.ReadFull(f, k[:]); err != nil {
		return refuse("%v", err)
	}
	if bytes.Equal(k[:], make([]byte, KeyLen)) {
		return refuse("all zero: fill it with random bytes")
	}
	return &k, nil
}
