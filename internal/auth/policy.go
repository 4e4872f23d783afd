package auth

import (
	"context"
	"maps"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Policy is Allow for every call, by full method name
// ("/baton.pd.v1.Decode/Reserve"), so that a handler which forgets to call
// Allow is still covered. A method missing from roles is refused to all:
// a new RPC stays closed until someone decides who may call it. Put these
// options after ServerOptions, which establish the caller. In ModeNone all
// pass, as with Allow.
func (p *Plane) Policy(roles map[string][]Role) []grpc.ServerOption {
	table := make(map[string][]Role, len(roles))
	for m, rs := range maps.All(roles) {
		table[m] = slices.Clone(rs)
	}
	check := func(ctx context.Context, method string) error {
		if p.mode == ModeNone {
			return nil
		}
		rs, ok := table[method]
		if !ok {
			p.fail(shortName(method), "unlisted", "peer", Caller(ctx).ID())
			return status.Errorf(codes.PermissionDenied, "%s: no role may call this", shortName(method))
		}
		return p.Allow(ctx, shortName(method), rs...)
	}
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := check(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := check(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}),
	}
}
