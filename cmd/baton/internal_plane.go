package main

import (
	"log/slog"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/transfer"
)

// internalFlags say how router, prefill and decode prove themselves to
// each other: mutual TLS, a shared cluster secret, or nothing (loopback).
type internalFlags struct {
	tlsCert, tlsKey, tlsCA string
	secretFile             string
	insecure               bool
}

func (f *internalFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.tlsCert, "internal-tls-cert", "", "router/prefill/decode: this member's certificate (PEM), signed by the cluster CA, with its role as a URI SAN baton://role/<role>")
	fs.StringVar(&f.tlsKey, "internal-tls-key", "", "router/prefill/decode: the private key of --internal-tls-cert (PEM)")
	fs.StringVar(&f.tlsCA, "internal-tls-ca", "", "router/prefill/decode: the cluster CA that signs every member's certificate (PEM)")
	fs.StringVar(&f.secretFile, "cluster-secret-file", "", "router/prefill/decode: a file holding the cluster's shared secret (32 bytes or more), for clusters without a CA")
	fs.BoolVar(&f.insecure, "insecure-internal", false, "prefill/decode: listen beyond loopback with no internal authentication (anyone who reaches the ports can read, write or abort any request)")
}

// plane makes this process's side of the internal plane; its refusals
// count in baton_internal_auth_failures_total{rpc}.
func (f *internalFlags) plane(role auth.Role, log *slog.Logger, ms *metrics.Set) (*auth.Plane, error) {
	o := auth.Options{Role: role, CertFile: f.tlsCert, KeyFile: f.tlsKey, CAFile: f.tlsCA, SecretFile: f.secretFile,
		Insecure: f.insecure, Log: log, OnFailure: func(rpc, _ string) { ms.InternalAuthFailures.WithLabelValues(rpc).Inc() }}
	return newPlane(o)
}

// newPlane makes the plane every check of the internal plane goes through.
// A faults build replaces it with one made without credentials
// (plane_faults.go, BATON_GUARDS_OFF=peer_auth), which is the whole of
// switching peer authentication off: the plane is built in this one place
// and handed to everything that authenticates, so nothing inside auth or
// the workers needs a second path.
var newPlane = auth.New

// check loads the credentials a member of the internal plane would start
// with and, for a worker, refuses to listen beyond loopback without them,
// so that --dry-run refuses what serving would.
func (f *internalFlags) check(role, host string) error {
	if role != "router" && role != "prefill" && role != "decode" {
		return nil
	}
	p, err := f.plane(auth.Role(role), slog.New(slog.DiscardHandler), metrics.New(role))
	if err != nil {
		return err
	}
	if role == "router" {
		return nil
	}
	return p.CheckBind(host)
}

// decorate is what a prefill worker's parts are wrapped in: nothing in
// this build. A faults build (inject_faults.go) puts the frame and request
// faults of BATON_FAULTS here, around the transport sender, the calls to
// decode and the gRPC server, so that the worker's own code has one path.
var decorate = struct {
	sender        func(transfer.Sender) transfer.Sender
	dialOptions   func() []grpc.DialOption
	serverOptions func() []grpc.ServerOption
}{
	sender:        func(s transfer.Sender) transfer.Sender { return s },
	dialOptions:   func() []grpc.DialOption { return nil },
	serverOptions: func() []grpc.ServerOption { return nil },
}
