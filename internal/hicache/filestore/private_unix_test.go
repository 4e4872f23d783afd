//go:build unix

package filestore

import (
	"io/fs"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// statInfo is a key file's FileInfo as the kernel would report it, with
// the owner and mode a test chooses.
type statInfo struct {
	mode fs.FileMode
	st   *syscall.Stat_t
}

func (s statInfo) Name() string       { return "l3.key" }
func (s statInfo) Size() int64        { return 32 }
func (s statInfo) Mode() fs.FileMode  { return s.mode }
func (s statInfo) ModTime() time.Time { return time.Time{} }
func (s statInfo) IsDir() bool        { return false }
func (s statInfo) Sys() any           { return s.st }

// The key file's owner check: a file of this user or root is taken; one
// another local user owns is refused (they could have written the key
// that seals the L3 pages), as is one with a group or other bit.
func TestPrivateKeyFileOwner(t *testing.T) {
	me := uint32(os.Geteuid())
	other := me + 1
	if me == 0 {
		other = 4242
	}
	for _, c := range []struct {
		name string
		mode fs.FileMode
		uid  uint32
		want string
	}{
		{"mine", 0o600, me, ""},
		{"root's", 0o600, 0, ""},
		{"another user's", 0o600, other, "owned by uid"},
		{"group readable", 0o640, me, "group or others"},
		{"world writable", 0o602, me, "group or others"},
	} {
		err := private(statInfo{mode: c.mode, st: &syscall.Stat_t{Uid: c.uid}})
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s key file refused: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s key file: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
