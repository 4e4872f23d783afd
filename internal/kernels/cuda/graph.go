package cuda

/*
#include "driver.h"
*/
import "C"

import (
	"fmt"
	"log/slog"
	"math/bits"
	"slices"
	"unsafe"
)

// Decode steps as CUDA graphs.
//
// A decode step queues a few hundred small kernels; on a fast GPU their
// launches, not the kernels, bound a small batch's step. So a step the
// model marks (BeginGraphStep .. EndGraphStep) is not queued as its calls
// come but recorded: each launch with its grid and argument values, each
// copy to the device with its destination and bytes (the data kept aside),
// each cuBLAS product with every argument it passes (blasCall). At its end
// the step's program is compared with the graph captured for its (model,
// rows) bucket: when every launch, every product and every copy's
// destination and size are the same, only the copied data differ, so the
// data go into the graph's own pinned buffer (where its copy nodes read
// them) and one cuGraphLaunch runs the step. A graph's kernels keep the
// argument values they were captured with; the program comparison is what
// makes a replay run exactly what a direct launch of the same step would.
//
// A cuBLAS product is captured as cuBLAS issues it on the capturing stream
// (its handle's stream is the backend's): as kernels whose arguments are
// fixed at capture, like ours. cuBLAS must not allocate inside a capture,
// so it gets a workspace of ours when it is opened (setBLASWorkspace),
// and a bucket's first step with products runs direct, so that cuBLAS
// chooses (and loads) its kernels for the bucket's shapes outside a
// capture. A cuBLAS without cublasSetWorkspace_v2 keeps the buckets above
// gemvMaxN rows, whose products go to cuBLAS, direct. That a captured product
// replays what a direct one computes is checked on the emulated driver,
// whose cuBLAS captures its products as graph nodes the same way, and by
// the model's check of every fresh graph, not yet on a GPU.
//
// The first step of a bucket, and one whose program differs (a table grew
// past its rounded size, a scratch buffer moved), is captured anew; the
// model pads the batch to its bucket, the tables a step copies are rounded
// up to a power of two and attention's splits come from the bucket rather
// than the longest sequence, so that a bucket's steps have one program.
//
// What cannot be a graph runs as before, its recorded calls queued in
// order: a step that reads back to the host (flushed there), a large
// copy, a driver without the graph entry points, a cuBLAS product without
// our workspace (see above), or a capture the driver or cuBLAS refused
// (logged once; the bucket then runs direct).
//
// A KV pool's page read orders itself after stores queued on the
// backend's stream; a graph step's stores are queued only at its end,
// which the engine reaches before it hands any page of that step to a
// transfer (a forward pass returns with its work queued, as before).

// DefaultGraphMaxBS is --cuda-graph-max-bs's default: the buckets 1, 2, 4,
// 8, 16, 24 and 32: SGLang's default range for small batches, where a
// step's kernels are short next to their launches; each bucket is
// another capture at its first step. Where launches stop mattering is not
// measured on a GPU.
const DefaultGraphMaxBS = 32

// maxCaptures bounds the captures of one bucket: a program that keeps
// changing would otherwise be captured at every step, slower than direct.
const maxCaptures = 16

type opKind uint8

const (
	opLaunch opKind = iota
	opCopy
	opBLAS
)

// stepOp is one recorded call of a step.
type stepOp struct {
	kind                opKind
	k, gx, gy, bx, smem int
	args                []uint64 // launch arguments
	dst                 dptr     // copy: destination
	off, bytes          int      // copy: its data in stepRec.host
	blas                blasCall
}

// stepRec is a step being recorded.
type stepRec struct {
	key  graphKey
	ops  []stepOp
	host []byte
	// why is set when the program cannot be a graph; warm when this one
	// program should not be (it copies in a whole activation buffer, as
	// the first steps do, and the next will not).
	why  string
	warm bool
	// products: the step calls cuBLAS.
	products bool
	// frees are scratch buffers the step outgrew: its earlier calls, not
	// queued yet, still use them.
	frees []dptr
	// args holds every launch's arguments (ops' args are slices of it),
	// so that recording a step allocates nothing once the buffers have
	// grown: a step's record is reused for the next unless a capture kept
	// it (graphState.spare).
	args []uint64
}

type graphKey struct {
	owner uint64
	rows  int
}

// stepGraph is a captured step.
type stepGraph struct {
	ops         []stepOp
	graph, exec uintptr
	host        unsafe.Pointer // pinned: the copies' sources
	hostLen     int
	syncAt      uint64 // b.syncs when last launched
	launched    bool
}

// graphState is the backend's graphs and their counters.
type graphState struct {
	maxBS  int // 0: graphs off
	log    *slog.Logger
	rec    *stepRec
	spare  *stepRec // the last step's record, for the next (recycle)
	graphs map[graphKey]*stepGraph
	// captures counts captures per bucket; off says why a bucket runs
	// direct from now on.
	captures map[graphKey]int
	off      map[graphKey]string
	warned   bool // the driver lacks the entry points: said once
	// blasWarned: buckets with cuBLAS products run direct for want of a
	// workspace (Backend.blasNoCapture), said once.
	blasWarned bool
	// blasRan marks the buckets whose products have run outside a
	// capture: cuBLAS chooses (and may load) its kernels for a shape at
	// the shape's first call, which should not happen inside a capture.
	blasRan map[graphKey]bool
	// syncs counts stream synchronisations (a graph's pinned buffer may be
	// rewritten once one followed its launch).
	syncs uint64
	// Counts the tests read.
	captured, replays, direct, nodes, failures int
	// syncInCapture: tests make every capture synchronise, as a step that
	// read back inside it would.
	syncInCapture bool
	// wrong counts the graphs the model's check caught.
	wrong int
}

// SetGraphs sets the largest batch a decode step runs as a CUDA graph
// (--cuda-graph-max-bs; 0 or less: none, --disable-cuda-graph) and where
// capture failures are logged (nil: slog's default).
func (b *Backend) SetGraphs(maxBS int, log *slog.Logger) {
	b.lock()
	defer b.unlock()
	b.dropGraphs()
	b.g.maxBS, b.g.log = max(maxBS, 0), log
}

func (b *Backend) logf(msg string, args ...any) {
	l := b.g.log
	if l == nil {
		l = slog.Default()
	}
	l.Warn(msg, args...)
}

// graphBucket is the rows a decode step of n rows is padded to, or 0.
func graphBucket(n, maxBS int) int {
	if n <= 0 || n > maxBS {
		return 0
	}
	if n <= 8 {
		return 1 << bits.Len(uint(n-1))
	}
	return min(roundUp(n, 8), maxBS)
}

// GraphRows is how many rows a decode step of n rows of model owner runs
// as (the batch padded with copies of its last row), or 0: run it as it
// is, unrecorded.
func (b *Backend) GraphRows(owner uint64, n int) int {
	b.lock()
	defer b.unlock()
	rows := graphBucket(n, b.g.maxBS)
	if rows == 0 {
		return 0
	}
	if !bool(C.bk_has_graphs(b.drv.c) != 0) {
		if !b.g.warned {
			b.g.warned = true
			b.logf("cuda graphs off: the driver lacks the graph entry points (cuStreamBeginCapture_v2 .. cuGraphDestroy)",
				"driver", b.drv.name)
		}
		return 0
	}
	if b.blas != nil && rows > b.gemvMax && b.blasWork == 0 {
		if !b.g.blasWarned {
			b.g.blasWarned = true
			b.logf("cuda graphs only up to the buckets without cuBLAS products: cuBLAS has no workspace of ours to capture them with",
				"rows", b.gemvMax, "reason", b.blasNoCapture)
		}
		return 0
	}
	if b.g.off[graphKey{owner, rows}] != "" {
		return 0
	}
	return rows
}

// BeginGraphStep starts recording a decode step of rows rows (GraphRows)
// of model owner; EndGraphStep runs it.
func (b *Backend) BeginGraphStep(owner uint64, rows int) {
	b.lock()
	defer b.unlock()
	if b.g.rec != nil {
		panic("cuda: BeginGraphStep inside a graph step")
	}
	// A table copied once and skipped by later layers must be copied in
	// every program alike, whatever the step before left; so must an
	// input rounded for a product.
	b.sent = [numScratch][]byte{}
	b.halfOf.x = 0
	rec := b.g.spare
	b.g.spare = nil
	if rec == nil {
		rec = &stepRec{}
	}
	*rec = stepRec{key: graphKey{owner, rows}, ops: rec.ops[:0], host: rec.host[:0], args: rec.args[:0]}
	b.g.rec = rec
}

// recycle keeps rec, whose calls have all been queued and whose ops no
// graph holds, for the next step's record.
func (b *Backend) recycle(rec *stepRec) {
	clear(rec.ops) // the argument slices of this step
	b.g.spare = rec
}

// EndGraphStep runs the step recorded since BeginGraphStep: as its
// bucket's graph, captured now if need be, or call by call. It says
// whether the step was a graph's first run, which the model checks against
// direct launches (GraphWrong).
func (b *Backend) EndGraphStep() (fresh bool) {
	b.lock()
	defer b.unlock()
	rec := b.g.rec
	b.g.rec = nil
	if rec == nil { // flushed: it ran call by call
		b.g.direct++
		return false
	}
	kept := false // a captured graph holds rec's ops
	defer func() {
		b.freeOutgrown(rec)
		if !kept {
			b.recycle(rec)
		}
	}()
	key := rec.key
	if g := b.g.graphs[key]; g != nil {
		if g.matches(rec) {
			b.replay(g, rec)
			return false
		}
		b.destroyGraph(g)
		delete(b.g.graphs, key)
	}
	if rec.why == "" && b.g.captures[key] >= maxCaptures {
		rec.why = fmt.Sprintf("its program changed after %d captures", maxCaptures)
	}
	if rec.products && !b.g.blasRan[key] {
		rec.warm = true // its first products run direct (blasRan)
	}
	if rec.why != "" || rec.warm {
		if rec.why != "" {
			b.turnOff(key, rec.why)
		}
		b.issue(rec)
		b.g.blasRan[key] = b.g.blasRan[key] || rec.products
		b.g.direct++
		return false
	}
	b.g.captures[key]++
	g, err := b.capture(rec)
	if err != nil {
		b.g.failures++
		b.turnOff(key, err.Error())
		b.issue(rec)
		b.g.direct++
		return false
	}
	b.g.graphs[key], kept = g, true
	b.replay(g, rec)
	return true
}

// GraphWrong turns a bucket's graphs off because one did not compute what
// its direct launches do, and says so once.
func (b *Backend) GraphWrong(owner uint64, rows int, why string) {
	b.lock()
	defer b.unlock()
	key := graphKey{owner, rows}
	if g := b.g.graphs[key]; g != nil {
		b.destroyGraph(g)
		delete(b.g.graphs, key)
	}
	b.g.wrong++
	b.turnOff(key, "a graph differed from direct launches: "+why)
}

// turnOff runs a bucket direct from now on, and says so once.
func (b *Backend) turnOff(key graphKey, why string) {
	if b.g.off[key] != "" {
		return
	}
	b.g.off[key] = why
	b.logf("cuda graph off for a decode bucket; its steps launch directly", "rows", key.rows, "reason", why)
}

// matches says whether rec's program is g's: the same launches with the
// same arguments, the same copies (destination and size) and the same
// cuBLAS calls (every argument).
func (g *stepGraph) matches(rec *stepRec) bool {
	if len(g.ops) != len(rec.ops) || rec.why != "" || rec.warm {
		return false
	}
	for i := range g.ops {
		a, o := &g.ops[i], &rec.ops[i]
		if a.kind != o.kind {
			return false
		}
		switch a.kind {
		case opLaunch:
			if a.k != o.k || a.gx != o.gx || a.gy != o.gy || a.bx != o.bx || a.smem != o.smem || !slices.Equal(a.args, o.args) {
				return false
			}
		case opCopy:
			if a.dst != o.dst || a.bytes != o.bytes || a.off != o.off {
				return false
			}
		case opBLAS:
			if a.blas != o.blas {
				return false
			}
		default:
			return false
		}
	}
	return true
}

// record notes a call of the step being recorded.
func (r *stepRec) launch(k, gx, gy, bx, smem int, args []uint64) {
	at := len(r.args)
	r.args = append(r.args, args...)
	r.ops = append(r.ops, stepOp{kind: opLaunch, k: k, gx: gx, gy: gy, bx: bx, smem: smem, args: r.args[at:len(r.args):len(r.args)]})
}

// copyTo records a copy of bytes bytes to dst from src, of which have
// bytes exist (the rest is zeros).
func (r *stepRec) copyTo(dst dptr, src unsafe.Pointer, have, bytes int) {
	if bytes > stageMax {
		r.why = fmt.Sprintf("a copy of %d bytes", bytes)
	}
	old, off := len(r.host), roundUp(len(r.host), 16)
	r.host = slices.Grow(r.host, off+bytes-old)[:off+bytes]
	clear(r.host[old:])
	copy(r.host[off:], unsafe.Slice((*byte)(src), have))
	r.ops = append(r.ops, stepOp{kind: opCopy, dst: dst, off: off, bytes: bytes})
}

// tableBytes is the size a table of bytes bytes is copied as in a graph
// step: rounded up, so that a step whose tables grew a little still has
// its bucket's program.
func tableBytes(bytes int) int {
	if bytes <= 256 {
		return 256
	}
	return 1 << bits.Len(uint(bytes-1))
}

// flush queues the step recorded so far call by call (something needs
// the device now: a read back, a synchronisation); the rest of the step
// then runs directly too.
func (b *Backend) flush() {
	if rec := b.g.rec; rec != nil {
		b.g.rec = nil
		b.issue(rec)
		b.freeOutgrown(rec)
		b.recycle(rec)
	}
}

// freeOutgrown frees the scratch buffers rec outgrew, once its calls ran.
func (b *Backend) freeOutgrown(rec *stepRec) {
	if len(rec.frees) == 0 {
		return
	}
	b.sync()
	for _, p := range rec.frees {
		b.free(p)
	}
	rec.frees = nil
}

// issue queues a recorded program call by call.
func (b *Backend) issue(rec *stepRec) {
	for i := range rec.ops {
		o := &rec.ops[i]
		switch o.kind {
		case opLaunch:
			b.launchNow(o.k, o.gx, o.gy, o.bx, o.smem, o.args)
		case opCopy:
			b.h2dNow(o.dst, unsafe.Pointer(&rec.host[o.off]), o.bytes)
		case opBLAS:
			if err := b.blasNow(&o.blas); err != nil {
				panic(err)
			}
		}
	}
}

// capture makes rec's program a graph. Its copies read from a pinned
// buffer of the graph's own; nothing inside the capture synchronises.
func (b *Backend) capture(rec *stepRec) (_ *stepGraph, err error) {
	d := b.drv.c
	g := &stepGraph{ops: rec.ops, hostLen: max(len(rec.host), 1)}
	if r := C.bk_host_alloc(d, &g.host, C.size_t(g.hostLen)); r != 0 {
		return nil, b.drv.check("cuMemHostAlloc (a graph's copy sources)", r)
	}
	defer func() {
		if err != nil {
			b.destroyGraph(g)
		}
	}()
	if err := b.drv.check("cuStreamBeginCapture", C.bk_capture_begin(d, C.uintptr_t(b.stream))); err != nil {
		return nil, err
	}
	var first error
	note := func(op string, r C.bk_res) {
		if first == nil {
			first = b.drv.check(op, r)
		}
	}
	for i := range rec.ops {
		o := &rec.ops[i]
		switch o.kind {
		case opLaunch:
			note(launchOp[o.k], C.bk_launch(d, C.uintptr_t(b.fn[o.k]), C.uint(o.gx), C.uint(o.gy),
				C.uint(o.bx), C.uint(o.smem), C.uintptr_t(b.stream), (*C.uint64_t)(unsafe.Pointer(&o.args[0])), C.int(len(o.args))))
		case opCopy:
			note("cuMemcpyHtoDAsync", C.bk_htod(d, C.bk_dptr(o.dst), unsafe.Add(g.host, o.off), C.size_t(o.bytes), C.uintptr_t(b.stream)))
		case opBLAS:
			if err := b.blasNow(&o.blas); err != nil && first == nil {
				first = err
			}
		}
	}
	if b.g.syncInCapture {
		note("cuStreamSynchronize", C.bk_stream_sync(d, C.uintptr_t(b.stream)))
	}
	var graph C.uintptr_t
	r := C.bk_capture_end(d, C.uintptr_t(b.stream), &graph) // always: the stream leaves capture mode
	g.graph = uintptr(graph)
	if first != nil {
		return nil, first
	}
	if err := b.drv.check("cuStreamEndCapture", r); err != nil {
		return nil, err
	}
	var exec C.uintptr_t
	if err := b.drv.check("cuGraphInstantiateWithFlags", C.bk_graph_instantiate(d, &exec, graph)); err != nil {
		return nil, err
	}
	g.exec = uintptr(exec)
	b.g.captured++
	b.g.nodes += len(rec.ops)
	return g, nil
}

// replay runs g with rec's data.
func (b *Backend) replay(g *stepGraph, rec *stepRec) {
	if g.launched && g.syncAt == b.g.syncs {
		b.sync() // the last launch may still read the pinned buffer
	}
	copy(unsafe.Slice((*byte)(g.host), g.hostLen), rec.host)
	b.halfOf.x = 0
	b.must("cuGraphLaunch", C.bk_graph_launch(b.drv.c, C.uintptr_t(g.exec), C.uintptr_t(b.stream)))
	g.launched, g.syncAt = true, b.g.syncs
	b.g.replays++
}

// destroyGraph frees g (nothing queued may use it).
func (b *Backend) destroyGraph(g *stepGraph) {
	d := b.drv.c
	if g.launched && g.syncAt == b.g.syncs {
		b.sync()
	}
	if g.exec != 0 {
		C.bk_graph_exec_destroy(d, C.uintptr_t(g.exec))
		g.exec = 0
	}
	if g.graph != 0 {
		C.bk_graph_destroy(d, C.uintptr_t(g.graph))
		g.graph = 0
	}
	if g.host != nil {
		C.bk_host_free(d, g.host)
		g.host = nil
	}
}

// dropGraphs frees every graph.
func (b *Backend) dropGraphs() {
	for _, g := range b.g.graphs {
		b.destroyGraph(g)
	}
	b.g.graphs, b.g.captures, b.g.off = map[graphKey]*stepGraph{}, map[graphKey]int{}, map[graphKey]string{}
	b.g.blasRan = map[graphKey]bool{}
}
