package hostmem

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestField(t *testing.T) {
	got, err := Field(strings.NewReader("MemFree:  100 kB\nMemTotal:       24576000 kB\n"), "MemTotal")
	if err != nil || got != 24576000<<10 {
		t.Fatalf("MemTotal: %d, %v", got, err)
	}
	if _, err := Field(strings.NewReader("MemFree: 1 kB\n"), "MemTotal"); err == nil {
		t.Fatal("no MemTotal accepted")
	}
}

// A cgroup limit caps both figures: Total by the limit, Available by what
// the limit leaves above the group's current use; "max" is no limit.
func TestCgroupCaps(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	defer func(a, b, c string) { meminfoPath, cgroupMaxPath, cgroupCurPath = a, b, c }(meminfoPath, cgroupMaxPath, cgroupCurPath)
	meminfoPath = write("meminfo", "MemTotal: 8388608 kB\nMemAvailable: 4194304 kB\n") // 8 GiB, 4 GiB
	cgroupMaxPath = write("memory.max", "max\n")
	cgroupCurPath = write("memory.current", "1073741824\n")
	if tot, err := Total(); err != nil || tot != 8<<30 {
		t.Fatalf("no limit: Total %d, %v", tot, err)
	}
	if av, err := Available(); err != nil || av != 4<<30 {
		t.Fatalf("no limit: Available %d, %v", av, err)
	}
	write("memory.max", "3221225472\n") // 3 GiB, 1 GiB of it in use
	if tot, err := Total(); err != nil || tot != 3<<30 {
		t.Fatalf("3 GiB limit: Total %d, %v", tot, err)
	}
	if av, err := Available(); err != nil || av != 2<<30 {
		t.Fatalf("3 GiB limit, 1 GiB used: Available %d, %v", av, err)
	}
}
