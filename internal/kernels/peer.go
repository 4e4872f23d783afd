package kernels

// Pages from device to device between processes on one node (CUDA IPC).
//
// A prefill worker stages the packed pages it ships (PackPage's layout) in
// an Arena: device memory of its own, apart from its pool, that the decode
// worker maps by the arena's handle and copies from into the pages it
// reserved. The arena, not the pool, is what is exported: whoever holds
// the handle reads and writes the arena, and the arena only ever holds
// pages on their way to a decode worker, never a page of the pool another
// request still owns.

// PeerExporter is a DeviceKV whose pages can be staged for another process
// on the same node.
type PeerExporter interface {
	// NewArena allocates bytes of device memory another process can map.
	NewArena(bytes int) (Arena, error)
}

// Arena is exportable device memory, made by PeerExporter.NewArena.
type Arena interface {
	// Handle names the arena for OpenPeer in another process. It is a
	// secret: whoever holds it can read and write the arena.
	Handle() []byte
	// Size is the arena's size in bytes.
	Size() int
	// Stage queues the packing of the first tokens[i] slots of pool page
	// pages[i] into the arena at byte offset offs[i] (after the kernels
	// queued before it that store into those pages), and of each page's
	// PageSum, computed on the device (only the sums come back to the
	// host), and returns without waiting for them: the caller (a prefill
	// engine loop) goes on with the next chunk while the device packs. The
	// arena holds the rows, and nobody may be told where they are, once
	// the Staging's Wait returned nil. Kernels queued on the pool after
	// Stage returns (a later chunk's, another request's reusing a page)
	// run after the packs: a page is not rewritten while it is packed.
	Stage(pages []int32, tokens []int, offs []int) (Staging, error)
	// Close frees the memory. A peer that still maps it keeps its mapping
	// valid (the driver counts the references), so Close is safe at any
	// time; reusing the bytes is not, which is the caller's to order.
	Close() error
}

// Staging is an Arena.Stage under way on the device.
type Staging interface {
	// Wait blocks until the packs and the sums are done and returns each
	// page's PageSum. It may be called more than once, from any
	// goroutine; each call returns what the first did. The first call
	// frees what the staging holds, so every Staging is to be waited for.
	Wait() ([]uint64, error)
}

// PeerImporter is a DeviceKV that copies pages out of another process's
// Arena.
type PeerImporter interface {
	// OpenPeer maps the arena handle names. An error says the handle is
	// not an arena this process can map (garbage, another node, a freed
	// arena where the driver can tell).
	OpenPeer(handle []byte) (PeerMemory, error)
}

// PeerMemory is another process's arena mapped into this one.
type PeerMemory interface {
	// Size is the mapped size in bytes, as the driver reports it (not as
	// the peer claims it).
	Size() int
	// QueuePage takes the copy of the PackedBytes(tokens) bytes at byte
	// offset off into the first tokens slots of page of the importer's
	// pool, checked now and issued by the next Drain (or Close), and
	// returns without waiting: a receiver landing a batch of pages pays
	// one wait (Drain) for the batch rather than one a page, and a run of
	// consecutive full pages moves as one copy. Until Drain returned nil
	// the rows are not known to be in place, and the copy may still read
	// the arena.
	QueuePage(page int32, tokens int, off int) error
	// Drain issues the copies taken so far (from every session of the
	// mapping), queued on the importer's pool behind what is queued there,
	// and waits for every copy on the pool. An error means a copy taken
	// since the last Drain may not have landed.
	Drain() error
	// CopyPage is QueuePage then Drain: the rows are in place, for every
	// kernel queued later, and no copy of them is in flight, when it
	// returns.
	CopyPage(page int32, tokens int, off int) error
	// Close unmaps it, once the copies taken from it are done (it issues
	// those not issued yet); no QueuePage or CopyPage may be running.
	Close() error
}

// DeviceRange is a DeviceKV held as one range of device memory whose pages
// are laid out as PagedKV's (KOffset, VOffset): a one-sided transport
// registers the range and writes pages straight into it, device memory to
// device memory where the NIC reaches GPU memory (GPUDirect RDMA).
type DeviceRange interface {
	// Range is the pool's device address and size in bytes. hostVisible
	// says the address is host memory of this process as well, as on an
	// emulated driver (test/gpu's fake libcuda), where a transport may
	// register it as host memory.
	Range() (addr uintptr, bytes int, hostVisible bool)
}
