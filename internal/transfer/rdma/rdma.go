// Package rdma lists the host's RDMA devices (InfiniBand HCAs, RoCE NICs)
// with their ports, the network interfaces they serve and their character
// devices, for `baton env` and for choosing the devices the ucx transport
// may use (--rdma-device). It reads sysfs through
// github.com/Mellanox/rdmamap and needs neither cgo nor libibverbs, so it
// is part of every build; on a host without RDMA it returns nothing.
package rdma

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/Mellanox/rdmamap"
)

// Device is one RDMA device.
type Device struct {
	// Name is the kernel's name for it (mlx5_0, rxe0, ...), what
	// --rdma-device takes.
	Name string
	// Ports are its port numbers ("1", "2"): UCX names a device port
	// "mlx5_0:1".
	Ports []string
	// NetDevices are the network interfaces it serves (the Ethernet
	// interface of a RoCE port, the IPoIB interface of an IB port).
	NetDevices []string
	// CharDevices are its /dev/infiniband nodes (uverbs, umad, rdma_cm,
	// ...): what a container must be given to use it.
	CharDevices []string
}

// UCXNames is the device as UCX_NET_DEVICES spells it: one name:port per
// port, or the bare name if sysfs lists no port.
func (d Device) UCXNames() []string {
	if len(d.Ports) == 0 {
		return []string{d.Name}
	}
	out := make([]string, len(d.Ports))
	for i, p := range d.Ports {
		out[i] = d.Name + ":" + p
	}
	return out
}

func (d Device) String() string {
	s := d.Name
	if len(d.Ports) > 0 {
		s += " ports " + strings.Join(d.Ports, ",")
	}
	if len(d.NetDevices) > 0 {
		s += " netdev " + strings.Join(d.NetDevices, ",")
	}
	if len(d.CharDevices) > 0 {
		s += " chardev " + strings.Join(d.CharDevices, ",")
	}
	return s
}

// Devices lists the host's RDMA devices, sorted by name. It returns nil
// when there are none (no /sys/class/infiniband), which is the normal case
// on a machine without RDMA hardware.
func Devices() []Device {
	names := rdmamap.GetRdmaDeviceList()
	if len(names) == 0 {
		return nil
	}
	slices.Sort(names)
	// Which interface belongs to which device: rdmamap answers per
	// interface (RoCE through the GID table, IPoIB through the node GUID).
	netdevs := map[string][]string{}
	if ifs, err := net.Interfaces(); err == nil {
		for _, ifc := range ifs {
			if ifc.Flags&net.FlagLoopback != 0 {
				continue
			}
			if dev, err := rdmamap.GetRdmaDeviceForNetdevice(ifc.Name); err == nil && dev != "" {
				netdevs[dev] = append(netdevs[dev], ifc.Name)
			}
		}
	}
	out := make([]Device, 0, len(names))
	for _, n := range names {
		ports := rdmamap.GetPorts(n)
		slices.Sort(ports)
		out = append(out, Device{Name: n, Ports: ports, NetDevices: netdevs[n], CharDevices: rdmamap.GetRdmaCharDevices(n)})
	}
	return out
}

// Summary is one line for logs and `baton env`: the devices, or a plain
// "none" when the host has no RDMA device.
func Summary() string {
	ds := Devices()
	if len(ds) == 0 {
		return "none (no RDMA devices: /sys/class/infiniband is empty or missing)"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	return strings.Join(parts, "; ")
}

// UCXNetDevices turns --rdma-device names (mlx5_0, ...) into a
// UCX_NET_DEVICES value: every port of each named device, "mlx5_0:1,...".
// A name that is not an RDMA device of this host is an error, so a typo
// does not silently leave UCX on another device (or on none).
func UCXNetDevices(names []string) (string, error) {
	if len(names) == 0 {
		return "", nil
	}
	have := map[string]Device{}
	for _, d := range Devices() {
		have[d.Name] = d
	}
	var out []string
	for _, n := range names {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		d, ok := have[n]
		if !ok {
			known := make([]string, 0, len(have))
			for k := range have {
				known = append(known, k)
			}
			slices.Sort(known)
			list := "none"
			if len(known) > 0 {
				list = strings.Join(known, ", ")
			}
			return "", fmt.Errorf("RDMA device %q not found (this host has: %s)", n, list)
		}
		out = append(out, d.UCXNames()...)
	}
	return strings.Join(out, ","), nil
}
