package roles

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

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
	"/baton.pd.v1.Decode/Generate":   {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Info":      {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Prefill":   {auth.RoleRouter},
	"/baton.pd.v1.Prefill/Abort":     {auth.RoleDecode},
	"/baton.pd.v1.Prefill/Tokenizer": {auth.RoleRouter},
}

// ServerOptions are a worker's gRPC server options: the plane's
// authentication of every call, then the role check of callers, and the
// default PlaneLimits.
func ServerOptions(p *auth.Plane) []grpc.ServerOption {
	return ServerOptionsWith(p, DefaultPlaneLimits)
}

// ServerOptionsWith is ServerOptions under limits l.
func ServerOptionsWith(p *auth.Plane, l PlaneLimits) []grpc.ServerOption {
	opts := append(p.ServerOptions(), p.Policy(callers)...)
	return append(opts,
		grpc.ConnectionTimeout(l.Handshake),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.Idle, Time: l.Ping, Timeout: l.PingTimeout}),
		// Our clients send no keepalive pings; a peer that pings without a
		// call in flight, or more often than this, is told to go away.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.MinPing}))
}

// PlaneLimits bound what a connection to a worker's gRPC port may hold
// without doing anything. A connection costs a goroutine and buffers
// before any call on it is authenticated, so one that has done nothing
// for a while is closed: a client of ours dials again on its next call.
type PlaneLimits struct {
	// Handshake is how long a connection may take to finish its TLS and
	// HTTP/2 handshakes: a TCP connection that sends nothing is closed then.
	Handshake time.Duration
	// Idle closes a connection that has had no call in flight this long.
	Idle time.Duration
	// Ping is how long a connection may stay silent before the server
	// pings it, and PingTimeout how long it has to answer.
	Ping, PingTimeout time.Duration
	// MinPing is the shortest interval a client may ping at.
	MinPing time.Duration
	// MaxConns bounds the connections open at once (LimitListener).
	MaxConns int
}

// DefaultPlaneLimits are a worker's limits. A router keeps one connection
// to each worker, a prefill worker one to each decode worker it writes to,
// and a decode worker one to each prefill worker it aborts; they call often
// enough that Idle costs them a reconnection now and then at most.
var DefaultPlaneLimits = PlaneLimits{Handshake: 10 * time.Second, Idle: time.Minute, Ping: time.Minute, PingTimeout: 20 * time.Second,
	MinPing: 30 * time.Second, MaxConns: 1024}

// LimitListener closes each connection accepted while max are open, so
// that connections nobody uses cannot take every file descriptor of the
// process. It closes rather than waits: a caller refused at once dials
// again later, one left in the accept queue waits on nothing it can see.
func LimitListener(ln net.Listener, max int) net.Listener {
	return &limitListener{Listener: ln, max: int64(max)}
}

type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			continue
		}
		return &limitConn{Conn: c, release: func() { l.open.Add(-1) }}, nil
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
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
