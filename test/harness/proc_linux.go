package harness

import (
	"os/exec"
	"syscall"
)

// setProcAttr puts the server in its own process group, so that stopping it
// also stops any processes it started, and has the kernel kill it if the test
// binary dies without running cleanups (go test's -timeout panic, a crash),
// so that no orphaned server keeps a port and CPU after the run.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// signalGroup sends sig to the server's process group.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	return syscall.Kill(-cmd.Process.Pid, sig)
}
