// graphc cuda-sim runner: loads kernels compiled for the host (each a shared object
// built from the kernel's own CUDA C and cuda_sim.h) and runs launches sent by graphc
// over stdin, answering on stdout. Every CUDA thread is a fiber; blocks run in waves
// (one block at a time, or several at once under TSan so races between blocks are
// seen too). Barriers and warp collectives are implemented here,
// with the checks a GPU does not make: a __syncthreads some threads of the block never
// reach, a collective whose mask names a lane that exited or waits elsewhere, lanes of
// one warp in different collectives.
//
// Protocol (little-endian): graphc sends a command word, then its fields.
//   1 LOAD   u32 len, path          -> u32 0, u32 module  | u32 1, u32 len, message
//   2 LAUNCH u32 module grid block dyn_smem smem_limit static_limit wave_threads nargs,
//            per argument u64 bytes, u32 flags (1 read, 2 write), u32 alias (an
//            earlier argument with the same address, or 0xffffffff); then the bytes of
//            every non-alias argument some member of whose group reads
//                                     -> u32 0, then the bytes of every non-alias
//                                        argument whose group writes | u32 1, message
//   3 QUIT
//   4 COUNT  as LAUNCH without the argument bytes, then u32 n, n block indices, per
//            argument u64 hi, u32 width (integers spread over [0, hi), or zeros): only
//            those blocks run, in the counting build
//            (sim_count.cpp)         -> u32 0, u32 count, count u64 counters | u32 1, message
// Arguments are separate allocations (256-byte aligned; under ASan each has red
// zones; otherwise 256 guard bytes each side, checked after the launch); write-only
// arguments start as 0xff bytes, so an element a kernel fails to write is NaN.
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define G_SIM_ASAN 1
#endif

// Every CUDA thread is a fiber (ucontext) of one OS thread, switched at every barrier
// and collective. Under TSan (the runner built with GRAPHC_SIM_TSAN, linked with TSan's
// runtime, itself uninstrumented) every fiber is a TSan context, switched without
// synchronizing, and the happens-before edges are exactly CUDA's: a __syncthreads
// orders the block's threads, a __syncwarp its lanes, a block's start and end order it
// with the host; warp shuffles and votes order nothing. So TSan reports any pair of
// accesses those edges do not order.
#include <sys/mman.h>
#include <ucontext.h>
#if defined(GRAPHC_SIM_TSAN)
extern "C" {
void *__tsan_get_current_fiber(void);
void *__tsan_create_fiber(unsigned flags);
void __tsan_switch_to_fiber(void *fiber, unsigned flags);
void __tsan_set_fiber_name(void *fiber, const char *name);
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
}
#define G_HB_RELEASE(p) __tsan_release((void *)(p))
#define G_HB_ACQUIRE(p) __tsan_acquire((void *)(p))
#else
#define G_HB_RELEASE(p) ((void)(p))
#define G_HB_ACQUIRE(p) ((void)(p))
#endif

struct g_sim_abort {};

namespace {

const unsigned kGuard = 256;
// The guard byte at position k of argument i's guards: different in every argument and
// position, so a value a kernel read past one buffer and wrote past another (x * 1.0)
// still changes the guard it lands in.
unsigned char guard_byte(unsigned i, unsigned k) { return (unsigned char)(0xa5u ^ (k * 131u) ^ (i * 71u + 13u)); }

enum State { RUNNING, AT_BARRIER, AT_WARP, EXITED };
// At most this many __shared__ declarations per kernel.
const int kMaxSharedArrays = 256;
const int G_SIM_SYNCWARP_KIND = 7;  // cuda_sim.h's G_SIM_SYNCWARP

const char *kind_name(int k) {
  static const char *names[] = {"__shfl_sync",  "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                "__ballot_sync", "__all_sync",     "__any_sync",       "__syncwarp"};
  return k >= 0 && k < 8 ? names[k] : "a warp collective";
}

struct Warp {
  unsigned arrived = 0;  // lanes waiting in the current collective
  int kind = 0;
  unsigned mask = 0;
  int width = 32;
  unsigned long long value[32];
  int arg[32];
  unsigned long long result[32];
  unsigned long long seq[32];
  unsigned long long gen = 0;  // completed collectives
  unsigned char hb[2];         // TSan: __syncwarp's edges, by generation parity
};

struct Slot {
  void *base;
  unsigned long long bytes;
};

struct Block {
  unsigned nthreads = 0;
  unsigned block = 0;
  unsigned bar_arrived = 0;
  unsigned long long bar_gen = 0;
  unsigned running = 0;
  unsigned exited = 0;
  std::vector<State> state;
  std::vector<Warp> warps;
  std::vector<Slot> smem;  // static __shared__ arrays by id
  std::vector<Slot> tstore;  // g_sim_thread_storage, by thread
  unsigned long long smem_bytes = 0;
  void *dyn = nullptr;
  unsigned char hb_start, hb_end, hb_bar[2];  // TSan: the block's happens-before edges
};

struct Launch {
  const char *entry = "";
  void (*fn)(void *const *) = nullptr;
  void *const *args = nullptr;
  unsigned grid = 0, block = 0, per_wave = 1;
  unsigned dyn_smem = 0, smem_limit = 0, static_limit = 0;
  std::vector<Block> blocks;  // one per concurrent block
  std::vector<unsigned> sample;  // COUNT: the blocks to run (one at a time), not the grid
};

// The first error of the current launch.
std::string g_error;
bool g_abort_flag = false;
inline bool aborted() { return __atomic_load_n(&g_abort_flag, __ATOMIC_ACQUIRE); }
Launch *g_launch = nullptr;
// The counting build (sim_count.cpp): set while a COUNT runs; the __syncthreads calls
// of the block counted so far; the counts of a block at its end.
bool g_counting = false;
unsigned long long g_barrier_calls = 0;
void count_block_end(Block &b);

// For sanitizer reports: what the faulting thread was running.
__thread Block *tl_block = nullptr;
__thread unsigned tl_thread = 0;
// The calling CUDA thread's ids (the header's threadIdx etc. read these).
struct Ids {
  unsigned tx, ty, tz, bx, by, bz, dx, dy, dz, gx, gy, gz;
};
__thread Ids tl_ids;

void fiber_yield();

struct Arg {
  unsigned char *base = nullptr;  // the allocation (guards included outside ASan)
  unsigned char *data = nullptr;  // what the kernel gets
  unsigned long long bytes = 0;
  unsigned flags = 0;
  unsigned alias = 0xffffffffu;
  unsigned long long hash = 0;
};
std::vector<Arg> g_args;

void set_error(const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (g_error.empty()) g_error = buf;
  G_HB_RELEASE(&g_error);  // read by the host side after the launch
  __atomic_store_n(&g_abort_flag, true, __ATOMIC_RELEASE);
}

// Record an error from inside a block; the scheduler then resumes every fiber, which
// unwinds at its next barrier or collective.
void fail_block(Block &b, const char *fmt, ...) {
  char buf[1800];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  set_error("block %u: %s", b.block, buf);
}

std::string lanes(unsigned m) {
  std::string s;
  for (int i = 0; i < 32; ++i)
    if (m & (1u << i)) s += (s.empty() ? "" : ",") + std::to_string(i);
  return s.empty() ? "none" : s;
}

const char *state_name(State s) {
  switch (s) {
    case RUNNING: return "running";
    case AT_BARRIER: return "waiting at __syncthreads";
    case AT_WARP: return "waiting in a warp collective";
    default: return "exited";
  }
}

// Every thread is blocked or gone and nothing can complete: say what waits for what.
void check_deadlock(Block &b) {
  if (b.running != 0 || aborted()) return;
  if (b.bar_arrived > 0) {
    fail_block(b,
                "deadlock: %u of %u threads wait at __syncthreads, %u have exited and the rest wait in warp "
                "collectives (a barrier in divergent code)",
                b.bar_arrived, b.nthreads, b.exited);
    return;
  }
  for (size_t w = 0; w < b.warps.size(); ++w) {
    Warp &wp = b.warps[w];
    if (wp.arrived == 0) continue;
    unsigned missing = wp.mask & ~wp.arrived;
    int lane = __builtin_ctz(missing ? missing : 1u);
    unsigned t = (unsigned)(w * 32 + lane);
    fail_block(b, "deadlock: warp %zu: lanes %s wait in %s with mask 0x%08x, but lane %d is %s", w,
                lanes(wp.arrived).c_str(), kind_name(wp.kind), wp.mask, lane,
                t < b.nthreads ? state_name(b.state[t]) : "not in the block");
    return;
  }
}

// Give the OS thread to the scheduler until it resumes this fiber (its state RUNNING
// again, or the launch failed).
void wait_on() {
  fiber_yield();
  if (aborted()) throw g_sim_abort();
}

unsigned long long warp_result(Warp &w, unsigned lane) {
  const int width = w.width;
  const unsigned seg = lane & ~(unsigned)(width - 1);
  unsigned src = lane;
  switch (w.kind) {
    case 0: src = seg + ((unsigned)w.arg[lane] % (unsigned)width); break;
    case 1: src = (lane - seg) >= (unsigned)w.arg[lane] ? lane - (unsigned)w.arg[lane] : lane; break;
    case 2: src = (lane - seg) + (unsigned)w.arg[lane] < (unsigned)width ? lane + (unsigned)w.arg[lane] : lane; break;
    case 3: {
      unsigned s = lane ^ (unsigned)w.arg[lane];
      src = (s & ~(unsigned)(width - 1)) == seg ? s : lane;
      break;
    }
    case 4: {
      unsigned m = 0;
      for (int i = 0; i < 32; ++i)
        if ((w.mask >> i & 1u) && w.value[i]) m |= 1u << i;
      return m;
    }
    case 5:
    case 6: {
      bool all = true, any = false;
      for (int i = 0; i < 32; ++i)
        if (w.mask >> i & 1u) {
          all = all && w.value[i];
          any = any || w.value[i];
        }
      return w.kind == 5 ? all : any;
    }
    default: return 0;
  }
  return w.value[src];
}

}  // namespace

extern "C" {

void g_sim_trap(const char *what) {
  Block *b = tl_block;
  if (!b) abort();
  fail_block(*b, "thread %u: %s", tl_thread, what);
  throw g_sim_abort();
}

void g_sim_syncthreads(void) {
  Block &b = *tl_block;
  if (aborted()) {
    throw g_sim_abort();
  }
  if (g_counting) g_barrier_calls++;
  b.state[tl_thread] = AT_BARRIER;
  b.running--;
  b.bar_arrived++;
  const unsigned long long gen = b.bar_gen;
  G_HB_RELEASE(&b.hb_bar[gen & 1]);
  if (b.bar_arrived == b.nthreads) {
    b.bar_arrived = 0;
    b.bar_gen++;
    for (auto &s : b.state) s = RUNNING;
    b.running = b.nthreads;
  } else {
    if (b.bar_arrived + b.exited == b.nthreads)
      fail_block(b, "__syncthreads reached by %u threads while %u threads of the block have exited (a barrier in divergent code)",
                  b.bar_arrived, b.exited);
    check_deadlock(b);
    while (b.bar_gen == gen) wait_on();
  }
  G_HB_ACQUIRE(&b.hb_bar[gen & 1]);
}

unsigned long long g_sim_warp(int kind, unsigned mask, unsigned long long value, int arg, int width) {
  Block &b = *tl_block;
  const unsigned t = tl_thread, w = t / 32, lane = t % 32;
  if (aborted()) {
    throw g_sim_abort();
  }
  Warp &wp = b.warps[w];
  const unsigned lanes_here = b.nthreads - w * 32 >= 32 ? 0xffffffffu : (1u << (b.nthreads - w * 32)) - 1u;
  if (!(mask >> lane & 1u)) {
    fail_block(b, "thread %u: %s with mask 0x%08x, which leaves out the calling lane %u", t, kind_name(kind), mask, lane);
  } else if (mask & ~lanes_here) {
    fail_block(b, "thread %u: %s with mask 0x%08x names lanes the warp does not have (lanes %s)", t, kind_name(kind),
                mask, lanes(lanes_here).c_str());
  } else if (width <= 0 || width > 32 || (width & (width - 1))) {
    fail_block(b, "thread %u: %s with width %d (a power of two up to 32)", t, kind_name(kind), width);
  } else if (wp.arrived != 0 && (wp.kind != kind || wp.mask != mask || wp.width != width)) {
    fail_block(b, "warp %u: lane %u calls %s with mask 0x%08x while lanes %s wait in %s with mask 0x%08x (divergent warp collectives)",
                w, lane, kind_name(kind), mask, lanes(wp.arrived).c_str(), kind_name(wp.kind), wp.mask);
  }
  if (aborted()) {
    throw g_sim_abort();
  }
  if (wp.arrived == 0) {
    wp.kind = kind;
    wp.mask = mask;
    wp.width = width;
  }
  wp.value[lane] = value;
  wp.arg[lane] = arg;
  wp.arrived |= 1u << lane;
  b.state[t] = AT_WARP;
  b.running--;
  const unsigned long long seq = wp.seq[lane];
  const unsigned long long wgen = wp.gen;
  if (kind == G_SIM_SYNCWARP_KIND) G_HB_RELEASE(&wp.hb[wgen & 1]);
  if (wp.arrived == wp.mask) {
    if (kind == 0 || kind == 3) {
      // The source lane must take part in the collective.
      for (int i = 0; i < 32; ++i) {
        if (!(mask >> i & 1u)) continue;
        unsigned r = (unsigned)i;
        unsigned seg = r & ~(unsigned)(width - 1);
        unsigned src = kind == 0 ? seg + ((unsigned)wp.arg[i] % (unsigned)width) : r ^ (unsigned)wp.arg[i];
        if (kind == 3 && (src & ~(unsigned)(width - 1)) != seg) src = r;
        if (!(mask >> src & 1u)) {
          fail_block(b, "warp %u: lane %d reads lane %u in %s, which is not in the mask 0x%08x (undefined)", w, i, src,
                      kind_name(kind), mask);
          throw g_sim_abort();
        }
      }
    }
    for (int i = 0; i < 32; ++i) {
      if (!(mask >> i & 1u)) continue;
      wp.result[i] = warp_result(wp, (unsigned)i);
      wp.seq[i]++;
      b.state[w * 32 + i] = RUNNING;
      b.running++;
    }
    wp.arrived = 0;
    wp.gen++;
  } else {
    check_deadlock(b);
    while (wp.seq[lane] == seq) wait_on();
  }
  if (kind == G_SIM_SYNCWARP_KIND) G_HB_ACQUIRE(&wp.hb[wgen & 1]);
  const unsigned long long r = wp.result[lane];
  return r;
}

unsigned g_sim_active_mask(void) {
  Block &b = *tl_block;
  const unsigned w = tl_thread / 32;
  unsigned m = 0;
  for (unsigned i = 0; i < 32 && w * 32 + i < b.nthreads; ++i)
    if (b.state[w * 32 + i] != EXITED) m |= 1u << i;
  return m;
}

void *g_sim_smem(int id, unsigned long long bytes, unsigned long long align) {
  Block &b = *tl_block;
  if (id < 0 || id >= kMaxSharedArrays) {
    fail_block(b, "shared array id %d", id);
    throw g_sim_abort();
  }
  if ((size_t)id >= b.smem.size()) b.smem.resize((size_t)id + 1, Slot{nullptr, 0});
  Slot &s = b.smem[(size_t)id];
  if (!s.base) {
    b.smem_bytes += bytes;
    if (b.smem_bytes > g_launch->static_limit) {
      fail_block(b, "%llu bytes of static shared memory, over the %u bytes a block may declare", b.smem_bytes,
                  g_launch->static_limit);
      throw g_sim_abort();
    }
    if (b.smem_bytes + g_launch->dyn_smem > g_launch->smem_limit) {
      fail_block(b, "%llu bytes of static and %u of dynamic shared memory, over the device's %u bytes per block",
                  b.smem_bytes, g_launch->dyn_smem, g_launch->smem_limit);
      throw g_sim_abort();
    }
    void *p = nullptr;
    if (posix_memalign(&p, align < 16 ? 16 : (size_t)align, bytes ? (size_t)bytes : 1) != 0) {
      fail_block(b, "cannot allocate %llu bytes of shared memory", bytes);
      throw g_sim_abort();
    }
    memset(p, 0xff, (size_t)bytes);
    s.base = p;
    s.bytes = bytes;
    G_HB_RELEASE(p);
  } else if (s.bytes != bytes) {
    fail_block(b, "shared array %d declared with %llu and %llu bytes", id, s.bytes, bytes);
    throw g_sim_abort();
  }
  void *p = s.base;
  G_HB_ACQUIRE(p);
  return p;
}

void *g_sim_dyn_smem(void) { return tl_block->dyn; }

void *g_sim_thread_storage(unsigned long long bytes) {
  Block &b = *tl_block;
  if (b.tstore.size() < b.nthreads) b.tstore.resize(b.nthreads, Slot{nullptr, 0});
  Slot &s = b.tstore[tl_thread];
  if (!s.base) {
    s.base = calloc(1, bytes ? (size_t)bytes : 1);
    s.bytes = bytes;
  }
  if (!s.base || s.bytes != bytes) {
    fail_block(b, "thread %u: thread storage of %llu bytes asked for, %llu held", tl_thread, bytes, s.bytes);
    throw g_sim_abort();
  }
  void *p = s.base;
  return p;
}

struct g_sim_uint3 {
  unsigned x, y, z;
};
g_sim_uint3 g_sim_thread_idx(void) { return {tl_ids.tx, tl_ids.ty, tl_ids.tz}; }
g_sim_uint3 g_sim_block_idx(void) { return {tl_ids.bx, tl_ids.by, tl_ids.bz}; }
g_sim_uint3 g_sim_block_dim(void) { return {tl_ids.dx, tl_ids.dy, tl_ids.dz}; }
g_sim_uint3 g_sim_grid_dim(void) { return {tl_ids.gx, tl_ids.gy, tl_ids.gz}; }

#ifdef G_SIM_ASAN
// ASan calls this when it finds an error, before its report: say which launch and
// which of its buffers the bad address belongs to (or lies beside).
void __asan_on_error(void) {
  const uintptr_t a = (uintptr_t)__asan_get_report_address();
  Launch *l = g_launch;
  fprintf(stderr, "graphc-sim: kernel %s, block %u, thread %u\n", l ? l->entry : "?", tl_block ? tl_block->block : 0,
          tl_thread);
  long best = -1;
  uintptr_t best_d = ~(uintptr_t)0;
  const char *side = "";
  for (size_t i = 0; i < g_args.size(); ++i) {
    const Arg &g = g_args[i];
    if (g.alias != 0xffffffffu || !g.data) continue;
    uintptr_t lo = (uintptr_t)g.data, hi = lo + g.bytes;
    uintptr_t d = a < lo ? lo - a : (a >= hi ? a - hi : 0);
    if (d < best_d) {
      best_d = d;
      best = (long)i;
      side = a < lo ? "before" : (a >= hi ? "past the end of" : "inside");
    }
  }
  if (best >= 0)
    fprintf(stderr, "graphc-sim: address %#lx is %lu bytes %s argument %ld (%llu bytes)\n", (unsigned long)a,
            (unsigned long)best_d, side, best, g_args[(size_t)best].bytes);
  if (tl_block)
    for (size_t i = 0; i < tl_block->smem.size(); ++i) {
      const Slot &s = tl_block->smem[i];
      uintptr_t lo = (uintptr_t)s.base, hi = lo + s.bytes;
      if (s.base && a + 64 >= lo && a < hi + 64)
        fprintf(stderr, "graphc-sim: address %#lx is near shared array %zu (%llu bytes at %#lx)\n", (unsigned long)a, i,
                s.bytes, (unsigned long)lo);
    }
  fflush(stderr);
}
#endif

}  // extern "C"

namespace {

void reset_block(Launch &l, Block &b, unsigned block) {
  b.block = block;
  b.nthreads = l.block;
  b.bar_arrived = 0;
  b.running = l.block;
  b.exited = 0;
  b.state.assign(l.block, RUNNING);
  for (auto &w : b.warps) {
    w.arrived = 0;
    for (int i = 0; i < 32; ++i) w.seq[i] = 0;
  }
  for (auto &s : b.smem) free(s.base);
  b.smem.clear();
  // Reserved, so that no fiber's resize moves the table under another's (TSan sees
  // the runtime's memcpy).
  b.smem.reserve(kMaxSharedArrays);
  for (auto &s : b.tstore) free(s.base);
  b.tstore.clear();
  b.tstore.reserve(l.block);
  b.smem_bytes = 0;
  free(b.dyn);
  b.dyn = nullptr;
  if (l.dyn_smem) {
    if (posix_memalign(&b.dyn, 16, l.dyn_smem) != 0) b.dyn = nullptr;
    if (b.dyn) memset(b.dyn, 0xff, l.dyn_smem);
  }
  for (auto &w : b.warps) w.gen = 0;
  G_HB_RELEASE(&b.hb_start);
}

void exit_thread(Block &b, unsigned t) {
  if (b.state[t] == RUNNING) b.running--;
  b.state[t] = EXITED;
  b.exited++;
  Warp &wp = b.warps[t / 32];
  if (!aborted() && wp.arrived != 0 && (wp.mask >> (t % 32) & 1u))
    fail_block(b, "warp %u: lane %u exited while lanes %s wait for it in %s with mask 0x%08x", t / 32, t % 32,
                lanes(wp.arrived).c_str(), kind_name(wp.kind), wp.mask);
  if (!aborted() && b.bar_arrived > 0 && b.bar_arrived + b.exited == b.nthreads)
    fail_block(b, "__syncthreads reached by %u threads while %u threads of the block have exited (a barrier in divergent code)",
                b.bar_arrived, b.exited);
  if (b.exited < b.nthreads) check_deadlock(b);
}

// One CUDA thread, start to end.
void run_thread(Launch &l, Block &b, unsigned block, unsigned t) {
  tl_block = &b;
  tl_thread = t;
  tl_ids = Ids{t, 0, 0, block, 0, 0, l.block, 1, 1, l.grid, 1, 1};
  G_HB_ACQUIRE(&b.hb_start);
  try {
    l.fn(l.args);
  } catch (const g_sim_abort &) {
  } catch (...) {
    set_error("block %u thread %u: an exception escaped the kernel", block, t);
  }
  exit_thread(b, t);
  G_HB_RELEASE(&b.hb_end);
  tl_block = nullptr;
}

struct Fiber {
  ucontext_t ctx;
  char *stack = nullptr;
  unsigned slot = 0, t = 0, block = 0;
  bool done = true;
  void *fake = nullptr;
  void *tsan = nullptr;  // the fiber's TSan context
};
const size_t kFiberStack = 256 << 10;
std::vector<Fiber> g_fibers;
ucontext_t g_sched;
Fiber *g_cur = nullptr;
Launch *g_fiber_launch = nullptr;
#ifdef G_SIM_ASAN
const void *g_sched_bottom = nullptr;
size_t g_sched_size = 0;
#endif
#ifdef GRAPHC_SIM_TSAN
void *g_sched_tsan = nullptr;
// Switch TSan's context (without synchronizing: only CUDA's own edges order threads).
#define G_TSAN_SWITCH(ctx) __tsan_switch_to_fiber((ctx), 1)
#else
#define G_TSAN_SWITCH(ctx) ((void)0)
#endif

void fiber_yield() {
  Fiber *f = g_cur;
#ifdef G_SIM_ASAN
  __sanitizer_start_switch_fiber(&f->fake, g_sched_bottom, g_sched_size);
#endif
  G_TSAN_SWITCH(g_sched_tsan);
  swapcontext(&f->ctx, &g_sched);
#ifdef G_SIM_ASAN
  __sanitizer_finish_switch_fiber(f->fake, nullptr, nullptr);
#endif
}

void fiber_entry() {
  Fiber *f = g_cur;
#ifdef G_SIM_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &g_sched_bottom, &g_sched_size);
#endif
  Launch &l = *g_fiber_launch;
  run_thread(l, l.blocks[f->slot], f->block, f->t);
  f->done = true;
#ifdef G_SIM_ASAN
  __sanitizer_start_switch_fiber(nullptr, g_sched_bottom, g_sched_size);
#endif
  G_TSAN_SWITCH(g_sched_tsan);
  setcontext(&g_sched);
}

// Resume fiber `f` until it blocks or ends.
void resume(Launch &l, Fiber &f) {
  g_cur = &f;
  tl_block = &l.blocks[f.slot];
  tl_thread = f.t;
  tl_ids = Ids{f.t, 0, 0, f.block, 0, 0, l.block, 1, 1, l.grid, 1, 1};
#ifdef G_SIM_ASAN
  void *fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack, kFiberStack);
#endif
  G_TSAN_SWITCH(f.tsan);
  swapcontext(&g_sched, &f.ctx);
#ifdef G_SIM_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  g_cur = nullptr;
}

// Every wave's threads as fibers (slots blocks at once), resumed in passes (alternately first to last and
// last to first) while any can run.
void run_fibers(Launch &l, unsigned slots) {
  const unsigned n = slots * l.block;
  while (g_fibers.size() < n) {
    Fiber f;
    void *m = mmap(nullptr, kFiberStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      fprintf(stderr, "graphc-sim: cannot map a fiber stack\n");
      _exit(70);
    }
    mprotect(m, 4096, PROT_NONE);  // a guard page below the stack
    f.stack = (char *)m;
#ifdef GRAPHC_SIM_TSAN
    f.tsan = __tsan_create_fiber(0);
#endif
    g_fibers.push_back(f);
  }
  g_fiber_launch = &l;
#ifdef GRAPHC_SIM_TSAN
  g_sched_tsan = __tsan_get_current_fiber();
#endif
  const bool sampled = !l.sample.empty();
  const unsigned waves = sampled ? (unsigned)l.sample.size() : (l.grid + slots - 1) / slots;
  for (unsigned w = 0; w < waves && !aborted(); ++w) {
    unsigned live = 0;
    for (unsigned s = 0; s < slots; ++s) reset_block(l, l.blocks[s], sampled ? l.sample[w] : w * slots + s);
    for (unsigned i = 0; i < n; ++i) {
      Fiber &f = g_fibers[i];
      f.slot = i / l.block;
      f.t = i % l.block;
      f.block = sampled ? l.sample[w] : w * slots + f.slot;
      f.done = f.block >= l.grid;
      if (f.done) continue;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack + 4096;
      f.ctx.uc_stack.ss_size = kFiberStack - 4096;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, fiber_entry, 0);
      live++;
    }
    for (bool forward = true; live > 0; forward = !forward) {
      unsigned resumed = 0;
      const bool all = aborted();
      for (unsigned k = 0; k < n; ++k) {
        Fiber &f = g_fibers[forward ? k : n - 1 - k];
        if (f.done || !(all || l.blocks[f.slot].state[f.t] == RUNNING)) continue;
        resume(l, f);
        resumed++;
        if (f.done) live--;
      }
      if (resumed == 0 && live > 0 && !aborted()) {
        set_error("no CUDA thread of the block can run, and the deadlock went unexplained");
      }
    }
    for (unsigned s = 0; s < slots; ++s) G_HB_ACQUIRE(&l.blocks[s].hb_end);
    if (g_counting && !aborted())
      for (unsigned s = 0; s < slots; ++s) count_block_end(l.blocks[s]);
  }
  g_fiber_launch = nullptr;
}

}  // namespace
// The counting build's hooks follow in sim_count.cpp, then the protocol (argument
// allocations, guards, LOAD, LAUNCH, COUNT, main) in sim_io.cpp; build.rs compiles the
// three as one translation unit.
