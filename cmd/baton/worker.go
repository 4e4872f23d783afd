package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/roles"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/rdma"
	"github.com/batonlm/baton/internal/transfer/tcp"
	"github.com/batonlm/baton/internal/transfer/ucx"
)

// runWorker runs a prefill or decode worker: HTTP for health, metrics and
// info; gRPC for the control plane; and, on decode, the transport receiver.
func runWorker(ctx context.Context, f *serveFlags, logw io.Writer) error {
	if len(f.rdmaDevices) > 0 {
		// Checked here, not in validate: --dry-run must not look at devices.
		if _, err := rdma.UCXNetDevices(f.rdmaDevices); err != nil {
			return fmt.Errorf("--rdma-device: %w", err)
		}
	}
	le, err := loadEngine(f, logw)
	if err != nil {
		return err
	}
	defer le.close()
	c := &le.loaded.Model.Config
	layout := roles.Layout(roles.ModelID(le.name, c), c, le.plan.pageSize)
	// Pages of another KV dtype would be read as garbage: pairing compares it.
	layout.Dtype = le.pool.KV().DType.String()
	ms := metrics.ForModel(f.role, le.name)
	plane, err := f.internal.plane(auth.Role(f.role), le.log, ms)
	if err != nil {
		return err
	}
	// The control and transfer ports hand out every request's KV: beyond
	// loopback, only to members who prove it.
	if err := plane.CheckBind(f.host); err != nil {
		return err
	}
	le.log.Info("internal plane", "auth", plane.Describe())
	xfer := roles.TransferHandshake(plane)

	gln, err := listenGRPC(net.JoinHostPort(f.host, strconv.Itoa(f.grpcPort)))
	if err != nil {
		return err
	}
	grpcAddr := advertised(f, gln.Addr().String())
	gs := grpc.NewServer(append(append(roles.ServerOptions(plane), decorate.serverOptions()...), tracing.ServerOptions()...)...)
	var worker roles.Worker
	var eng *scheduler.Engine
	switch f.role {
	case "prefill":
		var cache *prefixcache.Cache
		if !f.noRadixCache {
			cache = prefixcache.New(le.pool, le.fingerprint(f), guards.cache)
		}
		tiers, closeTiers, err := le.tiers(f, cache, ms)
		if err != nil {
			return err
		}
		defer closeTiers()
		eng = le.engine(f, scheduler.RolePrefill, ms, cache, tiers)
		sendOpts := []tcp.Option{tcp.WithHandshake(xfer)}
		if f.transport == "cuda-ipc" {
			arena, err := le.ipcArena(f)
			if err != nil {
				return err
			}
			defer arena.Close()
			sendOpts = append(sendOpts, tcp.WithArena(arena))
			fmt.Fprintf(logw, "baton: cuda-ipc arena of %d MiB in GPU memory\n", arena.Size()>>20)
		}
		var sender transfer.Sender = tcp.NewSender(sendOpts...)
		if f.transport == "ucx" {
			opts := append(ucxOptions(f), ucx.WithHandshake(xfer))
			if arena := le.ucxArena(f); arena != nil {
				// Closed after the sender (deferred first), which
				// unregisters it.
				defer arena.Close()
				opts = append(opts, ucx.WithArena(arena))
				le.transferPath = ucxStagedPath
				fmt.Fprintf(logw, "baton: ucx staging arena of %d MiB in GPU memory\n", arena.Size()>>20)
			}
			s, err := ucx.NewSender(opts...)
			if err != nil {
				return err
			}
			defer s.Close()
			sender = s
		}
		id := le.identity()
		if id.Files, err = le.tokenizerFiles(f); err != nil {
			return fmt.Errorf("tokenizer files: %w", err)
		}
		p := roles.NewPrefill(roles.PrefillOptions{PrefillDesk: roles.PrefillDesk{Engine: eng, Pool: le.pool, Metrics: ms, Sender: decorate.sender(sender), Log: le.log, Guards: guards.prefill}, Layout: layout, Transport: f.transport, ContextLength: le.plan.modelContext, MaxSeq: le.plan.context, Auth: plane, DialOptions: append(decorate.dialOptions(), tracing.DialOptions()...), Identity: id})
		p.SetAddr(grpcAddr)
		defer p.Close()
		pdv1.RegisterPrefillServer(gs, p)
		worker = p
	case "decode":
		var cache *prefixcache.Cache
		if f.decodeRadix {
			cache = prefixcache.New(le.pool, le.fingerprint(f), guards.cache)
			ps := le.pool.PageSize()
			cache.SetChecksum(func(page int32) ([]byte, uint64, error) {
				b, err := transfer.ReadPage(le.pool.KV(), page, ps, nil)
				return b, transfer.Checksum(b), err
			})
		}
		tiers, closeTiers, err := le.tiers(f, cache, ms)
		if err != nil {
			return err
		}
		defer closeTiers()
		eng = le.engine(f, scheduler.RoleDecode, ms, cache, tiers)
		var sums transfer.Sums // the transport's checksums of pages at Commit
		if f.transport == "cuda-ipc" || (f.transport == "ucx" && le.ucxDevice != nil) {
			// Summed on the GPU where they are: a ucx receiver made with
			// the pool's device memory announces kernels.PageSum, which
			// its senders claim their pages with.
			sums = transfer.DeviceSums
		}
		d := roles.NewDecode(roles.DecodeOptions{DecodeDesk: roles.DecodeDesk{Engine: eng, Pool: le.pool, Metrics: ms, Cache: cache, MaxSeq: le.plan.context, HandoffTimeout: f.handoffTimeout, Landing: le.landing, Sums: sums, MaxReservationsPerPeer: f.maxResPerPeer, MaxPagesPerPeer: f.maxPagesPeer.of(le.pool.NumPages(), le.pool.PagesFor(le.plan.context)), Log: le.log, Guards: guards.decode, Faults: guards.decodeFaults}, Layout: layout, ContextLength: le.plan.modelContext, Transport: f.transport, Auth: plane, Identity: le.identity()})
		addr := net.JoinHostPort(f.host, strconv.Itoa(f.transferPort))
		var recv transfer.Receiver
		if f.transport == "ucx" {
			opts := append(ucxOptions(f), ucx.WithMemory(le.region), ucx.WithHandshake(xfer))
			if le.ucxDevice != nil {
				opts = append(opts, le.ucxDevice)
			}
			recv, err = ucx.Listen(addr, d, le.transferKV(), opts...)
		} else {
			recvOpts := []tcp.Option{tcp.WithHandshake(xfer)}
			if f.transport == "cuda-ipc" {
				imp, err := le.ipcImporter()
				if err != nil {
					return err
				}
				recvOpts = append(recvOpts, tcp.WithPeerImporter(imp))
			}
			recv, err = tcp.Listen(addr, d, recvOpts...)
		}
		if err != nil {
			return err
		}
		defer recv.Close()
		d.SetReceiver(recv, grpcAddr, advertised(f, recv.Addr()))
		defer d.Close()
		pdv1.RegisterDecodeServer(gs, d)
		worker = d
		fmt.Fprintf(logw, "baton: transfer on %s\n", recv.Addr())
	}
	go func() { _ = gs.Serve(gln) }()
	defer gs.Stop()
	fmt.Fprintf(logw, "baton: grpc on %s\n", gln.Addr())

	engCtx, engStop := context.WithCancel(context.Background())
	engDone := make(chan struct{})
	go func() { eng.Run(engCtx); close(engDone) }()
	defer func() { engStop(); <-engDone }()

	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port)))
	if err != nil {
		return err
	}
	var ready roles.Readiness
	// stopTaking starts a drain (SIGTERM, or POST /drain): new work is
	// refused (the router retries it elsewhere) before /health turns 503,
	// so that nothing sent after the 503 is taken. A decode worker lets
	// what it runs go on for --drain-grace, then hands it back to the
	// router, which continues each request on another pair from the
	// tokens its client has (a request not committed yet is aborted, its
	// pages waiting for the writer's drain as after any abort); a prefill
	// worker finishes what it has.
	var drainOnce sync.Once
	var handBack *time.Timer
	var handBackMu sync.Mutex
	stopTaking := func() {
		drainOnce.Do(func() {
			worker.SetShuttingDown()
			ready.Drain()
			d, ok := worker.(*roles.Decode)
			if !ok {
				return
			}
			le.log.Info("draining: running requests go back to the router after the drain grace", "drain_grace", f.drainGrace)
			handBackMu.Lock()
			defer handBackMu.Unlock()
			handBack = time.AfterFunc(f.drainGrace, func() {
				if n := d.HandBack(); n > 0 {
					le.log.Info("drain grace over: handed running requests back to the router", "requests", n)
				}
			})
		})
	}
	defer func() {
		handBackMu.Lock()
		defer handBackMu.Unlock()
		if handBack != nil {
			handBack.Stop()
		}
	}()
	drain := func(ctx context.Context) {
		stopTaking()
		// What the worker still holds (on decode, until the hand-back)
		// ends, then the control plane closes.
		for worker.Busy() {
			select {
			case <-ctx.Done():
				le.log.Warn("shutdown timeout: aborting unfinished requests")
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		done := make(chan struct{})
		go func() { gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
		}
	}
	h := roles.HTTPHandler(worker, &ready, ms, roles.HTTPOptions{APIKey: f.apiKey, MetricsRequireKey: f.metricsKey, Drain: stopTaking, TransferPath: le.transferPath})
	return serveHTTP(ctx, f, logw, le.log, ln, h, ready.SetReady, drain)
}

// advertised is the address peers use for a listener: its port with
// --advertise-host when set (a pod IP behind 0.0.0.0), else as bound.
func advertised(f *serveFlags, addr string) string {
	if f.advertiseHost == "" {
		return addr
	}
	_, port, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(f.advertiseHost, port)
}

// identity is what this worker serves, for the router to compare.
func (le *loadedEngine) identity() roles.Identity {
	return roles.Identity{ServedModel: le.name, Tokenizer: le.tok.Fingerprint()}
}
