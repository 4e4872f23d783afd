//go:build ucx

package e2e

import (
	"testing"

	"github.com/batonlm/baton/internal/auth/authtest"
	"github.com/batonlm/baton/test/harness"
)

// With --transport ucx the transfer port carries only the control
// connection (the pages move by puts), and it is authenticated the same
// way: in each mode the cluster serves the reference with no refusal.
func TestInternalAuthOverUCX(t *testing.T) {
	bin := harness.Build(t, "ucx")
	for _, mode := range []string{"secret", "mtls"} {
		t.Run(mode, func(t *testing.T) {
			p := secretPlane(t)
			if mode == "mtls" {
				p = mtlsPlane(t, authtest.NewCA(t))
			}
			c := harness.StartCluster(t, harness.ClusterOptions{Prefill: 1, Decode: 1, Binary: bin,
				WorkerArgs:  append([]string{"--transport", "ucx"}, authPool...),
				PrefillArgs: p.prefill, DecodeArgs: p.decode, RouterArgs: p.router})
			for _, w := range c.Workers() {
				if info := serverInfoOf(t, w); info["transport"] != "ucx" {
					t.Fatalf("%s serves transport %v", w.URL, info["transport"])
				}
			}
			servesReference(t, c, mode)
		})
	}
}

// Over ucx, a writer decode cannot authenticate never gets a session, so
// none was admitted for the reservation: its abort frees the pages at once
// instead of waiting for a Drained that cannot come.
func TestInternalAuthUntrustedWriterOverUCX(t *testing.T) {
	untrustedWriter(t, harness.Build(t, "ucx"), "--transport", "ucx")
}
