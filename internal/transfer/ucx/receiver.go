//go:build ucx

package ucx

/*
#include "bt.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"net"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// Region is memory UCX allocated (ucp_mem_map with UCP_MEM_MAP_ALLOCATE)
// for a KV pool: on one host UCX backs it with shared memory (posix or
// sysv), which a sender maps and writes with its own CPU stores, so puts
// into it are one-sided for real. It is C memory, outside the Go heap.
type Region struct {
	ctx    *ucpContext
	memh   C.ucp_mem_h
	base   uintptr
	length uintptr
	floats []float32

	mu    sync.Mutex
	freed bool
}

// AllocKV allocates memory for floats float32s (rounded up by UCX to
// whole pages) that a Receiver made WithMemory exposes to senders. The
// options choose the UCX context (WithTLS, WithNetDevices,
// WithRDMADevices), which the Receiver then shares. The memory is zero.
// Free it after the last Receiver using it is closed and nothing reads it.
func AllocKV(floats int, opts ...Option) (*Region, error) {
	if floats <= 0 || floats > math.MaxInt/4 {
		return nil, fmt.Errorf("ucx: AllocKV of %d floats", floats)
	}
	cfg := newConfig(opts)
	ctx, err := newContext(cfg)
	if err != nil {
		return nil, err
	}
	r := &Region{ctx: ctx}
	var base unsafe.Pointer
	var n C.size_t
	ctx.mu.Lock()
	st := C.bt_mem_map(ctx.h, 0, C.size_t(floats*4), 1, 0, &r.memh, &base, &n)
	ctx.mu.Unlock()
	if st != C.UCS_OK {
		ctx.unref()
		return nil, statusErr(fmt.Sprintf("ucp_mem_map(ALLOCATE, %d bytes)", floats*4), st)
	}
	r.base, r.length = uintptr(base), uintptr(n)
	if r.length < uintptr(floats*4) || r.base%4 != 0 {
		r.Free()
		return nil, fmt.Errorf("ucx: UCX allocated %d bytes at %#x for %d", r.length, r.base, floats*4)
	}
	r.floats = unsafe.Slice((*float32)(base), floats)
	clear(r.floats)
	return r, nil
}

// Floats is the memory, for the KV pool.
func (r *Region) Floats() []float32 { return r.floats }

// Free unmaps the memory. Nothing may use Floats afterwards.
func (r *Region) Free() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.freed {
		return nil
	}
	r.freed = true
	r.floats = nil
	r.ctx.mu.Lock()
	st := C.ucp_mem_unmap(r.ctx.h, r.memh)
	r.ctx.mu.Unlock()
	r.ctx.unref()
	return statusErr("ucp_mem_unmap", st)
}

func (r *Region) contains(p, n uintptr) bool {
	return p >= r.base && n <= r.length && p-r.base <= r.length-n
}

// Receiver is the decode side. It registers the KV memory once, serves the
// control protocol at Addr, and implements transfer.Receiver and
// transfer.OneSided.
type Receiver struct {
	cfg  config
	ln   net.Listener
	sink transfer.Sink
	ctx  *ucpContext
	eng  *engine

	memh   C.ucp_mem_h
	ownMap bool
	pin    runtime.Pinner
	wel    welcome // without pages; copied per session

	mu     sync.Mutex
	conns  map[*rconn]struct{}
	closed bool
	wg     sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
}

var (
	_ transfer.Receiver = (*Receiver)(nil)
	_ transfer.OneSided = (*Receiver)(nil)
)

// rconn is one session's control connection on the receiver.
type rconn struct {
	c net.Conn // as accepted; closed to cut the session off
	// cc is the connection the handshake returned (TLS, say), which every
	// message goes through; set under wmu before welcomed.
	cc net.Conn
	// wmu orders the receiver's writes: WELCOME before any CLOSING.
	wmu      sync.Mutex
	welcomed bool
	closing  bool
}

// Listen registers kv.Data with UCX (or, WithMemory, exposes a Region that
// holds it; or, WithDeviceMemory, registers the pool in GPU memory, kv
// then giving only the layout), and serves sessions at addr (host:port; port 0 picks one).
// Go memory is pinned for the receiver's life (runtime.Pinner): the KV
// pool is allocated once and never reallocated, and Go's collector does
// not move heap objects, so its address stays valid for UCX and senders.
// sink's Write is never called; it gets Admit, the one-sided gate, and
// Closed.
func Listen(addr string, sink transfer.Sink, kv kernels.PagedKV, opts ...Option) (*Receiver, error) {
	cfg := newConfig(opts)
	if err := cfg.check(); err != nil {
		return nil, err
	}
	pf := kv.PageFloats()
	if dm := cfg.device; dm != nil {
		if cfg.region != nil {
			return nil, errors.New("ucx: WithDeviceMemory and WithMemory name two pools")
		}
		if pf <= 0 || dm.bytes < pf*4 || dm.bytes%(pf*4) != 0 || dm.addr == 0 {
			return nil, fmt.Errorf("ucx: device memory of %d bytes at %#x is not whole pages of %d bytes", dm.bytes, dm.addr, pf*4)
		}
	} else if pf <= 0 || len(kv.Data) < pf || len(kv.Data)%pf != 0 {
		return nil, fmt.Errorf("ucx: KV of %d floats is not whole pages of %d", len(kv.Data), pf)
	}
	r := &Receiver{cfg: cfg, sink: sink, conns: map[*rconn]struct{}{}}
	var p, n uintptr
	switch {
	case cfg.device != nil:
		// Not Go memory: nothing to pin. It must outlive the receiver
		// (Close unregisters it), which its owner sees to.
		p, n = cfg.device.addr, uintptr(cfg.device.bytes)
		if err := r.register(cfg, p, n, cfg.device.cuda); err != nil {
			return nil, err
		}
	case cfg.region != nil:
		reg := cfg.region
		p, n = uintptr(unsafe.Pointer(&kv.Data[0])), uintptr(len(kv.Data)*4)
		reg.mu.Lock()
		ok := !reg.freed && reg.contains(p, n)
		if ok {
			reg.ctx.ref()
		}
		reg.mu.Unlock()
		if !ok {
			return nil, errors.New("ucx: WithMemory: the KV memory is not inside the region (or it was freed)")
		}
		r.ctx, r.memh = reg.ctx, reg.memh
	default:
		p, n = uintptr(unsafe.Pointer(&kv.Data[0])), uintptr(len(kv.Data)*4)
		r.pin.Pin(&kv.Data[0])
		if err := r.register(cfg, p, n, false); err != nil {
			r.pin.Unpin()
			return nil, err
		}
	}
	fail := func(err error) (*Receiver, error) {
		r.release()
		return nil, err
	}
	var (
		kbuf unsafe.Pointer
		klen C.size_t
	)
	r.ctx.mu.Lock()
	st := C.ucp_rkey_pack(r.ctx.h, r.memh, &kbuf, &klen)
	r.ctx.mu.Unlock()
	if st != C.UCS_OK {
		return fail(statusErr("ucp_rkey_pack", st))
	}
	rkey := C.GoBytes(kbuf, C.int(klen))
	C.ucp_rkey_buffer_release(kbuf)

	eng, err := startEngine("receiver", r.ctx, cfg.spin)
	if err != nil {
		return fail(err)
	}
	r.eng = eng
	var waddr []byte
	if err := eng.call(func() (err error) { waddr, err = eng.workerAddress(); return }); err != nil {
		return fail(err)
	}
	// A pool in device memory is verified where it is, with the sum a GPU
	// computes (transfer.DeviceSums): senders claim their pages with it.
	sum := uint32(sumXXH3)
	if cfg.device != nil {
		sum = sumPageSum
	}
	r.wel = welcome{WorkerAddr: waddr, RKey: rkey, Base: uint64(p), Length: uint64(n),
		PageSize: uint32(kv.PageSize), Layers: uint32(kv.Layers), KVHeads: uint32(kv.KVHeads), HeadDim: uint32(kv.HeadDim), DType: uint32(kv.DType), Sum: sum, Host: hostID()}
	if err := r.wel.check(); err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fail(fmt.Errorf("ucx: listen: %w", err))
	}
	r.ln = ln
	r.wg.Add(1)
	go r.acceptLoop()
	return r, nil
}

// register makes the receiver's context and registers [p, p+n) with it,
// as GPU memory when cuda.
func (r *Receiver) register(cfg config, p, n uintptr, cuda bool) error {
	ctx, err := newContext(cfg)
	if err != nil {
		return err
	}
	var base unsafe.Pointer
	var got C.size_t
	c := C.int(0)
	if cuda {
		c = 1
	}
	ctx.mu.Lock()
	st := C.bt_mem_map(ctx.h, C.uintptr_t(p), C.size_t(n), 0, c, &r.memh, &base, &got)
	ctx.mu.Unlock()
	if st != C.UCS_OK {
		ctx.unref()
		return statusErr("ucp_mem_map", st)
	}
	r.ctx, r.ownMap = ctx, true
	return nil
}

// release undoes Listen's registrations (after the sessions are gone).
func (r *Receiver) release() {
	if r.eng != nil {
		r.eng.stop()
	}
	if r.ownMap {
		r.ctx.mu.Lock()
		C.ucp_mem_unmap(r.ctx.h, r.memh)
		r.ctx.mu.Unlock()
		r.pin.Unpin()
	}
	r.ctx.unref()
}

// Addr is where senders connect: the control protocol's TCP address.
func (r *Receiver) Addr() string { return r.ln.Addr().String() }

// OneSided implements transfer.OneSided: senders put, the Sink sees no
// frame.
func (r *Receiver) OneSided() bool { return true }

// Transports lists the UCX resources this receiver's context selected
// ("posix/memory", "tcp/lo", "rc_mlx5/mlx5_0:1", ...).
func (r *Receiver) Transports() []string { return r.ctx.resources() }

// Close stops accepting, asks every open session's sender to end (CLOSING;
// it flushes and closes its endpoint and answers END, which is Closed's
// proof), waits for them up to the close timeout, then drops what is left
// (no Closed for those: nothing proves their puts are over), and finally
// destroys the worker and unregisters the memory. After Close nothing a
// sender puts can land in Go memory this receiver registered; memory from
// AllocKV is the Region's to free.
func (r *Receiver) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		conns := make([]*rconn, 0, len(r.conns))
		for c := range r.conns {
			conns = append(conns, c)
		}
		r.mu.Unlock()
		r.closeErr = r.ln.Close()
		for _, rc := range conns {
			rc.sendClosing()
		}
		done := make(chan struct{})
		go func() { r.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(r.cfg.closeTimeout):
			r.mu.Lock()
			for rc := range r.conns {
				_ = rc.c.Close()
			}
			r.mu.Unlock()
			<-done
		}
		r.release()
	})
	return r.closeErr
}

func (rc *rconn) sendClosing() {
	rc.wmu.Lock()
	defer rc.wmu.Unlock()
	rc.closing = true
	if rc.welcomed {
		_ = rc.cc.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = rc.cc.Write(frame(msgClosing, nil))
	}
}

func (r *Receiver) acceptLoop() {
	defer r.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		rc := &rconn{c: c}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.conns[rc] = struct{}{}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.serve(rc)
	}
}

// serve runs one session's control connection. Closed comes only with a
// proof, before the connection is closed, so a sender whose Close saw the
// connection end knows decode has been told.
func (r *Receiver) serve(rc *rconn) {
	defer r.wg.Done()
	c := rc.c
	defer func() {
		_ = c.Close()
		r.mu.Lock()
		delete(r.conns, rc)
		r.mu.Unlock()
	}()
	deadline := time.Now().Add(r.cfg.handshakeTimeout)
	cc, id, err := r.cfg.handshake.Accept(rc.c, deadline)
	if err != nil {
		return
	}
	c = cc
	rc.wmu.Lock()
	rc.cc = cc
	rc.wmu.Unlock()
	_ = c.SetReadDeadline(deadline)
	typ, p, err := readMsg(c)
	if err != nil || typ != msgHello {
		return
	}
	h, err := parseHello(p)
	if err != nil {
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	key := transfer.Key{Room: h.Room, Epoch: h.Epoch, Cap: h.Cap, Session: id}
	var (
		pages  []int32
		refuse error
	)
	pages, refuse = r.sink.Admit(key)
	if refuse == nil && pages == nil {
		pages = []int32{}
	}
	var msg []byte
	if refuse != nil {
		msg = refuseMsg(refuse.Error())
	} else {
		w := r.wel
		w.Pages = pages
		if err := w.check(); err != nil {
			refuse = fmt.Errorf("reservation %v names pages outside the registered memory: %w", key, err)
			msg = refuseMsg(refuse.Error())
		} else {
			msg = w.marshal()
		}
	}
	rc.wmu.Lock()
	_ = c.SetWriteDeadline(time.Now().Add(r.cfg.handshakeTimeout))
	_, werr := c.Write(msg)
	_ = c.SetWriteDeadline(time.Time{})
	rc.welcomed = true
	if rc.closing && werr == nil {
		_, _ = c.Write(frame(msgClosing, nil))
	}
	rc.wmu.Unlock()
	if werr != nil && refuse == nil {
		// The sender may or may not have the key: no proof either way.
		return
	}
	typ, _, err = readMsg(c)
	switch {
	case refuse != nil:
		r.sink.Closed(key, fmt.Sprintf("ucx: session from %s refused at admission (%v); it was never given the remote key", c.RemoteAddr(), refuse))
	case err == nil && typ == msgEnd:
		r.sink.Closed(key, fmt.Sprintf("ucx: sender %s (pid %d) flushed its endpoint, every put remotely complete, and closed it before ending the session", c.RemoteAddr(), h.PID))
	default:
		// Aborted, crashed or cut off: its puts may still land. The pages
		// wait for the writer's Drained.
	}
}
