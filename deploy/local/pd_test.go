package local

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pdPorts is a PORT for pd.sh whose every port (the router's, prefill's
// HTTP and gRPC, decode's HTTP, gRPC and transfer) is free now.
func pdPorts(t *testing.T) int {
	t.Helper()
	for range 50 {
		base := 20000 + rand.IntN(20000)
		free := true
		for _, off := range []int{0, 100, 101, 200, 201, 202} {
			ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+off))
			if err != nil {
				free = false
				break
			}
			ln.Close()
		}
		if free {
			return base
		}
	}
	t.Fatal("no free ports for pd.sh")
	return 0
}

// Stopping make run (pd.sh) is how a user ends it: SIGTERM to the script,
// or Ctrl-C, which the terminal sends to its whole process group. Either
// way the three servers stop gracefully and the script exits 0, so that
// make reports no error. Before, it exited 1 and make said
// "make: *** [Makefile:20: run] Error 1".
func TestPDStopsCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a router, a prefill and a decode worker")
	}
	// BATON_BIN names a binary built already; else this tree's is built.
	bin := os.Getenv("BATON_BIN")
	if bin == "" {
		bin = filepath.Join(t.TempDir(), "baton")
		build := exec.Command("go", "build", "-o", bin, "./cmd/baton")
		build.Dir = "../.."
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
	}
	for _, c := range []struct {
		name  string
		sig   syscall.Signal
		group bool // sent to the process group, as a terminal's Ctrl-C is
	}{
		{"SIGTERM", syscall.SIGTERM, false},
		{"Ctrl-C", syscall.SIGINT, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			port := pdPorts(t)
			var out bytes.Buffer
			cmd := exec.Command("bash", "./pd.sh")
			// baton reads BATON_* variables as flags: BATON_BIN is not one.
			env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "BATON_BIN=") })
			cmd.Env = append(env, "BIN="+bin, "PORT="+strconv.Itoa(port))
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
			router := fmt.Sprintf("http://127.0.0.1:%d/health", port)
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				if resp, err := http.Get(router); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
				select {
				case err := <-exited:
					t.Fatalf("pd.sh ended before the router was ready: %v\n%s", err, out.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("the router was not ready within 20 s\n%s", out.String())
				}
			}
			pid := cmd.Process.Pid
			if c.group {
				pid = -pid
			}
			if err := syscall.Kill(pid, c.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("pd.sh after %s: %v\n%s", c.name, err, out.String())
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("pd.sh still running 15 s after %s\n%s", c.name, out.String())
			}
			for _, off := range []int{0, 100, 200} {
				if conn, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port+off)); err == nil {
					conn.Close()
					t.Errorf("port %d still served after pd.sh exited", port+off)
				}
			}
		})
	}
}
