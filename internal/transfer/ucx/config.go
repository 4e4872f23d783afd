//go:build ucx

package ucx

// Configuration and host identity, for the cgo side.

import (
	"github.com/batonlm/baton/internal/transfer"

	"fmt"
	"os"
	"strings"
)

// hostID names this machine for the sender's choice of error handling
// (same host: shared memory, which has none). The kernel's boot id changes
// with every boot and differs between machines; the hostname is only
// there for humans reading logs.
func hostID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	h, _ := os.Hostname()
	return strings.TrimSpace(string(b)) + "/" + h
}

// sameHost says whether two hostIDs name one machine.
func sameHost(a, b string) bool {
	ba, _, _ := strings.Cut(a, "/")
	bb, _, _ := strings.Cut(b, "/")
	return ba != "" && ba == bb
}

func newConfig(opts []Option) config {
	c := config{
		maxInFlight:      DefaultMaxInFlight,
		handshakeTimeout: DefaultHandshakeTimeout,
		closeTimeout:     DefaultCloseTimeout,
		quarantine:       DefaultArenaQuarantine,
		handshake:        transfer.Plain{},
	}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func (c *config) check() error {
	if c.netDevicesErr != nil {
		return fmt.Errorf("ucx: %w", c.netDevicesErr)
	}
	return nil
}
