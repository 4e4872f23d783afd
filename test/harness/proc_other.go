//go:build !linux

package harness

import (
	"os/exec"
	"syscall"
)

// setProcAttr does nothing outside Linux: Pdeathsig is Linux-only, and
// without it a process group buys little.
func setProcAttr(*exec.Cmd) {}

// signalGroup signals the server process alone.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	return cmd.Process.Signal(sig)
}
