// Package hostmem reads how much memory the host gives this process:
// /proc/meminfo, capped by the cgroup (v2) limit a container runs under.
package hostmem

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Field reads a /proc/meminfo field (given in kB there), e.g. "MemTotal",
// in bytes.
func Field(r io.Reader, name string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == name+":" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil || kb < 0 {
				return 0, fmt.Errorf("host memory: %s %q", name, fields[1])
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("host memory: no %s in /proc/meminfo", name)
}

// Places the figures are read from; variables so that tests can point
// them at files of their own.
var (
	meminfoPath   = "/proc/meminfo"
	cgroupMaxPath = "/sys/fs/cgroup/memory.max"
	cgroupCurPath = "/sys/fs/cgroup/memory.current"
)

func meminfo(name string) (int64, error) {
	f, err := os.Open(meminfoPath)
	if err != nil {
		return 0, fmt.Errorf("host memory: %w", err)
	}
	defer f.Close()
	return Field(f, name)
}

// cgroupFile reads one number from a cgroup file; false where there is
// none (no cgroup v2, or "max": no limit).
func cgroupFile(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return v, err == nil && v > 0
}

// Total is MemTotal, or the cgroup's limit where that is smaller, so a
// container is sized by what it may use, not by the machine.
func Total() (int64, error) {
	total, err := meminfo("MemTotal")
	if err != nil {
		return 0, err
	}
	if lim, ok := cgroupFile(cgroupMaxPath); ok {
		total = min(total, lim)
	}
	return total, nil
}

// Available is MemAvailable, or what the cgroup's limit leaves above its
// current use where that is smaller.
func Available() (int64, error) {
	avail, err := meminfo("MemAvailable")
	if err != nil {
		return 0, err
	}
	if lim, ok := cgroupFile(cgroupMaxPath); ok {
		cur, _ := cgroupFile(cgroupCurPath)
		avail = min(avail, max(lim-cur, 0))
	}
	return avail, nil
}
