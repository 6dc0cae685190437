// graphc cuda-sim runner, part 3 (after sim_rt.cpp and sim_count.cpp, as one translation unit): the
// protocol with graphc (see the top of sim_rt.cpp), the arguments' allocations and
// guards, loading kernels, running launches.

namespace {

// Run one launch; returns false with g_error set on failure.
bool run_launch(Launch &l) {
  g_error.clear();
  __atomic_store_n(&g_abort_flag, false, __ATOMIC_RELEASE);
  g_launch = &l;
  if (l.grid == 0 || l.block == 0) {
    set_error("launch of %u blocks of %u threads", l.grid, l.block);
    return false;
  }
  if (l.dyn_smem > l.smem_limit) {
    set_error("%u bytes of dynamic shared memory, over the device's %u bytes per block", l.dyn_smem, l.smem_limit);
    return false;
  }
  const unsigned slots = l.per_wave < l.grid ? l.per_wave : l.grid;
  l.per_wave = slots;
  l.blocks = std::vector<Block>(slots);
  for (auto &b : l.blocks) {
    b.warps = std::vector<Warp>((l.block + 31) / 32);
    for (auto &w : b.warps)
      for (int i = 0; i < 32; ++i) w.seq[i] = 0;
  }
  run_fibers(l, slots);
  for (auto &b : l.blocks) {
    for (auto &s : b.smem) free(s.base);
    for (auto &s : b.tstore) free(s.base);
    free(b.dyn);
  }
  g_launch = nullptr;
  return !aborted();
}

void read_exact(void *p, size_t n) {
  unsigned char *c = (unsigned char *)p;
  while (n > 0) {
    ssize_t r = read(0, c, n);
    if (r <= 0) _exit(0);  // graphc went away
    c += r;
    n -= (size_t)r;
  }
}

void write_exact(const void *p, size_t n) {
  const unsigned char *c = (const unsigned char *)p;
  while (n > 0) {
    ssize_t r = write(1, c, n);
    if (r <= 0) _exit(0);
    c += r;
    n -= (size_t)r;
  }
}

unsigned read_u32() {
  unsigned v;
  read_exact(&v, 4);
  return v;
}

void write_u32(unsigned v) { write_exact(&v, 4); }

void reply_error(const std::string &m) {
  write_u32(1);
  write_u32((unsigned)m.size());
  write_exact(m.data(), m.size());
}

unsigned long long fnv64(const unsigned char *p, unsigned long long n) {
  unsigned long long h = 1469598103934665603ull;
  for (unsigned long long i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

struct Module {
  std::string path;
  void (*fn)(void *const *);
  int arity;
};
std::vector<Module> g_modules;

void do_load() {
  unsigned len = read_u32();
  std::string path(len, '\0');
  read_exact(&path[0], len);
  void *h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    reply_error(std::string("cannot load ") + path + ": " + (e ? e : "?"));
    return;
  }
  void *entry = dlsym(h, "graphc_sim_entry");
  void *arity = dlsym(h, "graphc_sim_arity");
  if (!entry || !arity) {
    reply_error(path + " has no graphc_sim_entry / graphc_sim_arity");
    return;
  }
  count_load_weights(path, entry);
  Module m;
  m.path = path;
  m.fn = (void (*)(void *const *))entry;
  m.arity = ((int (*)(void))arity)();
  g_modules.push_back(m);
  write_u32(0);
  write_u32((unsigned)g_modules.size() - 1);
}

bool alloc_arg(Arg &a, unsigned index) {
  const size_t n = a.bytes ? (size_t)a.bytes : 1;
#ifdef G_SIM_ASAN
  (void)index;
  void *p = nullptr;
  if (posix_memalign(&p, 256, n) != 0) return false;
  a.base = a.data = (unsigned char *)p;
#else
  void *p = nullptr;
  if (posix_memalign(&p, 256, n + 2 * kGuard) != 0) return false;
  a.base = (unsigned char *)p;
  a.data = a.base + kGuard;
  for (unsigned k = 0; k < kGuard; ++k) {
    a.base[k] = guard_byte(index, kGuard + k);
    a.data[a.bytes + k] = guard_byte(index, k);
  }
#endif
  return true;
}

// Guard bytes a kernel overwrote (outside ASan): how far before or after.
std::string check_guards(const Arg &a, size_t i) {
#ifdef G_SIM_ASAN
  (void)a;
  (void)i;
  return "";
#else
  for (unsigned k = 0; k < kGuard; ++k)
    if (a.base[k] != guard_byte((unsigned)i, kGuard + k))
      return "wrote " + std::to_string(kGuard - k) + " bytes before argument " + std::to_string(i) + " (" +
             std::to_string(a.bytes) + " bytes)";
  for (unsigned k = kGuard; k-- > 0;)
    if (a.data[a.bytes + k] != guard_byte((unsigned)i, k))
      return "wrote past the end of argument " + std::to_string(i) + " (" + std::to_string(a.bytes) + " bytes), up to " +
             std::to_string(k + 1) + " bytes beyond";
  return "";
#endif
}

// A LAUNCH's or COUNT's fields up to and including the argument table (into g_args);
// the module and the argument count.
std::pair<unsigned, unsigned> read_head(Launch &l) {
  const unsigned module = read_u32();
  l.grid = read_u32();
  l.block = read_u32();
  l.dyn_smem = read_u32();
  l.smem_limit = read_u32();
  l.static_limit = read_u32();
  const unsigned wave_threads = read_u32();
  const unsigned nargs = read_u32();
  l.per_wave = wave_threads / (l.block ? l.block : 1);
  if (l.per_wave == 0) l.per_wave = 1;
  g_args.assign(nargs, Arg());
  for (unsigned i = 0; i < nargs; ++i) {
    read_exact(&g_args[i].bytes, 8);
    g_args[i].flags = read_u32();
    g_args[i].alias = read_u32();
    if (g_args[i].alias != 0xffffffffu && (g_args[i].alias >= i || g_args[g_args[i].alias].alias != 0xffffffffu)) {
      fprintf(stderr, "graphc-sim: argument %u aliases %u\n", i, g_args[i].alias);
      _exit(71);
    }
  }
  return {module, nargs};
}

// Bind the launch to its module: "" or why it cannot run.
std::string bind(Launch &l, unsigned module, unsigned nargs, void *const *ptrs) {
  if (module >= g_modules.size()) return "no module " + std::to_string(module);
  if (g_modules[module].arity != (int)nargs)
    return "the kernel has " + std::to_string(g_modules[module].arity) + " parameters but the launch passes " +
           std::to_string(nargs) + " arguments";
  l.entry = g_modules[module].path.c_str();
  l.fn = g_modules[module].fn;
  l.args = ptrs;
  return "";
}

void do_launch() {
  Launch l;
  const auto [module, nargs] = read_head(l);
  // Group flags: what the group of each leader does.
  std::vector<unsigned> group(nargs, 0);
  for (unsigned i = 0; i < nargs; ++i) group[g_args[i].alias == 0xffffffffu ? i : g_args[i].alias] |= g_args[i].flags;
  std::string err;
  for (unsigned i = 0; i < nargs; ++i) {
    Arg &a = g_args[i];
    if (a.alias != 0xffffffffu) continue;
    if (!alloc_arg(a, i)) {
      fprintf(stderr, "graphc-sim: cannot allocate %llu bytes\n", a.bytes);
      _exit(72);
    }
    if (group[i] & 1u)
      read_exact(a.data, (size_t)a.bytes);
    else
      memset(a.data, 0xff, (size_t)a.bytes);
    if (!(group[i] & 2u)) a.hash = fnv64(a.data, a.bytes);
  }
  std::vector<void *> ptrs(nargs);
  for (unsigned i = 0; i < nargs; ++i) ptrs[i] = g_args[g_args[i].alias == 0xffffffffu ? i : g_args[i].alias].data;
  err = bind(l, module, nargs, ptrs.data());
  if (err.empty() && !run_launch(l)) {
    G_HB_ACQUIRE(&g_error);
    err = g_error;
  }
  for (unsigned i = 0; i < nargs && err.empty(); ++i) {
    const Arg &a = g_args[i];
    if (a.alias != 0xffffffffu) continue;
    err = check_guards(a, i);
    if (err.empty() && !(group[i] & 2u) && fnv64(a.data, a.bytes) != a.hash)
      err = "wrote to argument " + std::to_string(i) + ", which the kernel only reads (a const parameter)";
  }
  if (!err.empty()) {
    reply_error(err);
  } else {
    write_u32(0);
    for (unsigned i = 0; i < nargs; ++i)
      if (g_args[i].alias == 0xffffffffu && (group[i] & 2u)) write_exact(g_args[i].data, (size_t)g_args[i].bytes);
  }
  for (auto &a : g_args)
    if (a.alias == 0xffffffffu) free(a.base);
  g_args.clear();
}

// COUNT: the launch's header and argument table (no bytes follow), u32 n and n block
// indices, per argument a fill (u64 hi, u32 width); every argument starts as zero bytes
// (mapped, untouched until used) or, with a fill, integers of `width` bytes spread over
// [0, hi); only the sampled blocks run -> u32 0, u32 C_N, the C_N u64 counters | u32 1, message.
void do_count() {
  Launch l;
  const auto [module, nargs] = read_head(l);
  const unsigned n = read_u32();
  l.sample.resize(n);
  for (unsigned i = 0; i < n; ++i) l.sample[i] = read_u32();
  std::vector<std::pair<unsigned long long, unsigned>> fills(nargs);
  for (unsigned i = 0; i < nargs; ++i) {
    read_exact(&fills[i].first, 8);
    fills[i].second = read_u32();
  }
  l.per_wave = 1;
  std::vector<void *> maps(nargs, nullptr);
  std::vector<void *> ptrs(nargs, nullptr);
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  for (unsigned i = 0; i < nargs; ++i) {
    Arg &a = g_args[i];
    if (a.alias != 0xffffffffu) continue;
    const size_t bytes = (size_t)a.bytes + 2 * kGuard;
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      fprintf(stderr, "graphc-sim: cannot map %llu bytes\n", a.bytes);
      _exit(72);
    }
    maps[i] = m;
    a.base = (unsigned char *)m;
    a.data = a.base + kGuard;
    ranges.push_back({(uintptr_t)a.data, (uintptr_t)a.data + a.bytes});
    // Indices spread over their range (a multiplicative hash of the position), so a
    // data-dependent kernel's sampled blocks see what a real batch gives them.
    const unsigned long long hi = fills[i].first;
    const unsigned width = fills[i].second;
    if (hi > 0 && (width == 4 || width == 8))
      for (unsigned long long e = 0; e < a.bytes / width; ++e) {
        const unsigned long long v = (e * 2654435761ull + 40503ull) % hi;
        memcpy(a.data + e * width, &v, width);  // little-endian: the low bytes
      }
  }
  for (unsigned i = 0; i < nargs; ++i) ptrs[i] = g_args[g_args[i].alias == 0xffffffffu ? i : g_args[i].alias].data;
  std::string err;
  for (unsigned b : l.sample)
    if (b >= l.grid) err = "sampled block " + std::to_string(b) + " of a grid of " + std::to_string(l.grid);
  if (err.empty()) err = bind(l, module, nargs, ptrs.data());
  if (err.empty()) {
    count_begin(std::move(ranges));
    g_counting = true;
    const bool ok = run_launch(l);
    g_counting = false;
    if (!ok) err = g_error;
  }
  if (!err.empty()) {
    reply_error(err);
  } else {
    write_u32(0);
    write_u32(C_N);
    write_exact(g_cnt, sizeof g_cnt);
  }
  for (unsigned i = 0; i < nargs; ++i)
    if (maps[i]) munmap(maps[i], (size_t)g_args[i].bytes + 2 * kGuard);
  g_args.clear();
}

}  // namespace

int main() {
  for (;;) {
    const unsigned cmd = read_u32();
    if (cmd == 1)
      do_load();
    else if (cmd == 2)
      do_launch();
    else if (cmd == 4)
      do_count();
    else
      return 0;
  }
}
