// graphc cuda-sim: the CUDA built-ins a generated kernel uses, given their meaning on
// the host. Every kernel translation unit starts with this header; it is compiled by a
// host C++ compiler into a shared object the cuda-sim runner loads. Each CUDA thread
// of a block is a fiber of the runner: barriers, warp shuffles and votes wait until
// every thread (lane of the mask) arrives, and the runner reports a barrier or a
// collective that can never complete instead of hanging.
//
// `__CUDA_ARCH__` is not defined here (prelude helpers choose their CPU body by it);
// `GRAPHC_CUDA_SIM` is.
#ifndef GRAPHC_CUDA_SIM_H
#define GRAPHC_CUDA_SIM_H
#define GRAPHC_CUDA_SIM 1

#include <math.h>
#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// `__restrict__` is a keyword of GCC and Clang already.

struct uint3 {
  unsigned int x, y, z;
};
struct dim3 {
  unsigned int x, y, z;
};
static const int warpSize = 32;

// The runner's side (exported by the runner executable).
extern "C" {
// The ids of the calling CUDA thread.
uint3 g_sim_thread_idx(void);
uint3 g_sim_block_idx(void);
dim3 g_sim_block_dim(void);
dim3 g_sim_grid_dim(void);
void g_sim_syncthreads(void);
unsigned long long g_sim_warp(int kind, unsigned mask, unsigned long long value, int arg, int width);
unsigned g_sim_active_mask(void);
void *g_sim_smem(int id, unsigned long long bytes, unsigned long long align);
void *g_sim_dyn_smem(void);
void g_sim_trap(const char *what);
// What the counting build cannot see by instrumentation, noted by the prelude's CPU
// bodies: an mma.sync (kind 0, by every lane), cp.async's global read (1) and shared
// write (2) of `bytes` at `p`, the start (3) and end (4) of an emulated instruction's
// body (counted as one instruction, not by its host code). Does nothing outside a count.
void g_sim_note(int kind, const void *p, unsigned bytes);
// Zeroed storage of the calling CUDA thread (one object per thread; host-only helper
// state such as cp.async's queue of pending copies).
void *g_sim_thread_storage(unsigned long long bytes);
}

#define threadIdx (g_sim_thread_idx())
#define blockIdx (g_sim_block_idx())
#define blockDim (g_sim_block_dim())
#define gridDim (g_sim_grid_dim())

enum { G_SIM_SHFL_IDX, G_SIM_SHFL_UP, G_SIM_SHFL_DOWN, G_SIM_SHFL_XOR, G_SIM_BALLOT, G_SIM_ALL, G_SIM_ANY, G_SIM_SYNCWARP };

__forceinline__ void __syncthreads() { g_sim_syncthreads(); }
__forceinline__ void __syncwarp(unsigned mask = 0xffffffffu) { g_sim_warp(G_SIM_SYNCWARP, mask, 0, 0, 32); }
__forceinline__ unsigned __activemask() { return g_sim_active_mask(); }

template <class T>
__forceinline__ T g_sim_shfl(int kind, unsigned mask, T v, int arg, int width) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  unsigned long long bits = 0;
  memcpy(&bits, &v, sizeof(T));
  bits = g_sim_warp(kind, mask, bits, arg, width);
  T r;
  memcpy(&r, &bits, sizeof(T));
  return r;
}
template <class T>
__forceinline__ T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  return g_sim_shfl(G_SIM_SHFL_IDX, mask, v, src, width);
}
template <class T>
__forceinline__ T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return g_sim_shfl(G_SIM_SHFL_UP, mask, v, (int)delta, width);
}
template <class T>
__forceinline__ T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  return g_sim_shfl(G_SIM_SHFL_DOWN, mask, v, (int)delta, width);
}
template <class T>
__forceinline__ T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  return g_sim_shfl(G_SIM_SHFL_XOR, mask, v, lane_mask, width);
}
__forceinline__ unsigned __ballot_sync(unsigned mask, int pred) {
  return (unsigned)g_sim_warp(G_SIM_BALLOT, mask, pred != 0, 0, 32);
}
__forceinline__ int __all_sync(unsigned mask, int pred) { return (int)g_sim_warp(G_SIM_ALL, mask, pred != 0, 0, 32); }
__forceinline__ int __any_sync(unsigned mask, int pred) { return (int)g_sim_warp(G_SIM_ANY, mask, pred != 0, 0, 32); }

// Reinterpretation and bit intrinsics.
__forceinline__ float __uint_as_float(unsigned x) { float f; memcpy(&f, &x, 4); return f; }
__forceinline__ unsigned __float_as_uint(float f) { unsigned x; memcpy(&x, &f, 4); return x; }
__forceinline__ float __int_as_float(int x) { float f; memcpy(&f, &x, 4); return f; }
__forceinline__ int __float_as_int(float f) { int x; memcpy(&x, &f, 4); return x; }
__forceinline__ double __longlong_as_double(long long x) { double f; memcpy(&f, &x, 8); return f; }
__forceinline__ long long __double_as_longlong(double f) { long long x; memcpy(&x, &f, 8); return x; }
__forceinline__ int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
__forceinline__ int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
__forceinline__ int __popc(unsigned x) { return __builtin_popcount(x); }
__forceinline__ int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
__forceinline__ int __ffs(int x) { return __builtin_ffs(x); }
__forceinline__ int __ffsll(long long x) { return __builtin_ffsll(x); }
__forceinline__ unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
__forceinline__ unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
__forceinline__ int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
__forceinline__ unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

// Math: the host libm (at least as accurate as CUDA's documented bounds); the fast
// intrinsics as their accurate functions.
__forceinline__ float __expf(float x) { return expf(x); }
__forceinline__ float __logf(float x) { return logf(x); }
__forceinline__ float __sinf(float x) { return sinf(x); }
__forceinline__ float __cosf(float x) { return cosf(x); }
__forceinline__ float __powf(float a, float b) { return powf(a, b); }
__forceinline__ float __fdividef(float a, float b) { return a / b; }
__forceinline__ float rsqrtf(float x) { return 1.0f / sqrtf(x); }
__forceinline__ double rsqrt(double x) { return 1.0 / sqrt(x); }
__forceinline__ float __saturatef(float x) { return x != x ? 0.0f : (x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x)); }
__forceinline__ float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
__forceinline__ int min(int a, int b) { return a < b ? a : b; }
__forceinline__ int max(int a, int b) { return a > b ? a : b; }
__forceinline__ unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
__forceinline__ unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
__forceinline__ long long min(long long a, long long b) { return a < b ? a : b; }
__forceinline__ long long max(long long a, long long b) { return a > b ? a : b; }
__forceinline__ unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
__forceinline__ unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
__forceinline__ float min(float a, float b) { return fminf(a, b); }
__forceinline__ float max(float a, float b) { return fmaxf(a, b); }
__forceinline__ double min(double a, double b) { return fmin(a, b); }
__forceinline__ double max(double a, double b) { return fmax(a, b); }

// Memory: loads through the read-only path, fences, atomics (relaxed, as CUDA's).
template <class T>
__forceinline__ T __ldg(const T *p) { return *p; }
__forceinline__ void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
__forceinline__ void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
__forceinline__ void __trap() { g_sim_trap("__trap()"); }
__forceinline__ unsigned long long __cvta_generic_to_shared(const void *p) { return (unsigned long long)(uintptr_t)p; }

#define G_SIM_INT_ATOMICS(T)                                                                    \
  __forceinline__ T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
  __forceinline__ T atomicSub(T *p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); } \
  __forceinline__ T atomicAnd(T *p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); } \
  __forceinline__ T atomicOr(T *p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }   \
  __forceinline__ T atomicXor(T *p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); } \
  __forceinline__ T atomicExch(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
  __forceinline__ T atomicCAS(T *p, T cmp, T v) {                                               \
    __atomic_compare_exchange_n(p, &cmp, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);          \
    return cmp;                                                                                 \
  }                                                                                             \
  __forceinline__ T atomicMax(T *p, T v) {                                                      \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                               \
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                           \
    return old;                                                                                 \
  }                                                                                             \
  __forceinline__ T atomicMin(T *p, T v) {                                                      \
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);                                               \
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) { \
    }                                                                                           \
    return old;                                                                                 \
  }
G_SIM_INT_ATOMICS(int)
G_SIM_INT_ATOMICS(unsigned)
G_SIM_INT_ATOMICS(long long)
G_SIM_INT_ATOMICS(unsigned long long)
#undef G_SIM_INT_ATOMICS

#define G_SIM_FLOAT_ATOMIC(T, U, NAME, OP)                                                      \
  __forceinline__ T NAME(T *p, T v) {                                                           \
    U *q = (U *)p;                                                                              \
    U old = __atomic_load_n(q, __ATOMIC_RELAXED);                                               \
    for (;;) {                                                                                  \
      T o;                                                                                      \
      memcpy(&o, &old, sizeof(T));                                                              \
      T n = OP;                                                                                 \
      U nb;                                                                                     \
      memcpy(&nb, &n, sizeof(T));                                                               \
      if (__atomic_compare_exchange_n(q, &old, nb, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return o; \
    }                                                                                           \
  }
G_SIM_FLOAT_ATOMIC(float, unsigned, atomicAdd, o + v)
G_SIM_FLOAT_ATOMIC(double, unsigned long long, atomicAdd, o + v)
G_SIM_FLOAT_ATOMIC(float, unsigned, atomicExch, v)
#undef G_SIM_FLOAT_ATOMIC

// Vector types.
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(16) double2 { double x, y; };
__forceinline__ float2 make_float2(float x, float y) { return float2{x, y}; }
__forceinline__ float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
__forceinline__ int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }
__forceinline__ uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }

// The trampoline's helper: call a kernel with its pointer arguments from an array.
template <int... I>
struct g_sim_seq {};
template <int N, int... I>
struct g_sim_make_seq : g_sim_make_seq<N - 1, N - 1, I...> {};
template <int... I>
struct g_sim_make_seq<0, I...> {
  typedef g_sim_seq<I...> type;
};
template <class... P, int... I>
inline void g_sim_call_with(void (*f)(P...), void *const *args, g_sim_seq<I...>) {
  f(static_cast<P>(args[I])...);
}
template <class... P>
inline void g_sim_call(void (*f)(P...), void *const *args) {
  g_sim_call_with(f, args, typename g_sim_make_seq<sizeof...(P)>::type());
}
template <class... P>
inline int g_sim_arity(void (*)(P...)) {
  return (int)sizeof...(P);
}

#define G_SIM_TRAMPOLINE(KERNEL)                                                  \
  extern "C" int graphc_sim_arity(void) { return g_sim_arity(KERNEL); }           \
  extern "C" void graphc_sim_entry(void *const *args) { g_sim_call(KERNEL, args); }

#endif
