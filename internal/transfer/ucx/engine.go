//go:build ucx

package ucx

/*
#cgo pkg-config: ucx ucx-uct
#include "bt.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Enabled reports whether this binary has the UCX transport (-tags ucx).
const Enabled = true

// ucxError is a UCX status as an error.
type ucxError struct {
	what string
	st   C.ucs_status_t
}

func (e ucxError) Error() string {
	return fmt.Sprintf("ucx: %s: %s", e.what, C.GoString(C.ucs_status_string(e.st)))
}

func statusErr(what string, st C.ucs_status_t) error {
	if st == C.UCS_OK {
		return nil
	}
	return ucxError{what, st}
}

// ucpContext is a UCP context shared by the workers and memory made from
// it. Context-level calls (memory mapping, key packing, cleanup) take mu;
// the context is made with mt_workers_shared, so they may run while its
// workers progress on other threads.
type ucpContext struct {
	mu   sync.Mutex
	h    C.ucp_context_h
	refs int
}

func newContext(cfg config) (*ucpContext, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	tls := C.CString(cfg.tls)
	devs := C.CString(cfg.netDevices)
	defer C.free(unsafe.Pointer(tls))
	defer C.free(unsafe.Pointer(devs))
	var errbuf [256]C.char
	var h C.ucp_context_h
	if st := C.bt_ctx_init(tls, devs, &h, &errbuf[0], C.size_t(len(errbuf))); st != C.UCS_OK {
		return nil, fmt.Errorf("ucx: %s", C.GoString(&errbuf[0]))
	}
	return &ucpContext{h: h, refs: 1}, nil
}

func (c *ucpContext) ref() {
	c.mu.Lock()
	c.refs++
	c.mu.Unlock()
}

func (c *ucpContext) unref() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs--
	if c.refs == 0 {
		C.ucp_cleanup(c.h)
		c.h = nil
	}
}

// resources parses ucp_context_print_info's resource lines ("resource 0 :
// md 0 dev 0 flags -- posix/memory") into tl/dev names: what this context
// selected under its UCX_TLS and UCX_NET_DEVICES.
func (c *ucpContext) resources() []string {
	c.mu.Lock()
	s := C.bt_context_info(c.h)
	c.mu.Unlock()
	if s == nil {
		return nil
	}
	defer C.free(unsafe.Pointer(s))
	var out []string
	for _, line := range strings.Split(C.GoString(s), "\n") {
		if !strings.Contains(line, "resource") {
			continue
		}
		if i := strings.LastIndex(line, "-- "); i >= 0 {
			out = append(out, strings.TrimSpace(line[i+3:]))
		}
	}
	return out
}

// op is an outstanding UCX request and what to do when it completes; done
// runs on the engine goroutine.
type op struct {
	req  unsafe.Pointer
	done func(st C.ucs_status_t)
}

var errEngineClosed = errors.New("ucx: progress engine stopped")

// The backstop timeouts (microseconds) of an engine's sleep on the
// worker's fd, when idle and when requests are outstanding: for what
// signals no event (space freed in a shared-memory FIFO that a pending
// put waits for), so short while requests wait.
var (
	idleWait = 10000
	busyWait = 20
)

// engine is one UCX worker and the goroutine that owns it: every call on
// the worker, its endpoints and its requests runs there, on one locked OS
// thread (the worker is UCS_THREAD_MODE_SINGLE). Other goroutines hand it
// commands (submit, call) and never block in cgo themselves.
type engine struct {
	name string
	spin time.Duration
	ctx  *ucpContext
	w    C.ucp_worker_h
	efd  C.int
	wake int // eventfd

	mu       sync.Mutex
	cmds     []func()
	stopping bool
	sleeping atomic.Bool
	done     chan struct{}

	// engine goroutine only
	ops []op
	// dead: the worker is destroyed; done funcs of abandoned requests
	// must not call UCX.
	dead bool
}

func startEngine(name string, ctx *ucpContext, spin time.Duration) (*engine, error) {
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("ucx: eventfd: %w", err)
	}
	e := &engine{name: name, spin: spin, ctx: ctx, wake: wake, done: make(chan struct{})}
	ready := make(chan error, 1)
	ctx.ref()
	go e.loop(ready)
	if err := <-ready; err != nil {
		<-e.done
		return nil, err
	}
	return e, nil
}

// submit queues f to run on the engine goroutine.
func (e *engine) submit(f func()) error {
	e.mu.Lock()
	if e.stopping {
		e.mu.Unlock()
		return errEngineClosed
	}
	e.cmds = append(e.cmds, f)
	e.mu.Unlock()
	if e.sleeping.Load() {
		e.kick()
	}
	return nil
}

func (e *engine) kick() {
	var one [8]byte
	one[0] = 1
	_, _ = unix.Write(e.wake, one[:])
}

// call runs f on the engine goroutine and waits for it: only for quick
// commands (creating an endpoint, unpacking a key), never for a request.
func (e *engine) call(f func() error) error {
	ch := make(chan error, 1)
	if err := e.submit(func() { ch <- f() }); err != nil {
		return err
	}
	return <-ch
}

// track registers an outstanding request (engine goroutine only).
func (e *engine) track(req unsafe.Pointer, done func(C.ucs_status_t)) {
	e.ops = append(e.ops, op{req: req, done: done})
}

// stop lets queued commands run, waits (bounded) for outstanding requests,
// destroys the worker and ends the goroutine.
func (e *engine) stop() {
	e.mu.Lock()
	already := e.stopping
	e.stopping = true
	e.mu.Unlock()
	if !already {
		e.kick()
	}
	<-e.done
}

func (e *engine) loop(ready chan<- error) {
	runtime.LockOSThread()
	defer close(e.done)
	defer e.ctx.unref()
	defer unix.Close(e.wake)
	e.ctx.mu.Lock()
	st := C.bt_worker_create(e.ctx.h, &e.w, &e.efd)
	e.ctx.mu.Unlock()
	if st != C.UCS_OK {
		ready <- statusErr("ucp_worker_create", st)
		runtime.UnlockOSThread()
		return
	}
	ready <- nil
	var (
		lastActive  = time.Now()
		stopDead    time.Time
		drainBuf    [8]byte
		stoppingNow bool
	)
	for {
		e.mu.Lock()
		cmds := e.cmds
		e.cmds = nil
		stoppingNow = e.stopping
		e.mu.Unlock()
		for _, f := range cmds {
			f()
		}
		n := C.ucp_worker_progress(e.w)
		e.poll()
		if stoppingNow && len(cmds) == 0 {
			if len(e.ops) == 0 {
				break
			}
			if stopDead.IsZero() {
				stopDead = time.Now().Add(5 * time.Second)
			} else if time.Now().After(stopDead) {
				break
			}
		}
		now := time.Now()
		if n != 0 || len(cmds) > 0 {
			lastActive = now
			continue
		}
		// Nothing happened. Shortly after activity (WithSpin), keep
		// polling instead of sleeping: it trades a core for latency.
		if now.Sub(lastActive) < e.spin {
			runtime.Gosched()
			continue
		}
		if C.ucp_worker_arm(e.w) == C.UCS_ERR_BUSY {
			continue
		}
		e.sleeping.Store(true)
		e.mu.Lock()
		pending := len(e.cmds) > 0 || e.stopping != stoppingNow
		e.mu.Unlock()
		if !pending {
			// The worker's fd wakes us for network and shm events; the
			// timeout is a backstop for what signals nothing.
			timeout := idleWait
			if len(e.ops) > 0 || stoppingNow {
				timeout = busyWait
			}
			C.bt_wait(e.efd, C.int(e.wake), C.int(timeout))
		}
		e.sleeping.Store(false)
		_, _ = unix.Read(e.wake, drainBuf[:])
	}
	// Requests still outstanding past the grace period go with the
	// worker; their waiters hear "canceled" once nothing can touch their
	// buffers any more.
	abandoned := e.ops
	e.ops = nil
	C.ucp_worker_destroy(e.w)
	e.dead = true
	for _, o := range abandoned {
		o.done(C.UCS_ERR_CANCELED)
	}
	runtime.UnlockOSThread()
}

// poll completes finished requests (engine goroutine only).
func (e *engine) poll() {
	if len(e.ops) == 0 {
		return
	}
	type fin struct {
		done func(C.ucs_status_t)
		st   C.ucs_status_t
	}
	keep := e.ops[:0]
	var finished []fin
	for _, o := range e.ops {
		st := C.bt_req_test(o.req)
		if st == C.UCS_INPROGRESS {
			keep = append(keep, o)
			continue
		}
		finished = append(finished, fin{o.done, st})
	}
	clear(e.ops[len(keep):])
	e.ops = keep
	// After the list is settled: a done func may track new requests.
	for _, f := range finished {
		f.done(f.st)
	}
}

// workerAddress is this engine's worker address (engine goroutine only).
func (e *engine) workerAddress() ([]byte, error) {
	var a *C.ucp_address_t
	var n C.size_t
	if st := C.ucp_worker_get_address(e.w, &a, &n); st != C.UCS_OK {
		return nil, statusErr("ucp_worker_get_address", st)
	}
	defer C.ucp_worker_release_address(e.w, a)
	return C.GoBytes(unsafe.Pointer(a), C.int(n)), nil
}
