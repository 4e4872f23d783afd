package gates

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/test/harness"
)

// Gate 1, pool/context: every worker states its configured context next to
// its real pool; a request under the context but over a pool is refused
// with 400 before anything is reserved.
func TestGatePoolContext(t *testing.T) {
	c := startCluster(t, setup{decodeArgs: []string{"--max-total-tokens", "128", "--page-size", "16"}})
	d, p := c.Decode[0], c.Prefill[0]
	if !strings.Contains(d.Stderr(), "lowering the effective maximum") || !strings.Contains(d.Stderr(), "context_length=512") ||
		!strings.Contains(d.Stderr(), "capacity_tokens=128") {
		t.Fatalf("decode start-up output does not report context vs pool:\n%s", d.Stderr())
	}
	di, pi := serverInfo(t, d), serverInfo(t, p)
	if di["context_length"] != 512.0 || di["kv_pool_tokens"] != 128.0 || di["effective_context_length"] != 128.0 {
		t.Fatalf("decode /server_info: %v", di)
	}
	if pi["context_length"] != 512.0 || pi["effective_context_length"] != 512.0 {
		t.Fatalf("prefill /server_info: %v", pi)
	}
	long := strings.Repeat("The cat sat on the mat. ", 20) // ~150 tokens: < 512, > 128
	code, _, body := harness.Post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(`{"model":"stories260K","prompt":%q,"max_tokens":4}`, long))
	if code != 400 || !strings.Contains(string(body), "invalid_request_error") {
		t.Fatalf("prompt over the decode pool: %d %s", code, body)
	}
	if m := harness.Metrics(t, d); m["baton_kv_reservations_total"] != 0 {
		t.Fatalf("a reservation was made for a refused request")
	}
	if m := harness.Metrics(t, p); m["baton_kv_transfer_sessions_total"] != 0 || m["baton_requests_queued_total"] != 0 {
		t.Fatalf("prefill did work for a refused request: %v sessions, %v queued", m["baton_kv_transfer_sessions_total"], m["baton_requests_queued_total"])
	}
	var v violations
	checkClean(t, c, &v)
	requireClean(t, v)
}

// --strict-capacity refuses to start rather than lower the effective maximum.
func TestGateStrictCapacity(t *testing.T) {
	out, err := exec.Command(faultsBinary(t), "serve", "--role", "decode", "--max-total-tokens", "128", "--strict-capacity", "--port", "0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "exceeds the KV pool") {
		t.Fatalf("--strict-capacity with a pool below the context: err %v\n%s", err, out)
	}
}

// scenarioDoor asks a decode worker directly (past the router's own gate)
// to reserve for a request whose prompt plus max_tokens exceeds the context:
// the worker's door must refuse it in Received, allocating nothing.
func scenarioDoor(t *testing.T, guardsOff string) violations {
	var v violations
	env := []string{}
	if guardsOff != "" {
		env = append(env, "BATON_GUARDS_OFF="+guardsOff)
	}
	d := harness.StartWith(t, harness.Options{Binary: faultsBinary(t), Env: env}, "--role", "decode", "--kv-poison")
	dc := decodeClient(t, d)
	info, err := dc.Info(timeout(t), &pdv1.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = dc.Reserve(timeout(t), &pdv1.ReserveRequest{RequestId: "door", Prompt: tokens(100),
		Sampling: &pdv1.SamplingParams{MaxTokens: 480}, Layout: info.Layout, Writer: "127.0.0.1:1"})
	if status.Code(err) != codes.InvalidArgument {
		v.add("decode reserved for 100 prompt + 480 completion tokens over a 512-token context (err %v)", err)
	}
	if m := harness.Metrics(t, d); m["baton_kv_reservations_total"] != 0 {
		v.add("%v reservations made by a request over the context", m["baton_kv_reservations_total"])
	}
	return v
}

func TestGateDoor(t *testing.T) { requireClean(t, scenarioDoor(t, "")) }
