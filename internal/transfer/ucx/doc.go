// Package ucx is the one-sided KV transport: the decode side registers its
// KV pool with UCX once and hands the prefill side a remote key; the
// prefill side writes every page straight into the reserved page with
// ucp_put_nbx and flushes its endpoint (ucp_ep_flush_nbx) before Flush or
// Close returns. On InfiniBand/RoCE UCX uses RDMA verbs; on one host shared
// memory (posix, sysv) or, with UCX_TLS=tcp, TCP.
//
// Everything UCX is behind the build tag `ucx` (cgo against Debian's
// libucx-dev, UCX 1.13). Without the tag the package still builds, with
// Enabled false and every constructor returning ErrNotBuilt, so callers
// need no build tags of their own.
//
// # Bootstrap and control
//
// api/pd is unchanged: Reservation.transfer_addr is a TCP address where the
// receiver serves a small control protocol (proto.go), one connection per
// session. The sender says HELLO(room, epoch, capability); the receiver
// asks its Sink (Admit) whether the reservation is live and
// answers WELCOME with its UCX worker address, the packed remote key, the
// base address and length of the registered memory, the KV layout, the
// page checksum it verifies Commit with, and the reservation's page ids,
// or REFUSE with the reason. This costs one round
// trip per session (the gRPC Reserve reply could carry the same bytes, but
// then the proto, the router and every hop must pass them on), and gives
// each session a connection whose end the receiver sees.
//
// # Writes
//
// The sender checks every write against the reservation the receiver
// described (index, page id, tokens, payload size) before it issues a
// put, and reports refusals from Flush as transfer.ErrRefused, as tcp
// does. A full page is one put (its packed rows are the page's memory); a
// partial last page is 2*layers puts, tokens rows each, at the start of
// every layer's K and V block (kernels.PagedKV.KOffset/VOffset on the
// decode layout). Puts read the payload in place (pinned until UCX is done
// with it); Write blocks while more than WithMaxInFlight bytes are not yet
// complete locally.
//
// A Sender made WithArena (a kernels.Arena in GPU memory, also a
// kernels.DeviceRange) registers the arena with its context, and its
// sessions are transfer.Stagers: for a receiver that verifies with
// kernels.PageSum the pages are packed and summed on the device into a
// span of the arena (internal/transfer/arenaspace, shared with tcp's
// cuda-ipc), and Write waits for the staging and puts from the arena's
// device address, with the same spans. The session's spans are reused
// once its Close flushed the endpoint (no put reads them any more), else
// after a quarantine (WithArenaQuarantine). Without an arena, for an xxh3
// receiver, or with the arena full, pages are packed into host memory and
// put from there.
//
// Sessions to one receiver share one endpoint and remote key per Sender
// (a new endpoint per request would pay UCX's wire-up and, on shared
// memory, the mapping of the whole pool every time). Flush and Close
// therefore flush that endpoint: when they return, every put this session
// issued is remotely complete (and some of other sessions' too). Idle
// endpoints are destroyed past a bound and by Sender.Close.
//
// # What the decode side learns
//
// Puts are one-sided, so the receiver's Sink never sees a frame: its Write
// is never called (the Receiver implements transfer.OneSided). Decode
// learns what landed from the memory itself: at Commit it recomputes each
// page's checksum over the page contents and marks the pages written only
// if every checksum matches. The checksum is the one the WELCOME named:
// xxh3 of the pages read back into host memory, or, for a pool in device
// memory (WithDeviceMemory), kernels.PageSum computed on the GPU where the
// pages are (transfer.DeviceSums), in one batch for the reservation.
//
// Sink.Closed is called at most once per session, only with a proof, and
// before the receiver closes the control connection:
//   - the sender's Close flushed the endpoint (remote completion of every
//     put) and only then sent END;
//   - a session refused at admission ended (it never got the key).
//
// A session that ends without END (a sender that crashed, was aborted or
// cut off) gives no proof, and Closed is not called: UCX 1.13 cannot tell
// the receiver that a sender's puts are over. Its shm transports have no
// peer-failure handling at all (an endpoint asking for
// UCP_ERR_HANDLING_MODE_PEER is refused: "no peer failure handler"), and
// puts into Go memory on one host, and all puts over tcp, travel as active
// messages that the receiver's own progress applies, so a dead sender's
// last puts can still land after its process is gone. The pages then stay
// quarantined until prefill says Drained. Receiver.Close asks every open
// session's sender to end (CLOSING), which brings END and Closed for those
// that answer within the close timeout.
//
// # Memory
//
// The receiver registers the pool memory once (ucp_mem_map). Two kinds:
//   - Go memory (the kvpool slice): pinned with runtime.Pinner, so that C
//     may keep its address (Go's collector does not move heap objects, and
//     a pinned one is not freed); the pool is allocated once and never
//     reallocated. On one host UCX 1.13 cannot map such memory into the
//     sender (posix/sysv only map what they allocated, and cma is not used
//     for RMA), so it emulates the puts with active messages that the
//     receiver's progress goroutine copies in.
//   - memory from AllocKV (ucp_mem_map with UCP_MEM_MAP_ALLOCATE): UCX puts
//     it in shared memory, the sender maps it and its CPU stores land
//     directly, with no receiver involvement: one-sided for real, and
//     faster. The KV pool must then use that memory instead of its own.
//   - a pool outside Go memory (WithDeviceMemory, kernels.DeviceRange): a
//     GPU pool, registered as CUDA memory where the UCX build can
//     (CUDAMemory), so puts land in GPU memory with no host copy; or the
//     emulated driver's device memory, which is host memory and is
//     registered as such.
//
// # Threads
//
// Each Sender and Receiver owns a UCX worker (UCS_THREAD_MODE_SINGLE) that
// only its progress goroutine touches, locked to its OS thread. It sleeps
// on the worker's event fd when idle (WithSpin makes it poll a while
// first). Callers hand it commands and wait on channels with their own
// contexts or timeouts; the only cgo calls on a caller's goroutine are
// bounded context-level ones (ucp_init, memory registration, key packing).
package ucx
