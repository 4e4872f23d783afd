//go:build faults

package main

import (
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/faults"
)

// With BATON_GUARDS_OFF=peer_auth the plane is made as a cluster without
// authentication would make it, whatever credentials the flags name: every
// caller is a member in every role.
func init() {
	if faults.On(faults.GuardPeerAuth) {
		return
	}
	newPlane = func(o auth.Options) (*auth.Plane, error) {
		o.CertFile, o.KeyFile, o.CAFile, o.SecretFile, o.Insecure = "", "", "", "", true
		return auth.New(o)
	}
}
