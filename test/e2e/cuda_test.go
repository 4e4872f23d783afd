package e2e

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels/cuda/fakecuda"
	"github.com/batonlm/baton/test/harness"
)

// The real binary with --device cuda. Here it runs on the emulated CUDA
// driver and cuBLAS (internal/kernels/cuda/fakecuda, found through
// LD_LIBRARY_PATH as a real installation would be): the whole CUDA backend
// above the driver runs, KV pools in "GPU" memory included. With
// BATON_REQUIRE_GPU=1 (test/gpu/run.sh) the same tests run on the real
// driver and GPU.

// cudaEnv is the environment that makes a worker load the fake driver
// (built here), or nothing on a GPU machine.
func cudaEnv(t *testing.T) []string {
	t.Helper()
	if os.Getenv("BATON_REQUIRE_GPU") == "1" {
		return nil
	}
	dir := t.TempDir()
	if err := fakecuda.Build(dir); err != nil {
		if errors.Is(err, fakecuda.ErrNoCompiler) {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	return []string{"LD_LIBRARY_PATH=" + dir}
}

// checkOnCUDA fails unless the worker runs the cuda backend with its KV
// pool in device memory (what its start-up log says).
func checkOnCUDA(t *testing.T, s *server, memory string) {
	t.Helper()
	log := s.Stderr()
	if !strings.Contains(log, "device=\"device cuda:0:") || !strings.Contains(log, memory) {
		t.Fatalf("%s does not run on cuda with %s:\n%s", s.URL, memory, log)
	}
}

// Prefill and decode on the cuda backend over tcp: the prompt's pages go
// from one GPU pool through pinned staging and the network into the
// other, and the greedy output equals the public reference.
func TestPDOnCUDA(t *testing.T) {
	ref := loadReference(t)
	env := cudaEnv(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, PrefillEnv: env, DecodeEnv: env,
		WorkerArgs: []string{"--device", "cuda", "--max-total-tokens", "1024", "--page-size", "4", "--chunked-prefill-size", "8"}})
	for _, w := range c.Workers() {
		checkOnCUDA(t, w, "memory=cuda")
	}
	greedyConcurrently(t, c.Router.URL, ref, 2)
	c.WaitClean(t)
	if m := metricsOf(t, c.Decode[0]); m["baton_handoff_failures_total"] != 0 || m["baton_nan_logits_total"] != 0 {
		t.Fatalf("decode: %v handoff failures, %v NaN logits", m["baton_handoff_failures_total"], m["baton_nan_logits_total"])
	}
}
