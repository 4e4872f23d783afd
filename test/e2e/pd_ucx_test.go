//go:build ucx

package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/transfer/ucx"
	"github.com/batonlm/baton/test/harness"
)

// Through the router with --transport ucx: greedy output equals the public
// reference (and so tcp's), with 16 concurrent requests, and no page is
// leaked or left in quarantine afterwards.
func TestPDOverUCX(t *testing.T) {
	ref := loadReference(t)
	bin := harness.Build(t, "ucx")
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, Binary: bin,
		WorkerArgs: []string{"--transport", "ucx", "--page-size", "4", "--chunked-prefill-size", "8"}})
	for _, w := range c.Workers() {
		if info := serverInfoOf(t, w); info["transport"] != "ucx" {
			t.Fatalf("%s serves transport %v", w.URL, info["transport"])
		}
	}
	greedyConcurrently(t, c.Router.URL, ref, 16)
	c.WaitClean(t)
	if m := metricsOf(t, c.Decode[0]); m["baton_handoff_failures_total"] != 0 || m["baton_kv_reservations_total"] != 16 {
		t.Fatalf("decode: %v handoff failures, %v reservations", m["baton_handoff_failures_total"], m["baton_kv_reservations_total"])
	}
}

// f16 KV over UCX: the puts land half-width rows at half-width offsets,
// so greedy output through the router equals a standalone f16 server's,
// and the handoff moves 2 bytes an element.
func TestPDOverUCXF16(t *testing.T) {
	pdF16MatchesStandalone(t, "ucx")
}

func serverInfoOf(t *testing.T, s *server) map[string]any {
	t.Helper()
	code, b := get(t, s.URL+"/server_info")
	var info map[string]any
	if code != 200 || json.Unmarshal(b, &info) != nil {
		t.Fatalf("%s/server_info: %d %s", s.URL, code, b)
	}
	return info
}

// A decode worker on the cuda backend with --transport ucx registers its
// GPU pool with UCX in place, and prefill stages the pages in a GPU arena
// of its own and puts them from there straight into the pool, with the
// checksums computed on the devices (the emulated driver's device memory
// is host memory, registered as such; a UCX built with CUDA registers a
// GPU's as CUDA memory). With --ucx-kv-buffer host they land in a host
// landing zone that Commit verifies and copies into the pool, and prefill
// sends them from host memory. Greedy output equals the public reference
// either way.
func TestPDOverUCXOnCUDA(t *testing.T) {
	ref := loadReference(t)
	env := cudaEnv(t)
	bin := harness.Build(t, "ucx")
	for _, c := range []struct {
		buffer, memory, path string
		staged               bool
	}{
		{"auto", "registered with ucx as host memory (emulated device memory)", "into the GPU pool", true},
		{"host", "ucx landing zone in host memory", "GPU pool through host memory", false},
	} {
		t.Run(c.buffer, func(t *testing.T) {
			cl := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, Binary: bin, PrefillEnv: env, DecodeEnv: env,
				WorkerArgs: []string{"--transport", "ucx", "--device", "cuda", "--max-total-tokens", "1024", "--page-size", "4"},
				DecodeArgs: []string{"--ucx-kv-buffer", c.buffer}})
			checkOnCUDA(t, cl.Decode[0], c.memory)
			if path, _ := serverInfoOf(t, cl.Decode[0])["kv_transfer_path"].(string); !strings.HasPrefix(path, c.path) {
				t.Errorf("decode's kv_transfer_path is %q, want it to start %q", path, c.path)
			}
			if path, _ := serverInfoOf(t, cl.Prefill[0])["kv_transfer_path"].(string); !strings.HasPrefix(path, "from the GPU arena") {
				t.Errorf("prefill's kv_transfer_path is %q, want it to start %q", path, "from the GPU arena")
			}
			greedyConcurrently(t, cl.Router.URL, ref, 2)
			cl.WaitClean(t)
			pm, dm := metricsOf(t, cl.Prefill[0]), metricsOf(t, cl.Decode[0])
			dev, host := pm[`baton_kv_pages_shipped_total{from="device",role="prefill"}`], pm[`baton_kv_pages_shipped_total{from="host",role="prefill"}`]
			if c.staged && (dev == 0 || host != 0) || !c.staged && (dev != 0 || host == 0) {
				t.Errorf("prefill shipped %v pages from the device and %v from the host; staged in the arena: %v", dev, host, c.staged)
			}
			if dm["baton_handoff_failures_total"] != 0 {
				t.Errorf("decode: %v handoff failures", dm["baton_handoff_failures_total"])
			}
		})
	}
}

// `baton env` says whether this UCX can register GPU memory, as the
// workers decide it (ucx.CUDAMemory), so a GPU machine's env log tells
// which path ucx takes there.
func TestEnvUCXGPUMemory(t *testing.T) {
	bin := harness.Build(t, "ucx")
	out, err := exec.Command(bin, "env").CombinedOutput()
	if err != nil {
		t.Fatalf("baton env: %v\n%s", err, out)
	}
	cuda, err := ucx.CUDAMemory()
	if err != nil {
		t.Fatal(err)
	}
	want := "ucx GPU memory: no"
	if cuda {
		want = "ucx GPU memory: yes"
	}
	if !strings.Contains(string(out), want) {
		t.Fatalf("baton env does not say %q:\n%s", want, out)
	}
}
