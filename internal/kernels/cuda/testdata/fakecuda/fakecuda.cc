// fakecuda.cc: a fake libcuda.so.1 for the Go tests of internal/kernels/cuda.
//
// It implements the part of the CUDA driver API the backend uses on the
// CPU: "device" memory is host memory (each allocation ends at a
// PROT_NONE guard page and starts filled with 0xff bytes, a NaN, so reads
// past the end fault and reads of unwritten memory show), streams are
// synchronous, and cuLaunchKernel runs the kernels of ../../kernels/baton.cu
// compiled for the CPU with bk_emu.h (each block's threads as fibers).
//
// Environment knobs for the error paths: FAKE_CUDA_DRIVER_VERSION (default
// 12040), FAKE_CUDA_INIT_ERROR (a CUresult cuInit returns), FAKE_CUDA_DEVICES
// (default 1), FAKE_CUDA_CC (default "9.0"), FAKE_CUDA_SMS (default 4),
// FAKE_CUDA_LAUNCH_ERROR (a CUresult every launch returns). With
// FAKE_CUDA_NULL_KERNELS=1 launches and cuBLAS products do nothing and
// allocations start zeroed: what is left of a step is the host's side of
// it, the ceiling a GPU's speed cannot lift (test/gpu/host-ceiling.sh;
// its outputs are zeros, not the model's). Built with
// -DFAKE_NO_PRIMARY it lacks the primary-context calls (an old or odd driver),
// with -DFAKE_NO_IPC the CUDA IPC calls, with -DFAKE_NO_GRAPHS the graph entry points.
//
// CUDA IPC works across processes: exporting an allocation moves it into a
// memfd, and another process (of the same user) maps that file through
// /proc/<pid>/fd of the exporter. See "CUDA IPC" below.
//
// Stream capture records what a real driver's capture records: a launch
// with a copy of its argument bytes taken then (a replay reuses them), a
// copy with its pointers (a replay reads the source as it is then), memsets
// and event records; a call that would synchronise during a capture fails
// with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and spoils the capture, as
// does an async copy from host memory that cuMemHostAlloc did not give.
// The fake cuBLAS queues its products through the stream (fakeabi.h), so
// one on a capturing stream is captured like a launch: its arguments
// copied then, the product computed at each launch of the graph.
//
// Built with -DFAKE_DEFERRED (dir/deferred) streams are asynchronous as a
// GPU's are: launches, async copies, memsets, event records and waits are
// queued per stream and run only when something waits for them (a stream
// or event synchronise, a synchronous copy, a free, an export), each
// stream in its order and across streams only as cuStreamWaitEvent orders
// them. So a missing wait, which the synchronous streams hide, shows as
// wrong data. An async copy from pageable host memory takes the bytes at
// the call (as the driver stages them), one into pageable memory waits
// for its stream, and pinned memory is read or written when the copy runs.
#include "baton.cu"
#include "fakeabi.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

dim3 threadIdx, blockIdx, blockDim, gridDim;

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

namespace {

// ---- fibers ----

enum State { RUN, WAIT_WARP, WAIT_BLOCK, DONE };
constexpr size_t kStack = 256 << 10;
constexpr int kMaxThreads = 1024;

struct Fiber {
  char* stack = nullptr;
  State state = DONE;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
};

Fiber fibers[kMaxThreads];
int nfibers, cur;
std::function<void()> body;
std::vector<unsigned char> dynSmem;
uint64_t warpSlots[kMaxThreads / 32][32];
const char* failure;  // set when a block cannot finish

#if defined(__x86_64__)
void* schedSP;
extern "C" void bk_emu_switch(void** save, void* load);
asm(R"(
.text
.globl bk_emu_switch
.hidden bk_emu_switch
.type bk_emu_switch,@function
bk_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size bk_emu_switch, .-bk_emu_switch
)");
void yieldToScheduler() { bk_emu_switch(&fibers[cur].sp, schedSP); }
void resume(int i) { bk_emu_switch(&schedSP, fibers[i].sp); }
#else
ucontext_t schedCtx;
void yieldToScheduler() { swapcontext(&fibers[cur].ctx, &schedCtx); }
void resume(int i) { swapcontext(&schedCtx, &fibers[i].ctx); }
#endif

void fiberMain() {
  body();
  fibers[cur].state = DONE;
  yieldToScheduler();
  abort();  // a finished fiber is never resumed
}

void startFiber(int i) {
  Fiber& f = fibers[i];
  if (!f.stack) f.stack = static_cast<char*>(malloc(kStack));
  f.state = RUN;
#if defined(__x86_64__)
  uintptr_t top = (reinterpret_cast<uintptr_t>(f.stack) + kStack) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 64);
  for (int k = 0; k < 6; k++) sp[k] = nullptr;  // r15 r14 r13 r12 rbx rbp
  sp[6] = reinterpret_cast<void*>(&fiberMain);  // "return" address
  sp[7] = nullptr;
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = kStack;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiberMain, 0);
#endif
}

void setThreadIdx(int i) {
  threadIdx.x = i % blockDim.x;
  threadIdx.y = (i / blockDim.x) % blockDim.y;
  threadIdx.z = i / (blockDim.x * blockDim.y);
}

// runBlock runs every thread of the current block to completion.
bool runBlock() {
  for (int i = 0; i < nfibers; i++) startFiber(i);
  memset(dynSmem.data(), 0xff, dynSmem.size());
  for (;;) {
    for (int i = 0; i < nfibers; i++) {
      if (fibers[i].state != RUN) continue;
      cur = i;
      setThreadIdx(i);
      resume(i);
    }
    // Everyone is at a barrier or done: release what can go on.
    bool released = false;
    for (int w = 0; w * 32 < nfibers; w++) {
      int live = 0, atWarp = 0;
      for (int i = w * 32; i < nfibers && i < w * 32 + 32; i++) {
        if (fibers[i].state != DONE) live++;
        if (fibers[i].state == WAIT_WARP) atWarp++;
      }
      if (live > 0 && atWarp == live) {
        for (int i = w * 32; i < nfibers && i < w * 32 + 32; i++)
          if (fibers[i].state == WAIT_WARP) fibers[i].state = RUN;
        released = true;
      }
    }
    if (released) continue;
    int live = 0, atBlock = 0;
    for (int i = 0; i < nfibers; i++) {
      if (fibers[i].state != DONE) live++;
      if (fibers[i].state == WAIT_BLOCK) atBlock++;
    }
    if (live == 0) return true;
    if (atBlock != live) {
      failure = "deadlock: threads of one warp wait at different barriers (divergent shuffle or __syncthreads)";
      return false;
    }
    for (int i = 0; i < nfibers; i++)
      if (fibers[i].state == WAIT_BLOCK) fibers[i].state = RUN;
  }
}

// ---- kernel registry ----

struct Kernel {
  std::string name;
  std::function<std::function<void()>(void**)> bind;
};

template <typename... A, size_t... I>
std::function<void()> bindArgs(void (*f)(A...), void** p, std::index_sequence<I...>) {
  // Copy the arguments now, as cuLaunchKernel does.
  auto args = std::make_tuple(*static_cast<std::remove_cv_t<std::remove_reference_t<A>>*>(p[I])...);
  return [f, args]() { f(std::get<I>(args)...); };
}

template <typename... A>
Kernel makeKernel(const char* name, void (*f)(A...)) {
  return Kernel{name, [f](void** p) { return bindArgs(f, p, std::index_sequence_for<A...>{}); }};
}

// nullKernels: FAKE_CUDA_NULL_KERNELS=1 (see the top).
bool nullKernels() {
  static const bool on = [] {
    const char* v = getenv("FAKE_CUDA_NULL_KERNELS");
    return v && v[0] == '1';
  }();
  return on;
}

// runGrid runs a bound kernel body on a grid (mu held).
void runGrid(Kernel* k, std::function<void()> b, dim3 grid, dim3 block, unsigned smem) {
  if (nullKernels()) return;
  body = std::move(b);
  gridDim = grid;
  blockDim = block;
  nfibers = (int)(block.x * block.y * block.z);
  dynSmem.assign(smem, 0xff);
  for (unsigned z = 0; z < grid.z; z++)
    for (unsigned y = 0; y < grid.y; y++)
      for (unsigned x = 0; x < grid.x; x++) {
        blockIdx = dim3{x, y, z};
        if (!runBlock()) {
          fprintf(stderr, "fakecuda: %s in %s block (%u,%u,%u)\n", failure, k->name.c_str(), x, y, z);
          abort();
        }
      }
}

std::vector<Kernel>& registry() {
  static std::vector<Kernel> r = {
#define BK_REG(k) makeKernel(#k, k),
      BK_KERNELS(BK_REG)
#undef BK_REG
  };
  return r;
}

// ---- memory ----

struct Alloc {
  void* map;
  size_t mapLen;
  size_t size;   // as asked for
  int fd;        // the memfd the allocation lives in once exported, else -1
  char tag[16];  // the export's random tag, in hex in the memfd's name
};
std::mutex mu;  // one launch or allocation at a time
std::map<CUdeviceptr, Alloc> allocs;

// A peer's allocation mapped by cuIpcOpenMemHandle_v2, by its body's address.
struct Mapping {
  void* map;
  size_t mapLen;
  size_t size;
};
std::map<CUdeviceptr, Mapping> opened;

int envInt(const char* name, int def) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : def;
}

struct Event {
  std::chrono::steady_clock::time_point t;
  // Deferred streams: the stream of the last record, and how many records
  // were made and have run.
  void* stream = nullptr;
  unsigned long long recorded = 0, reached = 0;
};

// ---- deferred streams (FAKE_DEFERRED) ----

#ifdef FAKE_DEFERRED
constexpr bool kDeferred = true;
#else
constexpr bool kDeferred = false;
#endif

std::recursive_mutex qMu;  // the queues, and the running of what they hold
std::map<void*, std::vector<std::function<void()>>> queues;

// later runs fn now, or with deferred streams when stream's work up to
// here is waited for.
void later(void* stream, std::function<void()> fn) {
  if (!kDeferred || !stream) {
    fn();
    return;
  }
  std::lock_guard<std::recursive_mutex> l(qMu);
  queues[stream].push_back(std::move(fn));
}

// runSome runs stream's queued work in order until done says stop (or
// the queue is empty).
void runSome(void* stream, const std::function<bool()>& done) {
  std::lock_guard<std::recursive_mutex> l(qMu);
  auto& q = queues[stream];
  while (!q.empty() && !done()) {
    auto fn = std::move(q.front());
    q.erase(q.begin());
    fn();
  }
}

void drainStream(void* stream) {
  runSome(stream, [] { return false; });
}

// drainAll runs every stream's work: what a synchronous call waits for
// (legacy default-stream semantics).
void drainAll() {
  std::lock_guard<std::recursive_mutex> l(qMu);
  for (bool more = true; more;) {
    more = false;
    for (auto& q : queues) {
      if (!q.second.empty()) {
        drainStream(q.first);
        more = true;
      }
    }
  }
}

// reach runs e's stream up to e's record number n.
void reach(Event* e, unsigned long long n) {
  if (!e->stream) return;
  runSome(e->stream, [e, n] { return e->reached >= n; });
}

// ---- stream capture ----

struct Node {
  enum Kind { KERNEL, COPY, MEMSET, EVENT, CALL } kind;
  Kernel* k;
  std::function<void()> bound;  // the arguments as they were at capture (KERNEL, CALL)
  dim3 grid, block;
  unsigned smem;
  void* dst;
  const void* src;
  size_t n;
  unsigned value;
  Event* event;
};

struct Graph {
  std::vector<Node> nodes;
  bool invalid = false;  // an unsupported call during the capture
  std::thread::id owner;  // the thread that began it (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
};

constexpr CUresult kCaptureUnsupported = 900;  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
constexpr CUresult kCaptureInvalidated = 901;  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED

std::recursive_mutex capMu;
std::map<void*, Graph*> captures;  // by stream
std::map<uintptr_t, size_t> pinned;  // cuMemHostAlloc's blocks: start -> length

Graph* capturing(void* stream) {
  std::lock_guard<std::recursive_mutex> l(capMu);
  auto it = captures.find(stream);
  return it == captures.end() ? nullptr : it->second;
}

// anyCapture: this thread has a capture in progress. Only its own
// unsafe calls spoil it, as in CU_STREAM_CAPTURE_MODE_THREAD_LOCAL.
bool anyCapture() {
  std::lock_guard<std::recursive_mutex> l(capMu);
  for (auto& c : captures)
    if (c.second->owner == std::this_thread::get_id()) return true;
  return false;
}

// refuse spoils this thread's captures: the call would synchronise (a
// legacy-stream copy, an allocation, a wait for an event).
CUresult refuse() {
  std::lock_guard<std::recursive_mutex> l(capMu);
  for (auto& c : captures)
    if (c.second->owner == std::this_thread::get_id()) c.second->invalid = true;
  return kCaptureUnsupported;
}

bool isPinned(const void* p, size_t n) {
  std::lock_guard<std::recursive_mutex> l(capMu);
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = pinned.upper_bound(a);
  if (it == pinned.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

// captureCopy records an async copy on a capturing stream; host is its
// host side (nullptr for device to device), which must be pinned.
CUresult captureCopy(Graph* g, void* dst, const void* src, size_t n, const void* host) {
  if (host && !isPinned(host, n)) {
    g->invalid = true;
    return kCaptureUnsupported;
  }
  Node nd{};
  nd.kind = Node::COPY;
  nd.dst = dst;
  nd.src = src;
  nd.n = n;
  g->nodes.push_back(nd);
  return 0;
}

// bkfake_enqueue and streamCapturing are every fake stream's hooks for
// the fake cuBLAS (fakeabi.h).
int bkfake_enqueue(void* stream, void (*fn)(const void*), const void* arg, size_t argBytes) {
  if (nullKernels()) return 0;
  if (Graph* g = capturing(stream)) {
    std::vector<unsigned char> bytes(static_cast<const unsigned char*>(arg),
                                     static_cast<const unsigned char*>(arg) + argBytes);
    Node nd{};
    nd.kind = Node::CALL;
    nd.bound = [fn, bytes]() { fn(bytes.data()); };
    g->nodes.push_back(nd);
    return 0;
  }
  if (kDeferred) {
    std::vector<unsigned char> bytes(static_cast<const unsigned char*>(arg),
                                     static_cast<const unsigned char*>(arg) + argBytes);
    later(stream, [fn, bytes] {
      std::lock_guard<std::mutex> l(mu);
      fn(bytes.data());
    });
    return 0;
  }
  std::lock_guard<std::mutex> l(mu);
  fn(arg);
  return 0;
}

int streamCapturing(void* stream) { return capturing(stream) != nullptr; }

}  // namespace

void* bk_emu_dyn_smem() { return dynSmem.data(); }

void __syncthreads() {
  fibers[cur].state = WAIT_BLOCK;
  yieldToScheduler();
}

void bk_emu_syncwarp(unsigned mask) {
  if (mask != 0xffffffffu) {
    fprintf(stderr, "fakecuda: shuffle with a partial mask %#x is not emulated\n", mask);
    abort();
  }
  fibers[cur].state = WAIT_WARP;
  yieldToScheduler();
}

uint64_t* bk_emu_warp_slots() {
  unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return warpSlots[tid / 32];
}

extern "C" {

CUresult cuDriverGetVersion(int* v) {
  *v = envInt("FAKE_CUDA_DRIVER_VERSION", 12040);
  return 0;
}
CUresult cuInit(unsigned) { return envInt("FAKE_CUDA_INIT_ERROR", 0); }
CUresult cuDeviceGetCount(int* n) {
  *n = envInt("FAKE_CUDA_DEVICES", 1);
  return 0;
}
CUresult cuDeviceGet(int* d, int i) {
  if (i < 0 || i >= envInt("FAKE_CUDA_DEVICES", 1)) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *d = i;
  return 0;
}
CUresult cuDeviceGetAttribute(int* v, int attr, int) {
  const char* cc = getenv("FAKE_CUDA_CC");
  int major = 9, minor = 0;
  if (cc && *cc) sscanf(cc, "%d.%d", &major, &minor);
  switch (attr) {
    case 75: *v = major; break;
    case 76: *v = minor; break;
    case 16: *v = envInt("FAKE_CUDA_SMS", 4); break;
    case 8: *v = 48 << 10; break;
    default: *v = 0;
  }
  return 0;
}
CUresult cuDeviceGetName(char* name, int len, int) {
  snprintf(name, len, "Fake CUDA device (CPU emulation)");
  return 0;
}
CUresult cuDeviceTotalMem_v2(size_t* b, int) {
  struct sysinfo si;
  sysinfo(&si);
  *b = (size_t)si.totalram * si.mem_unit;
  return 0;
}
CUresult cuMemGetInfo_v2(size_t* freeB, size_t* total) {
  struct sysinfo si;
  sysinfo(&si);
  *freeB = (size_t)si.freeram * si.mem_unit;
  *total = (size_t)si.totalram * si.mem_unit;
  return 0;
}
CUresult cuCtxCreate_v2(void** ctx, unsigned, int) {
  *ctx = new int(1);
  return 0;
}
CUresult cuCtxDestroy_v2(void* ctx) {
  delete static_cast<int*>(ctx);
  return 0;
}
CUresult cuCtxSetCurrent(void* ctx) { return ctx ? 0 : 201; }  // CUDA_ERROR_INVALID_CONTEXT
// The primary context, refcounted; left out with -DFAKE_NO_PRIMARY.
#ifndef FAKE_NO_PRIMARY
int primaryRefs;
CUresult cuDevicePrimaryCtxRetain(void** ctx, int) {
  static int primary = 1;
  primaryRefs++;
  *ctx = &primary;
  return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(int) {
  if (primaryRefs <= 0) return 201;
  primaryRefs--;
  return 0;
}
#endif
CUresult cuModuleLoadData(void** mod, const void*) {
  *mod = new int(2);
  return 0;
}
CUresult cuModuleUnload(void* mod) {
  delete static_cast<int*>(mod);
  return 0;
}
CUresult cuModuleGetFunction(void** fn, void*, const char* name) {
  for (Kernel& k : registry()) {
    if (k.name == name) {
      *fn = &k;
      return 0;
    }
  }
  return 500;  // CUDA_ERROR_NOT_FOUND
}
CUresult cuFuncSetAttribute(void*, int, int) { return 0; }

CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  if (anyCapture()) return refuse();
  if (n == 0) return 1;
  std::lock_guard<std::mutex> l(mu);
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (n + 15) & ~size_t(15);
  size_t len = (body + page - 1) / page * page + page;
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  char* guard = static_cast<char*>(m) + len - page;
  mprotect(guard, page, PROT_NONE);
  char* start = guard - body;
  memset(start, nullKernels() ? 0 : 0xff, body);
  allocs[reinterpret_cast<CUdeviceptr>(start)] = Alloc{m, len, n, -1, {0}};
  *p = reinterpret_cast<CUdeviceptr>(start);
  return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  if (anyCapture()) return refuse();
  drainAll();  // queued work may still use it
  std::lock_guard<std::mutex> l(mu);
  auto it = allocs.find(p);
  if (it == allocs.end()) return 1;  // CUDA_ERROR_INVALID_VALUE
  munmap(it->second.map, it->second.mapLen);
  // A peer's mapping keeps the file's pages, as a freed exported
  // allocation stays valid for the processes that mapped it.
  if (it->second.fd >= 0) close(it->second.fd);
  allocs.erase(it);
  return 0;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void* s, size_t n) {
  if (anyCapture()) return refuse();
  drainAll();
  memcpy(reinterpret_cast<void*>(d), s, n);
  return 0;
}
CUresult cuMemcpyDtoH_v2(void* d, CUdeviceptr s, size_t n) {
  if (anyCapture()) return refuse();
  drainAll();
  memcpy(d, reinterpret_cast<void*>(s), n);
  return 0;
}
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
  if (anyCapture()) return refuse();
  drainAll();
  memmove(reinterpret_cast<void*>(d), reinterpret_cast<void*>(s), n);
  return 0;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void* s, size_t n, void* st) {
  if (Graph* g = capturing(st)) return captureCopy(g, reinterpret_cast<void*>(d), s, n, s);
  void* dst = reinterpret_cast<void*>(d);
  if (kDeferred && !isPinned(s, n)) {
    auto bytes = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(s),
                                                                static_cast<const unsigned char*>(s) + n);
    later(st, [dst, bytes] { memcpy(dst, bytes->data(), bytes->size()); });
    return 0;
  }
  later(st, [dst, s, n] { memcpy(dst, s, n); });
  return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void* d, CUdeviceptr s, size_t n, void* st) {
  if (Graph* g = capturing(st)) return captureCopy(g, d, reinterpret_cast<void*>(s), n, d);
  const void* src = reinterpret_cast<void*>(s);
  later(st, [d, src, n] { memcpy(d, src, n); });
  if (kDeferred && !isPinned(d, n)) drainStream(st);  // into pageable memory: done on return
  return 0;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, void* st) {
  if (Graph* g = capturing(st)) return captureCopy(g, reinterpret_cast<void*>(d), reinterpret_cast<void*>(s), n, nullptr);
  void *dst = reinterpret_cast<void*>(d), *src = reinterpret_cast<void*>(s);
  later(st, [dst, src, n] { memmove(dst, src, n); });
  return 0;
}
CUresult cuMemsetD32Async(CUdeviceptr d, unsigned v, size_t n, void* st) {
  if (Graph* g = capturing(st)) {
    Node nd{};
    nd.kind = Node::MEMSET;
    nd.dst = reinterpret_cast<void*>(d);
    nd.n = n;
    nd.value = v;
    g->nodes.push_back(nd);
    return 0;
  }
  unsigned* p = reinterpret_cast<unsigned*>(d);
  later(st, [p, v, n] {
    for (size_t i = 0; i < n; i++) p[i] = v;
  });
  return 0;
}

CUresult cuLaunchKernel(void* fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, void* stream, void** params, void** extra) {
  if (int e = envInt("FAKE_CUDA_LAUNCH_ERROR", 0)) return e;
  if (!fn || !params || extra) return 1;
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || bx * by * bz > (unsigned)kMaxThreads ||
      gy > 65535 || gz > 65535 || smem > (48u << 10))
    return 1;  // CUDA_ERROR_INVALID_VALUE, as a GPU would refuse the launch
  Kernel* k = static_cast<Kernel*>(fn);
  if (Graph* g = capturing(stream)) {
    g->nodes.push_back(Node{Node::KERNEL, k, k->bind(params), dim3{gx, gy, gz}, dim3{bx, by, bz}, smem});
    return 0;
  }
  auto bound = k->bind(params);  // the arguments as they are now
  later(stream, [k, bound, gx, gy, gz, bx, by, bz, smem] {
    std::lock_guard<std::mutex> l(mu);
    runGrid(k, bound, dim3{gx, gy, gz}, dim3{bx, by, bz}, smem);
  });
  return 0;
}

CUresult cuStreamCreate(void** s, unsigned) {
  *s = new bkfake_stream{bkfake_enqueue, streamCapturing};
  return 0;
}
CUresult cuStreamDestroy_v2(void* s) {
  drainStream(s);
  {
    std::lock_guard<std::recursive_mutex> l(qMu);
    queues.erase(s);
  }
  delete static_cast<bkfake_stream*>(s);
  return 0;
}
CUresult cuStreamSynchronize(void* s) {
  if (Graph* g = capturing(s)) {
    g->invalid = true;
    return kCaptureUnsupported;
  }
  drainStream(s);
  return 0;
}
CUresult cuEventCreate(void** e, unsigned) {
  *e = new Event();
  return 0;
}
CUresult cuEventDestroy_v2(void* e) {
  drainAll();  // a queued record of it
  delete static_cast<Event*>(e);
  return 0;
}
CUresult cuEventRecord(void* e, void* s) {
  if (Graph* g = capturing(s)) {
    Node nd{};
    nd.kind = Node::EVENT;
    nd.event = static_cast<Event*>(e);
    g->nodes.push_back(nd);
    return 0;
  }
  Event* ev = static_cast<Event*>(e);
  ev->stream = s;
  unsigned long long n = ++ev->recorded;
  later(s, [ev, n] {
    ev->t = std::chrono::steady_clock::now();
    ev->reached = n;
  });
  return 0;
}
CUresult cuEventSynchronize(void* e) {
  if (!captures.empty()) return refuse();
  Event* ev = static_cast<Event*>(e);
  reach(ev, ev->recorded);
  return 0;
}
CUresult cuStreamWaitEvent(void* s, void* e, unsigned) {
  if (!s || !e) return 400;  // CUDA_ERROR_INVALID_HANDLE
  // What s queues from now on runs after e's stream reached this record.
  Event* ev = static_cast<Event*>(e);
  unsigned long long n = ev->recorded;
  later(s, [ev, n] { reach(ev, n); });
  return 0;
}
CUresult cuEventElapsedTime(float* ms, void* a, void* b) {
  *ms = std::chrono::duration<float, std::milli>(static_cast<Event*>(b)->t - static_cast<Event*>(a)->t).count();
  return 0;
}
CUresult cuMemHostAlloc(void** p, size_t n, unsigned) {
  if (anyCapture()) return refuse();
  *p = malloc(n ? n : 1);
  if (!*p) return 2;
  std::lock_guard<std::recursive_mutex> l(capMu);
  pinned[reinterpret_cast<uintptr_t>(*p)] = n ? n : 1;
  return 0;
}
CUresult cuMemFreeHost(void* p) {
  drainAll();  // a queued copy may use it
  std::lock_guard<std::recursive_mutex> l(capMu);
  pinned.erase(reinterpret_cast<uintptr_t>(p));
  free(p);
  return 0;
}
CUresult cuMemHostRegister_v2(void*, size_t, unsigned) { return 0; }
CUresult cuMemHostUnregister(void*) { return 0; }

#ifndef FAKE_NO_GRAPHS
CUresult cuStreamBeginCapture_v2(void* s, int mode) {
  if (!s || capturing(s)) return 1;
  if (mode < 0 || mode > 2) return 1;
  std::lock_guard<std::recursive_mutex> l(capMu);
  Graph* g = new Graph();
  g->owner = std::this_thread::get_id();
  captures[s] = g;
  return 0;
}
CUresult cuStreamEndCapture(void* s, void** graph) {
  std::lock_guard<std::recursive_mutex> l(capMu);
  Graph* g = capturing(s);
  if (!g) return 1;
  captures.erase(s);
  if (g->invalid) {
    delete g;
    *graph = nullptr;
    return kCaptureInvalidated;
  }
  *graph = g;
  return 0;
}
CUresult cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
  if (!graph) return 1;
  *exec = new Graph(*static_cast<Graph*>(graph));
  return 0;
}
static void runGraph(Graph* graph);
CUresult cuGraphLaunch(void* exec, void* s) {
  if (!exec) return 1;
  if (capturing(s)) return kCaptureUnsupported;  // a child graph node: not emulated
  if (int e = envInt("FAKE_CUDA_LAUNCH_ERROR", 0)) return e;
  Graph* graph = static_cast<Graph*>(exec);
  later(s, [graph] { runGraph(graph); });
  return 0;
}

// runGraph runs an instantiated graph's nodes in order.
static void runGraph(Graph* graph) {
  for (const Node& nd : graph->nodes) {
    switch (nd.kind) {
      case Node::KERNEL: {
        std::lock_guard<std::mutex> l(mu);
        runGrid(nd.k, nd.bound, nd.grid, nd.block, nd.smem);
        break;
      }
      case Node::COPY:
        memmove(nd.dst, nd.src, nd.n);
        break;
      case Node::MEMSET:
        for (size_t i = 0; i < nd.n; i++) static_cast<unsigned*>(nd.dst)[i] = nd.value;
        break;
      case Node::EVENT:
        nd.event->t = std::chrono::steady_clock::now();
        break;
      case Node::CALL: {
        std::lock_guard<std::mutex> l(mu);
        nd.bound();
        break;
      }
    }
  }
}
CUresult cuGraphExecDestroy(void* exec) {
  drainAll();  // a queued launch of it
  delete static_cast<Graph*>(exec);
  return 0;
}
CUresult cuGraphDestroy(void* graph) {
  delete static_cast<Graph*>(graph);
  return 0;
}
#endif

CUresult cuGetErrorString(CUresult e, const char** s) {
  switch (e) {
    case 0: *s = "no error"; break;
    case 1: *s = "invalid argument"; break;
    case 2: *s = "out of memory"; break;
    case 100: *s = "no CUDA-capable device is detected"; break;
    case 101: *s = "invalid device ordinal"; break;
    case 304: *s = "OS call failed or operation not supported on this OS"; break;
    case 500: *s = "named symbol not found"; break;
    case 700: *s = "an illegal memory access was encountered"; break;
    case 900: *s = "operation not permitted when stream is capturing"; break;
    case 901: *s = "operation failed due to a previous error during capture"; break;
    default: *s = "unknown error"; return 1;
  }
  return 0;
}

// bkfake_host_visible_memory marks this driver as the emulation: its
// "device" memory is host memory of the process (the backend then lets a
// transport register a pool as host memory, standing in for GPU memory a
// NIC reaches).
int bkfake_host_visible_memory(void) { return 1; }

}  // extern "C"

#ifndef FAKE_NO_IPC
// ---- CUDA IPC ----
//
// Left out with -DFAKE_NO_IPC (a driver without it, as some are).
//
// The handle's 64 bytes: the magic, the exporter's pid, the memfd's number
// there, the body's offset in the file and its size, and the random tag
// the memfd's name carries. An opener maps /proc/<pid>/fd/<fd> and checks
// the name it opened carries the tag, so a stale handle (the exporter gone,
// or the number reused for another file) fails rather than maps something
// else. A killed exporter leaves nothing behind: the memfd goes with its
// last reference.
struct IpcHandle {
  char magic[8];
  int32_t pid;
  int32_t fd;
  uint64_t offset;
  uint64_t size;
  char tag[16];
  char pad[16];
};
static_assert(sizeof(IpcHandle) == 64, "a CUipcMemHandle is 64 bytes");
const char kIpcMagic[8] = {'f', 'a', 'k', 'e', 'i', 'p', 'c', '1'};
struct CUipcMemHandle {
  char reserved[64];
};

namespace {

void hexTag(const char* raw, char* out) {
  for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", (unsigned char)raw[i]);
}

// shareable moves an allocation into a memfd, in place: the same
// addresses, now MAP_SHARED over the file (the guard page stays as it is).
// With mu held.
CUresult shareable(Alloc& a) {
  char raw[16], tag[33], name[64];
  if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return 304;  // CUDA_ERROR_OPERATING_SYSTEM
  hexTag(raw, tag);
  snprintf(name, sizeof name, "fakecuda-ipc-%s", tag);
  size_t page = (size_t)sysconf(_SC_PAGESIZE), fileLen = a.mapLen - page;
  int fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return 304;
  if (ftruncate(fd, (off_t)fileLen) != 0 || pwrite(fd, a.map, fileLen, 0) != (ssize_t)fileLen ||
      mmap(a.map, fileLen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    close(fd);
    return 304;
  }
  a.fd = fd;
  memcpy(a.tag, raw, sizeof raw);
  return 0;
}

// containing finds the allocation or mapping m holds p in.
template <typename M>
bool containing(M& m, CUdeviceptr p, CUdeviceptr* base, size_t* size) {
  auto it = m.upper_bound(p);
  if (it == m.begin()) return false;
  --it;
  if (p >= it->first + it->second.size) return false;
  if (base) *base = it->first;
  if (size) *size = it->second.size;
  return true;
}

}  // namespace

extern "C" {

CUresult cuIpcGetMemHandle(CUipcMemHandle* h, CUdeviceptr p) {
  if (!h) return 1;
  drainAll();  // the allocation moves into a file
  std::lock_guard<std::mutex> l(mu);
  auto it = allocs.find(p);
  if (it == allocs.end()) return 1;  // not the start of an allocation
  Alloc& a = it->second;
  if (a.fd < 0) {
    if (CUresult r = shareable(a)) return r;
  }
  IpcHandle out{};
  memcpy(out.tag, a.tag, sizeof a.tag);
  memcpy(out.magic, kIpcMagic, sizeof kIpcMagic);
  out.pid = getpid();
  out.fd = a.fd;
  out.offset = p - reinterpret_cast<CUdeviceptr>(a.map);
  out.size = a.size;
  memcpy(h, &out, sizeof out);
  return 0;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* p, CUipcMemHandle h, unsigned flags) {
  // The backend always asks for lazy peer access (its peer may be another
  // GPU of the node); a call without it is a bug the tests should see.
  if (!p || flags != 1 /* CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS */) return 1;
  IpcHandle in;
  memcpy(&in, &h, sizeof in);
  if (memcmp(in.magic, kIpcMagic, sizeof kIpcMagic) != 0 || in.pid <= 0 || in.fd < 0 || in.size == 0)
    return 1;  // CUDA_ERROR_INVALID_VALUE
  char path[64], tag[33], self[64], name[256];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)in.pid, (int)in.fd);
  // Non-blocking: a garbage handle may name a FIFO.
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 1;
  // The name of the file opened, not of the path before: that could
  // change in between.
  snprintf(self, sizeof self, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(self, name, sizeof name - 1);
  name[n > 0 ? n : 0] = 0;
  hexTag(in.tag, tag);
  struct stat st;
  if (!strstr(name, tag) || fstat(fd, &st) != 0 || in.offset > (uint64_t)st.st_size ||
      in.size > (uint64_t)st.st_size - in.offset) {
    close(fd);
    return 1;
  }
  void* m = mmap(nullptr, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);  // the mapping holds the file
  if (m == MAP_FAILED) return 304;
  CUdeviceptr body = reinterpret_cast<CUdeviceptr>(m) + in.offset;
  std::lock_guard<std::mutex> l(mu);
  opened[body] = Mapping{m, (size_t)st.st_size, (size_t)in.size};
  *p = body;
  return 0;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
  drainAll();  // a queued copy may read the mapping
  std::lock_guard<std::mutex> l(mu);
  auto it = opened.find(p);
  if (it == opened.end()) return 1;
  munmap(it->second.map, it->second.mapLen);
  opened.erase(it);
  return 0;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  std::lock_guard<std::mutex> l(mu);
  if (containing(allocs, p, base, size) || containing(opened, p, base, size)) return 0;
  return 500;  // CUDA_ERROR_NOT_FOUND
}

}  // extern "C"
#endif  // FAKE_NO_IPC
