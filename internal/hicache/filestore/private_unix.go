//go:build unix

package filestore

import (
	"fmt"
	"io/fs"
	"os"
	"syscall"
)

// private refuses a key file that others may read or write: any group or
// other permission bit, or an owner other than this user or root (root
// can read it anyway; anyone else could have written it).
func private(fi fs.FileInfo) error {
	if p := fi.Mode().Perm(); p&0o077 != 0 {
		return fmt.Errorf("mode %#o lets group or others read or write it (chmod 600)", p)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if me := os.Geteuid(); st.Uid != 0 && int64(st.Uid) != int64(me) {
		return fmt.Errorf("owned by uid %d, not by this user (%d) or root", st.Uid, me)
	}
	return nil
}
