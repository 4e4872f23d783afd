package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/auth/authtest"
	"github.com/batonlm/baton/test/harness"
)

// authPool keeps the pools small: eight concurrent references (69 tokens,
// five pages each) fit with room to spare.
var authPool = []string{"--page-size", "16", "--max-total-tokens", "1024"}

// plane is the internal-auth flags of each role of one cluster.
type plane struct{ prefill, decode, router []string }

func secretArgs(file string) []string { return []string{"--cluster-secret-file", file} }

func tlsArgs(caFile, cert, key string) []string {
	return []string{"--internal-tls-cert", cert, "--internal-tls-key", key, "--internal-tls-ca", caFile}
}

func roleTLS(t *testing.T, ca *authtest.CA, role auth.Role) []string {
	t.Helper()
	cert, key := ca.Issue(t, role)
	return tlsArgs(ca.CAFile, cert, key)
}

func secretPlane(t *testing.T) plane {
	a := secretArgs(authtest.SecretFile(t))
	return plane{prefill: a, decode: a, router: a}
}

func mtlsPlane(t *testing.T, ca *authtest.CA) plane {
	return plane{prefill: roleTLS(t, ca, auth.RolePrefill), decode: roleTLS(t, ca, auth.RoleDecode), router: roleTLS(t, ca, auth.RoleRouter)}
}

func startAuthCluster(t *testing.T, p plane) *harness.Cluster {
	t.Helper()
	return harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: authPool,
		PrefillArgs: p.prefill, DecodeArgs: p.decode, RouterArgs: p.router})
}

// routerView is the router's /server_info: its own plane and its workers.
type routerView struct {
	InternalAuth string `json:"internal_auth"`
	Workers      []struct {
		URL          string `json:"url"`
		Role         string `json:"role"`
		Healthy      bool   `json:"healthy"`
		Error        string `json:"error"`
		InternalAuth string `json:"internal_auth"`
	} `json:"workers"`
}

func viewOf(t *testing.T, router *server) routerView {
	t.Helper()
	code, b := get(t, router.URL+"/server_info")
	var v routerView
	if err := json.Unmarshal(b, &v); code != 200 || err != nil {
		t.Fatalf("router /server_info: %d %v %s", code, err, b)
	}
	return v
}

func authFailures(t *testing.T, s *server) float64 {
	t.Helper()
	return metricsOf(t, s)["baton_internal_auth_failures_total"]
}

// authFailuresOf counts the refusals of s labelled rpc.
func authFailuresOf(t *testing.T, s *server, rpc string) float64 {
	t.Helper()
	n := 0.0
	for k, v := range metricsOf(t, s) {
		if strings.HasPrefix(k, "baton_internal_auth_failures_total{") && strings.Contains(k, `rpc="`+rpc+`"`) {
			n += v
		}
	}
	return n
}

// servesReference runs eight concurrent greedy references through the
// router of a cluster whose members all share mode, and checks that nothing
// was refused and every page came back.
func servesReference(t *testing.T, c *harness.Cluster, mode string) {
	t.Helper()
	v := viewOf(t, c.Router)
	if v.InternalAuth != mode || len(v.Workers) != 2 {
		t.Fatalf("router /server_info: internal_auth %q, %d workers; want %q, 2", v.InternalAuth, len(v.Workers), mode)
	}
	for _, w := range v.Workers {
		if !w.Healthy || w.InternalAuth != mode {
			t.Fatalf("router sees %s %s: healthy %v internal_auth %q (%s); want %q", w.Role, w.URL, w.Healthy, w.InternalAuth, w.Error, mode)
		}
	}
	greedyConcurrently(t, c.Router.URL, loadReference(t), 8)
	c.WaitClean(t)
	d := metricsOf(t, c.Decode[0])
	if d["baton_kv_reservations_total"] != 8 || d["baton_handoff_failures_total"] != 0 {
		t.Fatalf("decode: reservations %v, handoff failures %v", d["baton_kv_reservations_total"], d["baton_handoff_failures_total"])
	}
	// The writer counts the bytes it sent whatever the transport.
	if p := metricsOf(t, c.Prefill[0]); p["baton_kv_transfer_sessions_total"] < 1 || p["baton_kv_transfer_bytes_total"] <= 0 {
		t.Fatalf("prefill: %v transfer sessions, %v KV bytes", p["baton_kv_transfer_sessions_total"], p["baton_kv_transfer_bytes_total"])
	}
	for _, s := range append(c.Workers(), c.Router) {
		if n := authFailures(t, s); n != 0 {
			t.Fatalf("%s: %v internal auth failures in a cluster that shares its credentials", s.URL, n)
		}
	}
}

// refusedRouter starts a router with routerArgs in front of c's workers and
// checks that it finds no healthy worker, answers 503 in words that name no
// worker, and that nothing is reserved; each of counting must count the
// router's attempts as internal auth failures labelled rpc.
func refusedRouter(t *testing.T, c *harness.Cluster, routerArgs []string, rpc string, counting ...*server) {
	t.Helper()
	before := map[*server]float64{}
	for _, s := range c.Workers() {
		before[s] = authFailuresOf(t, s, rpc)
	}
	reservations := metricsOf(t, c.Decode[0])["baton_kv_reservations_total"]
	args := append([]string{"--role", "router", "--prefill", c.Prefill[0].URL, "--decode", c.Decode[0].URL}, routerArgs...)
	r := harness.StartWith(t, harness.Options{Unready: true}, args...)
	defer func() {
		if err := r.Stop(); err != nil {
			t.Error(err)
		}
	}()
	// Until its first probe, a worker is unhealthy with no reason; wait for
	// a verdict on every one.
	var v routerView
	for deadline := time.Now().Add(15 * time.Second); ; {
		v = viewOf(t, r)
		probed := len(v.Workers) == 2
		for _, w := range v.Workers {
			probed = probed && (w.Healthy || w.Error != "")
		}
		if probed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router never probed its workers: %+v", v.Workers)
		}
		time.Sleep(50 * time.Millisecond)
	}
	healthy := 0
	for _, w := range v.Workers {
		t.Logf("router sees %s %s: healthy %v, %s", w.Role, w.URL, w.Healthy, w.Error)
		if w.Healthy {
			healthy++
		}
	}
	if healthy == 2 {
		t.Fatalf("both workers healthy to a router that cannot prove itself: %+v", v.Workers)
	}
	for _, s := range counting {
		for deadline := time.Now().Add(10 * time.Second); authFailuresOf(t, s, rpc) <= before[s]; {
			if time.Now().After(deadline) {
				t.Fatalf("%s counted no internal auth failure of %s (still %v)", s.URL, rpc, before[s])
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i := range 4 {
		stream := i%2 == 1
		code, hdr, b := post(t, r.URL+"/v1/completions",
			fmt.Sprintf(`{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"stream":%v}`, stream))
		e := requireOpenAIError(t, "refused router", b)
		if code != 503 || hdr.Get("Retry-After") == "" {
			t.Fatalf("request %d (stream %v): %d, Retry-After %q: %s", i, stream, code, hdr.Get("Retry-After"), b)
		}
		if leaky.Match(b) || strings.Contains(strings.ToLower(e.Error.Message), "tls") || strings.Contains(e.Error.Message, "secret") {
			t.Fatalf("request %d: the client reads the plane's insides: %s", i, b)
		}
	}
	if code, _ := get(t, r.URL+"/health"); code != 503 {
		t.Fatalf("router /health with no healthy pair: %d", code)
	}
	if n := metricsOf(t, c.Decode[0])["baton_kv_reservations_total"]; n != reservations {
		t.Fatalf("decode made %v reservations for a router it refused", n-reservations)
	}
	c.WaitClean(t)
}

// A cluster that shares a secret serves the reference exactly; routers that
// do not know the secret are refused by both workers, which keep serving the
// one that does.
func TestInternalAuthSecret(t *testing.T) {
	c := startAuthCluster(t, secretPlane(t))
	servesReference(t, c, "secret")
	// baton check, which sees the cluster from outside, passes it and says how
	// each member is authenticated.
	out, err := exec.Command(batonBinary(t), "check", "--router", c.Router.URL).CombinedOutput()
	if err != nil || !regexp.MustCompile(`internal plane\s+PASS`).MatchString(string(out)) || strings.Count(string(out), `internal_auth "secret"`) != 3 {
		t.Fatalf("baton check on a secret-mode cluster: %v\n%s", err, out)
	}
	t.Logf("baton check:\n%s", out)
	t.Run("router without credentials", func(t *testing.T) {
		refusedRouter(t, c, nil, "Info", c.Prefill[0], c.Decode[0])
	})
	t.Run("router with another secret", func(t *testing.T) {
		refusedRouter(t, c, secretArgs(authtest.SecretFile(t)), "Info", c.Prefill[0], c.Decode[0])
	})
	// The refusals took nothing from the members.
	greedyConcurrently(t, c.Router.URL, loadReference(t), 2)
	c.WaitClean(t)
}

// The same with mutual TLS: one certificate per role from the cluster CA.
// Workers refuse a router with no certificate or with one the cluster CA did
// not sign; a router given another role's certificate does not start.
func TestInternalAuthMTLS(t *testing.T) {
	ca := authtest.NewCA(t)
	c := startAuthCluster(t, mtlsPlane(t, ca))
	servesReference(t, c, "mtls")
	t.Run("router without credentials", func(t *testing.T) {
		refusedRouter(t, c, nil, "tls", c.Prefill[0], c.Decode[0])
	})
	t.Run("router with a certificate from another CA", func(t *testing.T) {
		// It trusts both CAs, so it starts and the workers are the ones
		// to refuse it.
		stranger := authtest.NewCA(t)
		cert, key := stranger.Issue(t, auth.RoleRouter)
		refusedRouter(t, c, tlsArgs(bundleOf(t, ca, stranger), cert, key), "tls", c.Prefill[0], c.Decode[0])
	})
	t.Run("router with a prefill certificate", func(t *testing.T) {
		// A member takes no other role's certificate, so it never gets as
		// far as a worker's role check.
		refusesToStart(t, []string{"is for role prefill", "this process is router"},
			append([]string{"--role", "router", "--prefill", c.Prefill[0].URL, "--decode", c.Decode[0].URL}, roleTLS(t, ca, auth.RolePrefill)...)...)
	})
	greedyConcurrently(t, c.Router.URL, loadReference(t), 2)
	c.WaitClean(t)
}

// A prefill worker in secret mode and a decode worker in mTLS never make a
// pair: a router in either mode reaches one of them only.
func TestInternalAuthMixedModes(t *testing.T) {
	ca := authtest.NewCA(t)
	secret := authtest.SecretFile(t)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, WorkerArgs: authPool,
		PrefillArgs: secretArgs(secret), DecodeArgs: roleTLS(t, ca, auth.RoleDecode), NoRouter: true})
	t.Run("secret router", func(t *testing.T) {
		// Its plaintext calls fail decode's TLS handshake.
		refusedRouter(t, c, secretArgs(secret), "tls", c.Decode[0])
	})
	t.Run("mtls router", func(t *testing.T) {
		// Decode takes it as a member. Prefill's plaintext server cannot read
		// a TLS client; to it that is a broken connection, not a refused
		// member, so nobody counts a failure.
		refusedRouter(t, c, roleTLS(t, ca, auth.RoleRouter), "")
	})
}

// A prefill worker whose certificate the decode worker does not trust passes
// the router (which trusts both CAs) but cannot open a transfer session:
// each request fails as a handoff failure, and decode gets every reserved
// page back.
func TestInternalAuthUntrustedWriter(t *testing.T) { untrustedWriter(t, "") }

func untrustedWriter(t *testing.T, bin string, workerArgs ...string) {
	t.Helper()
	ca, other := authtest.NewCA(t), authtest.NewCA(t)
	bundle := bundleOf(t, ca, other)
	pcert, pkey := other.Issue(t, auth.RolePrefill)
	rcert, rkey := ca.Issue(t, auth.RoleRouter)
	c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, Binary: bin, WorkerArgs: append(workerArgs, authPool...),
		PrefillArgs: tlsArgs(bundle, pcert, pkey), DecodeArgs: roleTLS(t, ca, auth.RoleDecode), RouterArgs: tlsArgs(bundle, rcert, rkey)})
	for i := range 3 {
		code, _, b := post(t, c.Router.URL+"/v1/completions", `{"model":"stories260K","prompt":"Once upon a time","max_tokens":8}`)
		e := requireOpenAIError(t, "untrusted writer", b)
		if code < 502 || code > 504 || leaky.Match(b) {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
		t.Logf("request %d: %d %s", i, code, e.Error.Message)
	}
	c.WaitClean(t)
	d := metricsOf(t, c.Decode[0])
	if d["baton_kv_reservations_total"] == 0 || d["baton_kv_transfer_bytes_total"] != 0 || d["baton_kv_reservations_active"] != 0 {
		t.Fatalf("decode: reservations %v (active %v), KV bytes landed %v", d["baton_kv_reservations_total"],
			d["baton_kv_reservations_active"], d["baton_kv_transfer_bytes_total"])
	}
	if authFailuresOf(t, c.Decode[0], "transfer") == 0 {
		t.Fatal("decode counted no refused transfer session")
	}
}

// A worker asked to listen beyond loopback with no credentials refuses to
// start and says which flags would let it; --insecure-internal lets it, and
// it says so wherever it is asked.
func TestInternalAuthRequiredOffLoopback(t *testing.T) {
	for _, role := range []string{"prefill", "decode"} {
		refusesToStart(t, []string{"--cluster-secret-file", "--internal-tls-cert", "--internal-tls-key", "--internal-tls-ca", "--insecure-internal"},
			"--role", role, "--host", "0.0.0.0")
	}
	s := startServer(t, "--role", "decode", "--host", "0.0.0.0", "--insecure-internal")
	code, b := get(t, s.URL+"/server_info")
	var info struct {
		InternalAuth string `json:"internal_auth"`
	}
	if err := json.Unmarshal(b, &info); code != 200 || err != nil || !strings.Contains(info.InternalAuth, "--insecure-internal") {
		t.Fatalf("/server_info of an insecure worker: %d %s", code, b)
	}
	if !strings.Contains(s.Stderr(), "UNAUTHENTICATED") {
		t.Fatalf("no warning in the log:\n%s", s.Stderr())
	}
}

// refusesToStart runs `baton serve` with args on a free port and wants it to
// exit non-zero, soon, saying every one of want.
func refusesToStart(t *testing.T, want []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, batonBinary(t), append([]string{"serve", "--port", "0"}, args...)...)
	cmd.Env = cleanEnv()
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("baton serve %s is still running after 30s:\n%s", strings.Join(args, " "), out)
	}
	if err == nil {
		t.Fatalf("baton serve %s exited 0:\n%s", strings.Join(args, " "), out)
	}
	for _, w := range want {
		if !strings.Contains(string(out), w) {
			t.Fatalf("baton serve %s: the refusal does not say %q:\n%s", strings.Join(args, " "), w, out)
		}
	}
}

// bundleOf writes the certificates of cas into one file, as a member that
// trusts all of them is given.
func bundleOf(t *testing.T, cas ...*authtest.CA) string {
	t.Helper()
	var pems []byte
	for _, ca := range cas {
		b, err := os.ReadFile(ca.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pems = append(pems, b...)
	}
	f := filepath.Join(t.TempDir(), "cas.pem")
	if err := os.WriteFile(f, pems, 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// A decode worker holds one caller to --max-pages-per-peer, counted on the
// identity the caller proved: a request that needs more pages than the bound
// is refused with a 429 to retry (overload, not an outage), one that fits
// is served, and the refusal holds nothing.
func TestInternalAuthPerPeerPages(t *testing.T) {
	p := secretPlane(t)
	p.decode = append(p.decode, "--max-pages-per-peer", "4")
	c := startAuthCluster(t, p)
	body := `{"model":"stories260K","prompt":"Once upon a time","max_tokens":%d,"ignore_eos":true}`
	// 5 prompt tokens + 64 = 69 tokens: five pages of 16.
	code, hdr, b := post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(body, 64))
	e := requireOpenAIError(t, "over the per-peer bound", b)
	if code != 429 || hdr.Get("Retry-After") == "" || leaky.Match(b) {
		t.Fatalf("a request over the caller's page bound: %d %s", code, b)
	}
	t.Logf("over the bound: %d %s", code, e.Error.Message)
	// 5 + 8 = 13 tokens: one page.
	if code, _, b := post(t, c.Router.URL+"/v1/completions", fmt.Sprintf(body, 8)); code != 200 {
		t.Fatalf("a request within the bound: %d %s", code, b)
	}
	c.WaitClean(t)
	if m := metricsOf(t, c.Decode[0]); m["baton_kv_reservations_total"] != 1 || m["baton_kv_reservations_active"] != 0 {
		t.Fatalf("decode: %v reservations (%v active), want the one that fit", m["baton_kv_reservations_total"], m["baton_kv_reservations_active"])
	}
}
