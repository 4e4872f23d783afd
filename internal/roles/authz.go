package roles

import (
	"net"
	"time"

	"google.golang.org/grpc"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/transfer"
)

// callers says which roles may call each RPC of the control plane: the
// router drives a request (Reserve, Prefill, Stream, Abort, Finish, Cancel),
// the prefill worker that writes a reservation reports on it (Commit,
// Drained), decode asks its writer to stop (Prefill's Abort), and a router
// without a model of its own learns the tokenizer (Prefill's Tokenizer). Which
// reservation a call may touch is the capability's business; this is who
// may make the call at all.
var callers = map[string][]auth.Role{
	"/baton.pd.v1.Decode/Info":       {auth.RoleRouter},
	"/baton.pd.v1.Decode/Reserve":    {auth.RoleRouter},
	"/baton.pd.v1.Decode/Commit":     {auth.RolePrefill},
	"/baton.pd.v1.Decode/Drained":    {auth.RolePrefill},
	"/baton.pd.v1.Decode/Abort":      {auth.RoleRouter},
	"/baton.pd.v1.Decode/Finish":     {auth.RoleRouter},
	"/baton.pd.v1.Decode/Stream":     {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Info":      {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Prefill":   {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Abort":     {auth.RoleDecode},
	"/baton.pd.v1.Prefill/Tokenizer": {auth.RoleRouter},
}

// ServerOptions are a worker's gRPC server options: the plane's
// authentication of every call, then the role check of callers.
func ServerOptions(p *auth.Plane) []grpc.ServerOption {
	return append(p.ServerOptions(), p.Policy(callers)...)
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
