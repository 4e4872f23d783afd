package roles

import (
	"context"
	"net"
	"path"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/transfer"
)

// callers says which roles may call each RPC of the control plane: the
// router drives a request (Reserve, Prefill, Stream, Abort, Finish, Cancel),
// the prefill worker that writes a reservation reports on it (Commit,
// Drained), and decode asks its writer to stop (Prefill's Abort). Which
// reservation a call may touch is the capability's business; this is who
// may make the call at all.
var callers = map[string][]auth.Role{
	"/baton.pd.v1.Decode/Info":              {auth.RoleRouter},
	"/baton.pd.v1.Decode/Reserve":           {auth.RoleRouter},
	"/baton.pd.v1.Decode/CancelReservation": {auth.RoleRouter},
	"/baton.pd.v1.Decode/Commit":            {auth.RolePrefill},
	"/baton.pd.v1.Decode/Drained":           {auth.RolePrefill},
	"/baton.pd.v1.Decode/Abort":             {auth.RoleRouter},
	"/baton.pd.v1.Decode/Finish":            {auth.RoleRouter},
	"/baton.pd.v1.Decode/Stream":            {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Info":             {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Prefill":          {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Abort":            {auth.RoleDecode},
}

// ServerOptions are a worker's gRPC server options: the plane's
// authentication of every call, then the role check of callers. An RPC
// missing from callers is refused to everyone.
func ServerOptions(p *auth.Plane) []grpc.ServerOption {
	allow := func(ctx context.Context, method string) error {
		roles, ok := callers[method]
		if !ok {
			return status.Errorf(codes.PermissionDenied, "%s is not a control-plane call", method)
		}
		return p.Allow(ctx, path.Base(method), roles...)
	}
	return append(p.ServerOptions(),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if err := allow(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if err := allow(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return h(srv, ss)
		}))
}

// TransferHandshake authenticates transfer sessions with the plane: only a
// prefill worker opens one, only a decode worker accepts it.
func TransferHandshake(p *auth.Plane) transfer.Handshake { return transferAuth{p} }

type transferAuth struct{ p *auth.Plane }

func (t transferAuth) Accept(c net.Conn, deadline time.Time) (net.Conn, transfer.SessionID, error) {
	conn, s, err := t.p.AcceptSession(c, deadline, auth.RolePrefill)
	return conn, transfer.SessionID(s.ID), err
}

func (t transferAuth) Open(c net.Conn, deadline time.Time) (net.Conn, transfer.SessionID, error) {
	conn, s, err := t.p.OpenSession(c, deadline, auth.RoleDecode)
	return conn, transfer.SessionID(s.ID), err
}
