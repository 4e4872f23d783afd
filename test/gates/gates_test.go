// Package gates proves the page rules of DESIGN.md hold under faults: one
// file per gate of the incident report's four acceptance checks, each
// driving real processes built with the test-only `faults` tag. Each gate's
// checks are written as scenarios that return their violations, so that
// mutation_test.go can run the same scenario with one guard switched off and
// show that the gate then fails.
package gates

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/test/harness"
	testref "github.com/batonlm/baton/test/reference"
)

func TestMain(m *testing.M) {
	code := m.Run()
	harness.Cleanup()
	os.Exit(code)
}

// faultsBinary is baton built with the faults tag.
func faultsBinary(t *testing.T) string { return harness.Build(t, "faults") }

// setup describes a cluster for one scenario.
type setup struct {
	prefill, decode int
	prefillFaults   string // BATON_FAULTS for every prefill worker
	guardsOff       string // BATON_GUARDS_OFF for every worker
	workerArgs      []string
	prefillArgs     []string
	decodeArgs      []string
	routerArgs      []string
	// cudaIPC runs both workers on cuda (the emulated driver here) with
	// --transport cuda-ipc: decode copies the pages GPU to GPU out of
	// prefill's arena.
	cudaIPC bool
}

func startCluster(t *testing.T, s setup) *harness.Cluster {
	t.Helper()
	env := []string{}
	if s.guardsOff != "" {
		env = append(env, "BATON_GUARDS_OFF="+s.guardsOff)
	}
	penv := append([]string{}, env...)
	if s.prefillFaults != "" {
		penv = append(penv, "BATON_FAULTS="+s.prefillFaults)
	}
	if s.prefill == 0 {
		s.prefill = 1
	}
	if s.decode == 0 {
		s.decode = 1
	}
	if s.cudaIPC {
		cuda := harness.FakeCUDAEnv(t)
		penv, env = append(penv, cuda...), append(env, cuda...)
		s.workerArgs = append(slices.Clone(s.workerArgs), "--device", "cuda", "--transport", "cuda-ipc")
	}
	return harness.StartCluster(t, harness.ClusterOptions{Prefill: s.prefill, Decode: s.decode, WorkerArgs: s.workerArgs,
		PrefillArgs: s.prefillArgs, DecodeArgs: s.decodeArgs, RouterArgs: s.routerArgs, PrefillEnv: penv, DecodeEnv: env, Binary: faultsBinary(t)})
}

// violations collects what a scenario found wrong.
type violations []string

func (v *violations) add(format string, args ...any) { *v = append(*v, fmt.Sprintf(format, args...)) }

func requireClean(t *testing.T, v violations) {
	t.Helper()
	if len(v) > 0 {
		t.Fatalf("gate failed:\n- %s", strings.Join(v, "\n- "))
	}
}

type reference = testref.Greedy

func loadReference(t *testing.T) reference { return testref.Load(t) }

// greedy asks for the reference continuation; it returns the status and the
// text (empty unless 200).
func greedy(t *testing.T, url string, ref reference, header ...string) (int, string, []byte) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":%d,"temperature":0}`, ref.Prompt, len(ref.GeneratedIDs))
	code, _, b := harness.Post(t, url+"/v1/completions", body, header...)
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if code == 200 && json.Unmarshal(b, &c) == nil && len(c.Choices) == 1 {
		return code, c.Choices[0].Text, b
	}
	return code, "", b
}

// longPrompt spans many 4-token pages, so a transfer takes many frames.
const longPrompt = "Once upon a time there was a little girl named Lily. She loved to play outside in the park with her red ball."

// checkClean adds a violation for any leaked, quarantined or doubly released
// page and any NaN that reached sampling, on every worker.
func checkClean(t *testing.T, c *harness.Cluster, v *violations) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, w := range c.Workers() {
		for {
			m := harness.Metrics(t, w)
			if m["baton_kv_pages_free"]+m["baton_kv_pages_cached"] == m["baton_kv_pages_capacity"] && m["baton_kv_pages_quarantined"] == 0 {
				break
			}
			if time.Now().After(deadline) {
				v.add("%s: %v of %v pages free, %v cached, %v quarantined", w.URL, m["baton_kv_pages_free"], m["baton_kv_pages_capacity"], m["baton_kv_pages_cached"], m["baton_kv_pages_quarantined"])
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		m := harness.Metrics(t, w)
		if m["baton_kv_release_errors"] != 0 {
			v.add("%s: %v refused releases (double or wrong-owner)", w.URL, m["baton_kv_release_errors"])
		}
		if m["baton_nan_logits_total"] != 0 {
			v.add("%s: NaN logits %v times", w.URL, m["baton_nan_logits_total"])
		}
		if m["baton_lifecycle_illegal_moves_total"] != 0 {
			v.add("%s: %v lifecycle moves refused", w.URL, m["baton_lifecycle_illegal_moves_total"])
		}
	}
}

// serverInfo fetches a worker's /server_info.
func serverInfo(t *testing.T, s *harness.Server) map[string]any {
	t.Helper()
	code, b := harness.Get(t, s.URL+"/server_info")
	var info map[string]any
	if code != 200 || json.Unmarshal(b, &info) != nil {
		t.Fatalf("%s/server_info: %d %s", s.URL, code, b)
	}
	return info
}

// workerConn dials a worker's control plane (grpc_addr in /server_info)
// directly, bypassing the router's own gate, to test the worker's door.
func workerConn(t *testing.T, s *harness.Server) *grpc.ClientConn {
	t.Helper()
	addr, _ := serverInfo(t, s)["grpc_addr"].(string)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func decodeClient(t *testing.T, s *harness.Server) pdv1.DecodeClient {
	return pdv1.NewDecodeClient(workerConn(t, s))
}

func prefillClient(t *testing.T, s *harness.Server) pdv1.PrefillClient {
	return pdv1.NewPrefillClient(workerConn(t, s))
}

func timeout(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// tokens is a prompt of n in-vocabulary token ids (BOS first).
func tokens(n int) []int32 {
	p := make([]int32, n)
	p[0] = 1
	for i := 1; i < n; i++ {
		p[i] = int32(259 + i%200)
	}
	return p
}
