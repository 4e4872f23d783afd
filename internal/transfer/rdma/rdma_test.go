package rdma

import (
	"os"
	"slices"
	"strings"
	"testing"
)

// TestDevicesMatchSysfs: Devices lists exactly the entries of
// /sys/class/infiniband (none on a host without RDMA hardware, which must
// be an empty result, not an error).
func TestDevicesMatchSysfs(t *testing.T) {
	var want []string
	if ents, err := os.ReadDir("/sys/class/infiniband"); err == nil {
		for _, e := range ents {
			want = append(want, e.Name())
		}
	}
	slices.Sort(want)
	var got []string
	for _, d := range Devices() {
		got = append(got, d.Name)
		if len(d.UCXNames()) == 0 {
			t.Errorf("%s: no UCX names", d.Name)
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("Devices() = %v, sysfs has %v", got, want)
	}
	t.Logf("RDMA devices: %s", Summary())
	if len(want) == 0 && !strings.HasPrefix(Summary(), "none") {
		t.Errorf("Summary() = %q on a host without RDMA devices, want it to say none", Summary())
	}
}

func TestUCXNames(t *testing.T) {
	d := Device{Name: "mlx5_0", Ports: []string{"1", "2"}}
	if got := strings.Join(d.UCXNames(), ","); got != "mlx5_0:1,mlx5_0:2" {
		t.Errorf("UCXNames = %s", got)
	}
	if got := (Device{Name: "rxe0"}).UCXNames(); !slices.Equal(got, []string{"rxe0"}) {
		t.Errorf("UCXNames without ports = %v", got)
	}
}

func TestUCXNetDevicesUnknown(t *testing.T) {
	if s, err := UCXNetDevices(nil); s != "" || err != nil {
		t.Errorf("no names: %q %v", s, err)
	}
	_, err := UCXNetDevices([]string{"no_such_hca_0"})
	if err == nil || !strings.Contains(err.Error(), "no_such_hca_0") {
		t.Errorf("unknown device: %v, want an error naming it", err)
	}
}
