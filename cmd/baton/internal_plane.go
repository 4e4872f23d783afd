package main

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/grpc"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/roles"
	"github.com/batonlm/baton/internal/tracing"
	"github.com/batonlm/baton/internal/transfer"
)

// internalFlags say how router, prefill and decode prove themselves to
// each other: mutual TLS, role keys derived from a cluster master secret,
// or nothing (loopback).
type internalFlags struct {
	tlsCert, tlsKey, tlsCA string
	secretFile             string
	insecure               bool
}

func (f *internalFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.tlsCert, "internal-tls-cert", "", "router/prefill/decode: this member's certificate (PEM), signed by the cluster CA, with its role as a URI SAN baton://role/<role>")
	fs.StringVar(&f.tlsKey, "internal-tls-key", "", "router/prefill/decode: the private key of --internal-tls-cert (PEM)")
	fs.StringVar(&f.tlsCA, "internal-tls-ca", "", "router/prefill/decode: the cluster CA that signs every member's certificate (PEM)")
	fs.StringVar(&f.secretFile, "cluster-secret-file", "", "router/prefill/decode: this member's role key file (baton keys derive), for clusters without a CA; "+
		"or the cluster master secret itself (32 bytes or more), which lets the member act as every role")
	fs.BoolVar(&f.insecure, "insecure-internal", false, "prefill/decode: listen beyond loopback with no internal authentication (anyone who reaches the ports can read, write or abort any request)")
}

// plane makes this process's side of the internal plane; its refusals
// count in baton_internal_auth_failures_total{rpc} and, when traced, are
// internal.refused spans.
func (f *internalFlags) plane(role auth.Role, log *slog.Logger, ms *metrics.Set) (*auth.Plane, error) {
	o := auth.Options{Role: role, CertFile: f.tlsCert, KeyFile: f.tlsKey, CAFile: f.tlsCA, SecretFile: f.secretFile,
		Insecure: f.insecure, Log: log, OnFailure: func(rpc, reason string) {
			ms.InternalAuthFailures.WithLabelValues(rpc).Inc()
			tracing.Refused(rpc, reason)
		}}
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

// listenGRPC opens a worker's gRPC port, closing connections past
// roles.DefaultPlaneLimits.MaxConns: the port is reachable by more than
// members, and each connection costs before anything on it is checked.
func listenGRPC(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return roles.LimitListener(ln, roles.DefaultPlaneLimits.MaxConns), nil
}

// peerPages is --max-pages-per-peer: a number of pages, or a share of the
// pool ("50%"); 0 is no bound.
type peerPages struct {
	pages   int
	percent float64 // > 0: a share of the pool, and pages is unused
}

// defaultPeerPages leaves half of a decode worker's pool to the callers
// other than the one that holds most: a member gone wrong, or holding a
// stolen key, cannot take it all while /health says 200.
var defaultPeerPages = peerPages{percent: 50}

func (v *peerPages) String() string {
	if v.percent > 0 {
		return strconv.FormatFloat(v.percent, 'f', -1, 64) + "%"
	}
	return strconv.Itoa(v.pages)
}

func (v *peerPages) Set(s string) error {
	if p, ok := strings.CutSuffix(strings.TrimSpace(s), "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || !(f > 0 && f <= 100) {
			return fmt.Errorf("%q: a share of the pool is more than 0%% and at most 100%%", s)
		}
		*v = peerPages{percent: f}
		return nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || n < 0 {
		return fmt.Errorf("%q: want a number of pages (0: no bound) or a share of the pool such as 50%%", s)
	}
	*v = peerPages{pages: n}
	return nil
}

func (v *peerPages) Type() string { return "pages|share%" }

// of is the bound in pages for a pool of total pages whose longest request
// takes perRequest. A share is never less than one such request: below it,
// a request the pool can hold would be refused forever. A number of pages
// is the operator's to choose.
func (v peerPages) of(total, perRequest int) int {
	if v.percent <= 0 {
		return v.pages
	}
	share := int(math.Floor(float64(total) * v.percent / 100))
	return max(1, min(total, max(share, perRequest)))
}
