//go:build faults

package main

import "github.com/batonlm/baton/internal/faults/inject"

// With BATON_FAULTS set, a prefill worker's sender, its calls to decode
// and its gRPC server carry the spec's frame and request faults.
func init() {
	decorate.sender = inject.Sender
	decorate.dialOptions = inject.DialOptions
	decorate.serverOptions = inject.ServerOptions
}
