package ucx

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/rdma"
)

// ErrNotBuilt is returned by every constructor of a binary built without
// the `ucx` build tag.
var ErrNotBuilt = errors.New("ucx: this binary was built without UCX support (build with -tags ucx and libucx-dev)")

// Defaults for the options.
const (
	DefaultMaxInFlight      = 64 << 20
	DefaultHandshakeTimeout = 10 * time.Second
	DefaultCloseTimeout     = 10 * time.Second
	// DefaultArenaQuarantine is how long a session's staged bytes stay
	// out of use after an end that did not flush its endpoint (an abort,
	// a failed or timed-out flush): a put may still read them.
	DefaultArenaQuarantine = time.Minute
)

type config struct {
	tls, netDevices  string
	netDevicesErr    error
	maxInFlight      int64
	handshakeTimeout time.Duration
	closeTimeout     time.Duration
	handshake        transfer.Handshake
	errMode          ErrMode
	region           *Region
	device           *deviceMemory
	spin             time.Duration
	arena            kernels.Arena
	quarantine       time.Duration
}

// Option tunes a Receiver, Sender, AllocKV or Transports; each applies to
// what its doc names and is ignored elsewhere.
type Option func(*config)

// WithTLS sets UCX_TLS for this UCX context (all sides), e.g.
// "posix,cma,self" or "tcp"; "" keeps the environment's UCX_TLS (UCX's
// default: all transports).
func WithTLS(tls string) Option { return func(c *config) { c.tls = tls } }

// WithNetDevices sets UCX_NET_DEVICES (all sides): the network devices UCX
// may use, as UCX names them ("mlx5_0:1", "eth0", "lo"). nil keeps the
// environment's.
func WithNetDevices(devs ...string) Option {
	return func(c *config) { c.netDevices = strings.Join(devs, ",") }
}

// WithRDMADevices restricts UCX to these RDMA devices (all sides): what
// --rdma-device takes ("mlx5_0,mlx5_1"). Each must be an RDMA device of
// this host (see rdma.Devices); it becomes UCX_NET_DEVICES with one
// name:port per port. An unknown device makes the constructor fail. UCX's
// shared-memory transports are not network devices and stay usable.
func WithRDMADevices(names ...string) Option {
	return func(c *config) {
		devs, err := rdma.UCXNetDevices(names)
		if err != nil {
			c.netDevicesErr = err
			return
		}
		c.netDevices = devs
	}
}

// ErrMode chooses a sender endpoint's UCX error handling.
type ErrMode int

// Error handling modes.
const (
	// ErrModeAuto: peer-failure handling (UCP_ERR_HANDLING_MODE_PEER) for a
	// receiver on another host, none for one on this host, where the shm
	// transports UCX needs for one-sided puts do not support it.
	ErrModeAuto ErrMode = iota
	// ErrModePeer: always peer-failure handling (a dead receiver fails the
	// session instead of the process; excludes shm transports).
	ErrModePeer
	// ErrModeNone: never.
	ErrModeNone
)

// WithErrMode sets the sender's endpoint error handling (sender).
func WithErrMode(m ErrMode) Option { return func(c *config) { c.errMode = m } }

// WithMaxInFlight bounds the bytes of a session's puts that UCX has not
// completed locally; past it Write blocks (sender). n <= 0 keeps the
// default.
func WithMaxInFlight(n int64) Option {
	return func(c *config) {
		if n > 0 {
			c.maxInFlight = n
		}
	}
}

// WithHandshake sets how each control connection is authenticated and
// its session named before HELLO (both sides; the default,
// transfer.Plain, authenticates nobody).
func WithHandshake(h transfer.Handshake) Option {
	return func(c *config) {
		if h != nil {
			c.handshake = h
		}
	}
}

// WithHandshakeTimeout bounds the wait for a new control connection's
// HELLO (receiver) and for the receiver's answer (sender, when the Open
// context has no earlier deadline). d <= 0 keeps the default.
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.handshakeTimeout = d
		}
	}
}

// WithCloseTimeout bounds a sender's Close (endpoint flush and close, then
// the receiver's acknowledgement of END) and a Receiver's Close (the wait
// for open sessions to end). d <= 0 keeps the default.
func WithCloseTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.closeTimeout = d
		}
	}
}

// WithSpin makes the progress goroutine keep polling UCX for d after its
// last event before it sleeps on the worker's event fd (receiver and
// sender). 0, the default, sleeps at once: on a few cores polling steals
// the CPU the peer's progress needs; on a large host a few microseconds
// may cut latency.
func WithSpin(d time.Duration) Option { return func(c *config) { c.spin = max(d, 0) } }

// WithArena makes a Sender stage the pages it ships in a (sender): device
// memory apart from the KV pool, which the sender registers with its UCX
// context and puts from, for sessions whose receiver verifies with
// kernels.PageSum (a receiver made WithDeviceMemory). The pages are then
// packed and summed on the device, and no page is read back into host
// memory. a must implement kernels.DeviceRange (the cuda arena does); its
// memory is registered as CUDA memory unless it is host-visible (the
// emulated driver's), which needs a UCX built with CUDA (CUDAMemory). The
// arena must stay allocated until the Sender is closed.
func WithArena(a kernels.Arena) Option { return func(c *config) { c.arena = a } }

// WithArenaQuarantine sets how long a session's staged bytes stay unused
// after an end that did not flush its endpoint, since a put out of them
// may still read them (sender). d <= 0 keeps the default.
func WithArenaQuarantine(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.quarantine = d
		}
	}
}

// WithMemory makes a Receiver expose memory from AllocKV instead of
// registering the PagedKV's memory itself: kv.Data must lie inside r
// (receiver).
func WithMemory(r *Region) Option { return func(c *config) { c.region = r } }

// Resource is one UCX transport on one device.
type Resource struct {
	Transport string // tcp, posix, sysv, cma, self, rc_mlx5, ud_verbs, ...
	Device    string // lo, eth0, memory, mlx5_0:1, ...
	// Type is UCT's device type: "net" (a network device: tcp, RDMA),
	// "shm" (shared memory), "self" (loopback in one process), "acc"
	// (an accelerator).
	Type string
	// Selected: a UCX context made with the same options (UCX_TLS,
	// UCX_NET_DEVICES) uses it.
	Selected bool
}

func (r Resource) String() string { return r.Transport + "/" + r.Device }

// Describe is one line for logs and `baton env`: the transports a context
// made with the options would use, and the RDMA ones plainly, "none" when
// there are none.
func Describe(rs []Resource) string {
	var sel, rdmaTLs []string
	for _, r := range rs {
		if !r.Selected {
			continue
		}
		sel = append(sel, r.String())
		if r.Type == "net" && r.Transport != "tcp" {
			rdmaTLs = append(rdmaTLs, r.String())
		}
	}
	s := "ucx transports: "
	if len(sel) == 0 {
		s += "none"
	} else {
		s += strings.Join(sel, ", ")
	}
	s += "; RDMA: "
	if len(rdmaTLs) == 0 {
		s += "none (no InfiniBand/RoCE transport available to UCX on this host)"
	} else {
		s += strings.Join(rdmaTLs, ", ")
	}
	return s
}

// deviceMemory is a KV pool outside Go memory that a Receiver registers
// in place of kv.Data (WithDeviceMemory).
type deviceMemory struct {
	addr  uintptr
	bytes int
	cuda  bool
}

// WithDeviceMemory makes a Receiver register the KV pool at addr, bytes
// long, in place of kv.Data (kernels.DeviceRange): senders put straight
// into the pool, with no landing zone in host memory to verify and copy
// from at Commit. cuda says the memory is GPU memory, which UCX registers
// with its CUDA memory domains (CUDAMemory must be true); without it the
// memory is host memory standing in for GPU memory, as the emulated
// driver's is. The memory must stay allocated until the Receiver is
// closed.
func WithDeviceMemory(addr uintptr, bytes int, cuda bool) Option {
	return func(c *config) { c.device = &deviceMemory{addr: addr, bytes: bytes, cuda: cuda} }
}

// cudaTransports are UCX's transports that move GPU memory: cuda_copy
// (host and GPU), cuda_ipc (GPUs of one node) and gdr_copy (GPUDirect).
var cudaTransports = []string{"cuda_copy", "cuda_ipc", "gdr_copy"}

// CUDATransports names the transports of rs that move GPU memory; none
// means this UCX build cannot put from or into GPU memory, which only the
// build says (Debian's libucx has no CUDA support), never an assumption.
func CUDATransports(rs []Resource) []string {
	var out []string
	for _, r := range rs {
		for _, t := range cudaTransports {
			if r.Transport == t && !slices.Contains(out, t) {
				out = append(out, t)
			}
		}
	}
	return out
}
