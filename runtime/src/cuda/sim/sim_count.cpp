// graphc cuda-sim runner, part 2 of 3 (after sim_rt.cpp, before sim_io.cpp, as one
// translation unit): the counting build of the performance model (`COUNT`).
//
// A counting build compiles each kernel with GCC's or Clang's ThreadSanitizer
// instrumentation (every load, store and atomic becomes a call to `__tsan_*`) and with
// `-fsanitize-coverage=trace-pc` (every basic block calls `__sanitizer_cov_trace_pc`),
// but links no sanitizer runtime: the runner defines those entry points itself, here,
// and counts what they report. So the counts come from the kernel's own code, not from
// a description of it written beside it.
//
// - An access is global when its address is inside an argument, shared when inside
//   the block's shared memory, otherwise local (the thread's own stack: not counted).
// - Lanes are fibers, not lockstep: the k-th access of a site (the call's return
//   address) by each lane of a warp makes the warp's k-th request at that site. A
//   request's global cost is the distinct 32-byte sectors its lanes touch; its shared
//   cost the wavefronts the banks need (per phase of 128 bytes: 32 lanes of 4 bytes,
//   16 of 8, 8 of 16; in each phase the most distinct 4-byte words any one bank
//   serves, a word read by several lanes served once).
// - A warp's instructions are measured by the basic blocks its lanes execute: the
//   warp issues the busiest lane's count (SIMT: the union of its lanes' paths). Each
//   block also adds its weight, the kernel's own instructions in it (weights.rs writes
//   them from the object's disassembly, beside it: `<object>.w`), found by the
//   address its `trace_pc` call returns to.
// - A fiber yields every kYieldEvery accesses, so lanes stay near one another and the
//   table of open requests stays small.
// - Only the sampled blocks run (the grid is homogeneous); the arguments start as zero
//   bytes (every index 0, in range), nothing is sent or returned but the counts.

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace {

// The counters a COUNT answers with, in this order (runner.rs reads them so).
enum Counter {
  C_BLOCKS,           // blocks run
  C_WARPS,            // warps run
  C_THREADS,          // threads run
  C_GLD_REQ,          // global load requests (warp level)
  C_GLD_SECTORS,      // 32-byte sectors they touch
  C_GLD_BYTES,        // bytes the lanes asked for
  C_GST_REQ,          // global store requests
  C_GST_SECTORS,
  C_GST_BYTES,
  C_GATOM_REQ,        // global atomic requests (also in loads)
  C_SLD_REQ,          // shared load requests
  C_SST_REQ,          // shared store requests
  C_SHARED_WAVES,     // shared wavefronts, bank conflicts included
  C_SHARED_IDEAL,     // the wavefronts without conflicts
  C_MMA,              // warp-level mma.sync m16n8k16
  C_BARRIERS,         // __syncthreads per block, summed over blocks
  C_WARP_BBS,         // basic blocks issued per warp (its busiest lane), summed
  C_THREAD_BBS,       // basic blocks over all threads
  C_DISTINCT_SECTORS, // distinct global sectors each block touches, summed
  C_LOCAL,            // accesses to the thread's own memory
  C_WARP_INSTRS,      // instructions issued per warp (its busiest lane), summed; 0 without weights
  C_N
};
unsigned long long g_cnt[C_N];
// The argument ranges of the running COUNT.
std::vector<std::pair<uintptr_t, uintptr_t>> g_global_ranges;
// Each loaded kernel's block weights, by the address a block's trace_pc call returns to.
std::unordered_map<uintptr_t, unsigned> g_bb_weight;

// Reads `path`.w (a `#` line, then `offset weight` lines, hexadecimal offsets into the object) for the
// module whose entry is `entry`; a missing file leaves the blocks unweighted.
void count_load_weights(const std::string &path, void *entry) {
  Dl_info info;
  if (!dladdr(entry, &info) || !info.dli_fbase) return;
  FILE *f = fopen((path + ".w").c_str(), "r");
  if (!f) return;
  unsigned long long off = 0;
  unsigned w = 0;
  char head[128];
  if (!fgets(head, sizeof head, f) || head[0] != '#') {
    fclose(f);
    return;
  }
  while (fscanf(f, "%llx %u", &off, &w) == 2) g_bb_weight[(uintptr_t)info.dli_fbase + (uintptr_t)off] = w;
  fclose(f);
}

#if defined(GRAPHC_SIM_COUNT)
const unsigned kYieldEvery = 64;
// The site of cp.async copies (noted by the prelude's CPU body, not by instrumentation).
const uintptr_t kSiteCpAsyncGlobal = 1, kSiteCpAsyncShared = 2;

struct Access {
  uintptr_t addr;
  unsigned size;
};
struct Request {
  unsigned char space = 0;  // 0 global, 1 shared
  unsigned char kind = 0;   // 0 load, 1 store, 2 atomic
  std::vector<Access> lanes;
};
struct Key {
  unsigned warp;
  unsigned k;
  uintptr_t site;
  bool operator==(const Key &o) const { return warp == o.warp && k == o.k && site == o.site; }
};
struct KeyHash {
  size_t operator()(const Key &x) const {
    return (size_t)(x.site * 0x9e3779b97f4a7c15ull) ^ ((size_t)x.warp << 40) ^ (size_t)x.k * 0x85ebca6bull;
  }
};
struct ThreadCount {
  std::unordered_map<uintptr_t, unsigned> occurrence;  // accesses so far, by site
  unsigned long long bbs = 0;
  unsigned long long instrs = 0;
  unsigned since_yield = 0;
  // Inside a prelude helper's CPU body (an emulated PTX instruction: its host basic
  // blocks are not the GPU's; the helper counts as one).
  unsigned helper_depth = 0;
};
struct BlockCount {
  std::unordered_map<Key, Request, KeyHash> open;
  std::vector<ThreadCount> threads;
  std::unordered_set<uintptr_t> sectors;
};
BlockCount g_bc;

bool in_shared(const Block &b, uintptr_t a) {
  for (const Slot &s : b.smem)
    if (s.base && a >= (uintptr_t)s.base && a < (uintptr_t)s.base + s.bytes) return true;
  return b.dyn && a >= (uintptr_t)b.dyn && a < (uintptr_t)b.dyn + g_launch->dyn_smem;
}

bool in_global(uintptr_t a) {
  for (const auto &r : g_global_ranges)
    if (a >= r.first && a < r.second) return true;
  return false;
}

// A finished request's cost, added to the counters.
void close_request(const Request &r) {
  if (r.space == 0) {
    std::vector<uintptr_t> sect;
    unsigned long long bytes = 0;
    for (const Access &x : r.lanes) {
      bytes += x.size;
      for (uintptr_t s = x.addr >> 5; s <= (x.addr + (x.size ? x.size : 1) - 1) >> 5; ++s) sect.push_back(s);
    }
    std::sort(sect.begin(), sect.end());
    const unsigned long long n = (unsigned long long)(std::unique(sect.begin(), sect.end()) - sect.begin());
    if (r.kind == 1) {
      g_cnt[C_GST_REQ]++;
      g_cnt[C_GST_SECTORS] += n;
      g_cnt[C_GST_BYTES] += bytes;
    } else {
      g_cnt[C_GLD_REQ]++;
      g_cnt[C_GLD_SECTORS] += n;
      g_cnt[C_GLD_BYTES] += bytes;
      if (r.kind == 2) g_cnt[C_GATOM_REQ]++;
    }
    return;
  }
  g_cnt[r.kind == 1 ? C_SST_REQ : C_SLD_REQ]++;
  unsigned size = 4;
  for (const Access &x : r.lanes) size = x.size > size ? x.size : size;
  const size_t per_phase = size >= 16 ? 8 : (size >= 8 ? 16 : 32);
  for (size_t p = 0; p < r.lanes.size(); p += per_phase) {
    // The distinct 4-byte words of this phase, then the most any one bank serves.
    std::vector<uintptr_t> words;
    for (size_t i = p; i < r.lanes.size() && i < p + per_phase; ++i) {
      const Access &x = r.lanes[i];
      for (uintptr_t w = x.addr >> 2; w <= (x.addr + (x.size ? x.size : 1) - 1) >> 2; ++w) words.push_back(w);
    }
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    unsigned per_bank[32] = {0};
    unsigned most = 0;
    for (uintptr_t w : words) {
      const unsigned c = ++per_bank[w & 31];
      most = c > most ? c : most;
    }
    g_cnt[C_SHARED_WAVES] += most;
    g_cnt[C_SHARED_IDEAL] += 1;
  }
}

void note_access(uintptr_t addr, unsigned size, unsigned char kind, uintptr_t site) {
  Block *b = tl_block;
  if (!g_counting || !b || aborted()) return;
  unsigned char space;
  if (in_shared(*b, addr))
    space = 1;
  else if (in_global(addr))
    space = 0;
  else {
    g_cnt[C_LOCAL]++;
    return;
  }
  if (g_bc.threads.size() < b->nthreads) g_bc.threads.resize(b->nthreads);
  ThreadCount &t = g_bc.threads[tl_thread];
  if (space == 0)
    for (uintptr_t s = addr >> 5; s <= (addr + (size ? size : 1) - 1) >> 5; ++s) g_bc.sectors.insert(s);
  const unsigned warp = tl_thread / 32;
  const Key key{warp, t.occurrence[site]++, site};
  Request &r = g_bc.open[key];
  r.space = space;
  r.kind = kind;
  r.lanes.push_back(Access{addr, size});
  const unsigned in_warp = b->nthreads - warp * 32 >= 32 ? 32 : b->nthreads - warp * 32;
  if (r.lanes.size() >= in_warp) {
    close_request(r);
    g_bc.open.erase(key);
  }
  if (++t.since_yield >= kYieldEvery && b->nthreads > 1) {
    t.since_yield = 0;
    fiber_yield();
  }
}
#endif

// A COUNT starts: counters zero, the arguments' ranges known.
void count_begin(std::vector<std::pair<uintptr_t, uintptr_t>> ranges) {
  for (auto &c : g_cnt) c = 0;
  g_global_ranges = std::move(ranges);
  g_barrier_calls = 0;
#if defined(GRAPHC_SIM_COUNT)
  g_bc = BlockCount();
#endif
}

// The block's counts at its end: open requests closed (lanes that never reached them
// had diverged), the busiest lane of each warp, the distinct sectors.
void count_block_end(Block &b) {
  if (!g_counting) return;
  g_cnt[C_BLOCKS]++;
  g_cnt[C_WARPS] += (b.nthreads + 31) / 32;
  g_cnt[C_THREADS] += b.nthreads;
  g_cnt[C_BARRIERS] += b.nthreads ? g_barrier_calls / b.nthreads : 0;
  g_barrier_calls = 0;
#if defined(GRAPHC_SIM_COUNT)
  for (auto &kv : g_bc.open) close_request(kv.second);
  g_bc.open.clear();
  for (size_t w = 0; w * 32 < g_bc.threads.size(); ++w) {
    unsigned long long most = 0, most_instrs = 0;
    for (size_t i = w * 32; i < g_bc.threads.size() && i < w * 32 + 32; ++i) {
      most = g_bc.threads[i].bbs > most ? g_bc.threads[i].bbs : most;
      most_instrs = g_bc.threads[i].instrs > most_instrs ? g_bc.threads[i].instrs : most_instrs;
      g_cnt[C_THREAD_BBS] += g_bc.threads[i].bbs;
    }
    g_cnt[C_WARP_BBS] += most;
    g_cnt[C_WARP_INSTRS] += most_instrs;
  }
  g_bc.threads.clear();
  g_cnt[C_DISTINCT_SECTORS] += g_bc.sectors.size();
  g_bc.sectors.clear();
#endif
}

}  // namespace

extern "C" {

// The prelude's CPU bodies note what instrumentation cannot see: an mma.sync (kind 0,
// once per lane), cp.async's global read (1) and shared write (2) of `bytes` at `p`,
// and where an emulated instruction's body begins (3) and ends (4).
void g_sim_note(int kind, const void *p, unsigned bytes) {
#if defined(GRAPHC_SIM_COUNT)
  if (!g_counting || !tl_block) return;
  if (kind == 3 || kind == 4) {
    if (g_bc.threads.size() < tl_block->nthreads) g_bc.threads.resize(tl_block->nthreads);
    ThreadCount &t = g_bc.threads[tl_thread];
    if (kind == 3 && t.helper_depth++ == 0) {
      t.bbs++;
      t.instrs++;
    }
    if (kind == 4 && t.helper_depth > 0) t.helper_depth--;
    return;
  }
  if (kind == 0) {
    if (tl_thread % 32 == 0) g_cnt[C_MMA]++;
  } else if (kind == 1) {
    note_access((uintptr_t)p, bytes, 0, kSiteCpAsyncGlobal);
  } else if (kind == 2) {
    note_access((uintptr_t)p, bytes, 1, kSiteCpAsyncShared);
  }
#else
  (void)kind;
  (void)p;
  (void)bytes;
#endif
}

#if defined(GRAPHC_SIM_COUNT)
#define G_SITE ((uintptr_t)__builtin_return_address(0))
void __tsan_init(void) {}
void __tsan_func_entry(void *) {}
void __tsan_func_exit(void) {}
void __tsan_vptr_update(void **, void *) {}
void __tsan_vptr_read(void **) {}
void __sanitizer_cov_trace_pc(void) {
  if (g_counting && tl_block) {
    if (g_bc.threads.size() < tl_block->nthreads) g_bc.threads.resize(tl_block->nthreads);
    ThreadCount &t = g_bc.threads[tl_thread];
    if (t.helper_depth == 0) {
      t.bbs++;
      const auto it = g_bb_weight.find(G_SITE);
      if (it != g_bb_weight.end()) t.instrs += it->second;
    }
  }
}
#define G_RW(N)                                                                                        \
  void __tsan_read##N(void *p) { note_access((uintptr_t)p, N, 0, G_SITE); }                            \
  void __tsan_write##N(void *p) { note_access((uintptr_t)p, N, 1, G_SITE); }                           \
  void __tsan_unaligned_read##N(void *p) { note_access((uintptr_t)p, N, 0, G_SITE); }                  \
  void __tsan_unaligned_write##N(void *p) { note_access((uintptr_t)p, N, 1, G_SITE); }                 \
  void __tsan_volatile_read##N(void *p) { note_access((uintptr_t)p, N, 0, G_SITE); }                   \
  void __tsan_volatile_write##N(void *p) { note_access((uintptr_t)p, N, 1, G_SITE); }                  \
  void __tsan_unaligned_volatile_read##N(void *p) { note_access((uintptr_t)p, N, 0, G_SITE); }         \
  void __tsan_unaligned_volatile_write##N(void *p) { note_access((uintptr_t)p, N, 1, G_SITE); }
G_RW(1)
G_RW(2)
G_RW(4)
G_RW(8)
G_RW(16)
#undef G_RW
void __tsan_read_range(void *p, unsigned long n) { note_access((uintptr_t)p, (unsigned)n, 0, G_SITE); }
void __tsan_write_range(void *p, unsigned long n) { note_access((uintptr_t)p, (unsigned)n, 1, G_SITE); }

// Atomics: every fiber runs on the runner's one OS thread, so plain operations are
// atomic here; each is a global (or shared) request of kind atomic. G_RMW defines one
// read-modify-write entry point: the old value, `*a` set to NEW (of `o` and `v`).
#define G_RMW(N, T, OP, NEW)                                     \
  T __tsan_atomic##N##_##OP(volatile T *a, T v, int) {           \
    note_access((uintptr_t)a, sizeof(T), 2, G_SITE);             \
    T o = *a;                                                    \
    *a = (T)(NEW);                                               \
    return o;                                                    \
  }
#define G_CAS(N, T, KIND)                                                          \
  int __tsan_atomic##N##_compare_exchange_##KIND(volatile T *a, T *c, T v, int, int) { \
    note_access((uintptr_t)a, sizeof(T), 2, G_SITE);                              \
    if (*a == *c) {                                                                \
      *a = v;                                                                      \
      return 1;                                                                    \
    }                                                                              \
    *c = *a;                                                                       \
    return 0;                                                                      \
  }
#define G_ATOMICS(N, T)                                                       \
  T __tsan_atomic##N##_load(const volatile T *a, int) {                       \
    note_access((uintptr_t)a, sizeof(T), 0, G_SITE);                          \
    return *a;                                                                \
  }                                                                           \
  void __tsan_atomic##N##_store(volatile T *a, T v, int) {                    \
    note_access((uintptr_t)a, sizeof(T), 1, G_SITE);                          \
    *a = v;                                                                   \
  }                                                                           \
  G_RMW(N, T, exchange, v)                                                    \
  G_RMW(N, T, fetch_add, o + v)                                               \
  G_RMW(N, T, fetch_sub, o - v)                                               \
  G_RMW(N, T, fetch_and, o & v)                                               \
  G_RMW(N, T, fetch_or, o | v)                                                \
  G_RMW(N, T, fetch_xor, o ^ v)                                               \
  G_RMW(N, T, fetch_nand, ~(o & v))                                           \
  G_CAS(N, T, strong)                                                         \
  G_CAS(N, T, weak)                                                           \
  T __tsan_atomic##N##_compare_exchange_val(volatile T *a, T c, T v, int, int) { \
    note_access((uintptr_t)a, sizeof(T), 2, G_SITE);                          \
    T o = *a;                                                                 \
    if (o == c) *a = v;                                                       \
    return o;                                                                 \
  }
G_ATOMICS(8, unsigned char)
G_ATOMICS(16, unsigned short)
G_ATOMICS(32, unsigned int)
G_ATOMICS(64, unsigned long long)
#undef G_ATOMICS
#undef G_CAS
#undef G_RMW
void __tsan_atomic_thread_fence(int) {}
void __tsan_atomic_signal_fence(int) {}
#undef G_SITE
#endif

}  // extern "C"
