//! The helpers that stand for PTX-only instructions: each has a GPU body (inline PTX, under
//! `#ifdef __CUDA_ARCH__`) and a CPU body with the results the PTX ISA defines, for
//! `--device cuda-sim` (the kernel's source compiled for the host, with CUDA's warp
//! built-ins and one OS thread per CUDA thread). Section numbers are PTX ISA 9.0's.

/// The CPU bodies of `g_f16_to_f32` and `g_f32_to_f16` (the GPU bodies are in
/// `prelude.rs`): bit for bit what `cvt` and the NaN fix-ups there give.
pub(super) const F16_CPU: &str = r#"// The same results as the PTX above, in bit arithmetic: exact widening (subnormals
// included), NaN quiet with its payload; narrowing rounds to nearest even, overflows to
// infinity, rounds into subnormals and zero.
__device__ __forceinline__ float g_f16_to_f32(unsigned short h) {
  const unsigned int s = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1fu) return __uint_as_float(s | (m != 0u ? 0x7fc00000u | (m << 13) : 0x7f800000u));
  if (e != 0u) return __uint_as_float(s | ((e + 112u) << 23) | (m << 13));
  const float v = (float)m * 5.9604644775390625e-8f;
  return s != 0u ? -v : v;
}
__device__ __forceinline__ unsigned short g_f32_to_f16(float x) {
  const unsigned int u = __float_as_uint(x), s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(s | 0x7e00u | ((u & 0x7fffffu) >> 13));
  if (a >= 0x477ff000u) return (unsigned short)(s | 0x7c00u);
  if (a >= 0x38800000u) {
    const unsigned int r = a - 0x38000000u;
    return (unsigned short)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  const unsigned int e = a >> 23;
  if (e < 102u) return (unsigned short)s;
  const unsigned int mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
  const unsigned int half = 1u << (shift - 1u), rem = mant & ((half << 1) - 1u);
  unsigned int q = mant >> shift;
  if (rem > half || (rem == half && (q & 1u) != 0u)) q += 1u;
  return (unsigned short)(s | q);
}
"#;

/// Tensor-core MMA, m16n8k16 with bf16 or f16 inputs and f32 accumulators, and the
/// packing of two f32 values into an operand register (`g_pack_bf16x2`,
/// `g_pack_f16x2`). Needs
/// `g_f16_to_f32` and `g_bf16_to_f32` (CPU body).
pub(super) const MMA: &str = r#"// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = A * B + C for one warp.
// Fragments per the PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"
// (section 9.7.14.5.8 in PTX ISA 9.0), groupID g = lane >> 2, t = lane % 4:
//   a[0]: A[g][2t..2t+1], a[1]: A[g+8][2t..2t+1], a[2]: A[g][2t+8..2t+9], a[3]: A[g+8][2t+8..2t+9]
//   b[0]: B[2t..2t+1][g], b[1]: B[2t+8..2t+9][g]
//   c[0..1]: C[g][2t..2t+1], c[2..3]: C[g+8][2t..2t+1]   (d likewise)
// The lower-numbered element in the low 16 bits. Every lane of the warp must call it
// (converged, as .sync.aligned requires); d may be c.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void g_mma_m16n8k16_bf16_f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
#else
// The CPU body gathers rows g, g+8 of A and columns 2t, 2t+1 of B from the lanes
// that hold them (__shfl_sync, all 32 lanes), then for each output element sums the 16
// products in k order in f32 starting from +0 (each product is an f32 multiply: exact
// for bf16 and f16 inputs unless it overflows or underflows f32), and adds C last. The
// tensor cores' summation order and rounding are not specified by the ISA; this is one
// valid order, so results can differ from a GPU's in the last bits when sums round.
__device__ __forceinline__ void g_mma_cpu_gather(float ar[2][16], float bc[2][16], const unsigned a[4], const unsigned b[2], int is_f16) {
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int lane = (int)(tid & 31u), g = lane >> 2, t = lane & 3;
  for (int s = 0; s < 4; s++) {
    // Lane 4g + s holds A[g][2s..2s+1] (a[0]), A[g+8][2s..] (a[1]), A[g][2s+8..] (a[2]), A[g+8][2s+8..] (a[3]).
    for (int i = 0; i < 4; i++) {
      const unsigned v = __shfl_sync(0xffffffffu, a[i], 4 * g + s);
      const int row = i & 1, col = 2 * s + ((i >> 1) << 3);
      ar[row][col] = is_f16 ? g_f16_to_f32((unsigned short)(v & 0xffffu)) : g_bf16_to_f32((unsigned short)(v & 0xffffu));
      ar[row][col + 1] = is_f16 ? g_f16_to_f32((unsigned short)(v >> 16)) : g_bf16_to_f32((unsigned short)(v >> 16));
    }
    // Lane 4n + s holds B[2s..2s+1][n] (b[0]) and B[2s+8..2s+9][n] (b[1]); this lane needs n = 2t, 2t+1.
    for (int j = 0; j < 2; j++) {
      for (int i = 0; i < 2; i++) {
        const unsigned v = __shfl_sync(0xffffffffu, b[i], 4 * (2 * t + j) + s);
        const int k = 2 * s + 8 * i;
        bc[j][k] = is_f16 ? g_f16_to_f32((unsigned short)(v & 0xffffu)) : g_bf16_to_f32((unsigned short)(v & 0xffffu));
        bc[j][k + 1] = is_f16 ? g_f16_to_f32((unsigned short)(v >> 16)) : g_bf16_to_f32((unsigned short)(v >> 16));
      }
    }
  }
}
__device__ __forceinline__ void g_mma_cpu_f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4], int is_f16) {
  float ar[2][16], bc[2][16], r[4];
  g_sim_note(3, 0, 0);
  g_sim_note(0, 0, 0);
  g_mma_cpu_gather(ar, bc, a, b, is_f16);
  for (int i = 0; i < 4; i++) {
    float s = 0.0f;
    for (int k = 0; k < 16; k++) {
      const float p = ar[i >> 1][k] * bc[i & 1][k];
      s = s + p;
    }
    r[i] = s + c[i];
  }
  for (int i = 0; i < 4; i++) d[i] = r[i];
  g_sim_note(4, 0, 0);
}
__device__ __forceinline__ void g_mma_m16n8k16_bf16_f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  g_mma_cpu_f32(d, a, b, c, 0);
}
#endif
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void g_mma_m16n8k16_f16_f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
#else
__device__ __forceinline__ void g_mma_m16n8k16_f16_f32(float d[4], const unsigned a[4], const unsigned b[2], const float c[4]) {
  g_mma_cpu_f32(d, a, b, c, 1);
}
#endif
// Two f32 values rounded to nearest even into one register of two bf16 (f16), `lo` in
// the low half, as mma operands are packed: cvt.rn.{bf16x2,f16x2}.f32 d, hi, lo (PTX
// ISA "cvt", section 9.7.9.21 in PTX ISA 9.0: a into the upper half, b the lower). A
// NaN becomes the canonical NaN 0x7fff; f16 overflows to infinity.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned g_pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned g_pack_f16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#else
__device__ __forceinline__ unsigned g_pack_bf16x2(float lo, float hi) {
  const unsigned a = lo != lo ? 0x7fffu : g_f32_to_bf16(lo), b = hi != hi ? 0x7fffu : g_f32_to_bf16(hi);
  return a | (b << 16);
}
__device__ __forceinline__ unsigned g_pack_f16x2(float lo, float hi) {
  const unsigned a = lo != lo ? 0x7fffu : g_f32_to_f16(lo), b = hi != hi ? 0x7fffu : g_f32_to_f16(hi);
  return a | (b << 16);
}
#endif
"#;

/// `ldmatrix` of one, two or four 8x8 b16 matrices, plain and transposed.
pub(super) const LDMATRIX: &str = r#"// ldmatrix.sync.aligned.m8n8.x{1,2,4}[.trans].shared.b16: PTX ISA "Warp-level matrix load
// instruction: ldmatrix" (section 9.7.14.5.15 in PTX ISA 9.0). Each lane passes the
// address of one 16-byte row (8 b16 elements, 16-byte aligned, in shared memory): lanes
// 8j..8j+7 give rows 0..7 of matrix j. Register j of lane l then holds, low half first,
// matrix j's row l/4, columns 2(l%4) and 2(l%4)+1; with .trans, rows 2(l%4) and
// 2(l%4)+1 of column l/4. For .x1 and .x2 the other lanes' addresses are not used (but
// should be valid shared addresses). Every lane of the warp must call it, converged.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void g_ldmatrix_x1(unsigned r[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void g_ldmatrix_x2(unsigned r[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void g_ldmatrix_x4(unsigned r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void g_ldmatrix_x1_trans(unsigned r[1], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void g_ldmatrix_x2_trans(unsigned r[2], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}
__device__ __forceinline__ void g_ldmatrix_x4_trans(unsigned r[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"((unsigned)__cvta_generic_to_shared(row)));
}
#else
// As the hardware does, each of the lanes that give an address (8 per matrix) reads its
// whole 16-byte row (one shared-memory wavefront per conflict-free matrix, transposed or
// not); then each lane takes its elements from the rows' lanes by __shfl_sync.
__device__ __forceinline__ void g_ldmatrix_cpu(unsigned* r, int num, int trans, const void* row) {
  g_sim_note(3, 0, 0);
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int lane = (int)(tid & 31u);
  unsigned w[4] = {0u, 0u, 0u, 0u};
  if (lane < 8 * num) memcpy(w, row, 16);
  for (int j = 0; j < num; j++) {
    if (!trans) {
      // Row l/4, columns 2(l%4) and 2(l%4)+1: word l%4 of lane 8j + l/4's row.
      unsigned v[4];
      for (int q = 0; q < 4; q++) v[q] = __shfl_sync(0xffffffffu, w[q], 8 * j + (lane >> 2));
      r[j] = v[lane & 3];
    } else {
      // Rows 2(l%4) and 2(l%4)+1, column l/4: half (l/4)%2 of word l/8 of each.
      unsigned lo[4], hi[4];
      for (int q = 0; q < 4; q++) {
        lo[q] = __shfl_sync(0xffffffffu, w[q], 8 * j + 2 * (lane & 3));
        hi[q] = __shfl_sync(0xffffffffu, w[q], 8 * j + 2 * (lane & 3) + 1);
      }
      const int c = lane >> 2, shift = 16 * (c & 1);
      r[j] = ((lo[c >> 1] >> shift) & 0xffffu) | (((hi[c >> 1] >> shift) & 0xffffu) << 16);
    }
  }
  g_sim_note(4, 0, 0);
}
__device__ __forceinline__ void g_ldmatrix_x1(unsigned r[1], const void* row) { g_ldmatrix_cpu(r, 1, 0, row); }
__device__ __forceinline__ void g_ldmatrix_x2(unsigned r[2], const void* row) { g_ldmatrix_cpu(r, 2, 0, row); }
__device__ __forceinline__ void g_ldmatrix_x4(unsigned r[4], const void* row) { g_ldmatrix_cpu(r, 4, 0, row); }
__device__ __forceinline__ void g_ldmatrix_x1_trans(unsigned r[1], const void* row) { g_ldmatrix_cpu(r, 1, 1, row); }
__device__ __forceinline__ void g_ldmatrix_x2_trans(unsigned r[2], const void* row) { g_ldmatrix_cpu(r, 2, 1, row); }
__device__ __forceinline__ void g_ldmatrix_x4_trans(unsigned r[4], const void* row) { g_ldmatrix_cpu(r, 4, 1, row); }
#endif
"#;

/// `cp.async` global to shared copies with commit and wait groups.
pub(super) const CP_ASYNC: &str = r#"// cp.async.{ca,cg}.shared.global, cp.async.commit_group, cp.async.wait_group N and
// cp.async.wait_all: PTX ISA "Data Movement and Conversion Instructions: cp.async",
// "cp.async.commit_group", "cp.async.wait_group / cp.async.wait_all" (sections
// 9.7.9.25.3.1-4 in PTX ISA 9.0). g_cp_async_N copies N bytes (4 and 8 through .ca, 16
// through .cg) from global to shared memory, both aligned to N; the _zfill forms copy
// only src_bytes (0 <= src_bytes <= N) and zero the rest. The copy happens at some time
// before the wait that covers it: commit closes the thread's current group, wait<N>
// returns once all but the N most recent committed groups are done, wait_all once every
// copy is (committed or not). Other threads see the data after a __syncthreads.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ void g_cp_async_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)));
}
__device__ __forceinline__ void g_cp_async_8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)));
}
__device__ __forceinline__ void g_cp_async_16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)));
}
__device__ __forceinline__ void g_cp_async_4_zfill(void* dst, const void* src, unsigned src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)), "r"(src_bytes));
}
__device__ __forceinline__ void g_cp_async_8_zfill(void* dst, const void* src, unsigned src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)), "r"(src_bytes));
}
__device__ __forceinline__ void g_cp_async_16_zfill(void* dst, const void* src, unsigned src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(__cvta_generic_to_global(src)), "r"(src_bytes));
}
__device__ __forceinline__ void g_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void g_cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
__device__ __forceinline__ void g_cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }
#else
// The CPU body defers every copy to the latest moment the ISA allows, so a kernel that
// reads a destination before the wait that covers it sees the old contents (as it may on
// a GPU): copies are queued per thread with their group (the number of commits before
// them), performed in issue order by the wait that covers them. A queue of more than
// 256 pending copies traps. A kernel must wait for its copies before it exits. The queue
// lives in cuda-sim's storage of the calling CUDA thread (zeroed when the thread starts;
// host threads are reused, and fibers share one).
struct g_cp_async_op { void* dst; const void* src; unsigned bytes, src_bytes, group; };
struct g_cp_async_queue { g_cp_async_op op[256]; unsigned n, commits; };
inline g_cp_async_queue& g_cp_async_q() {
  return *(g_cp_async_queue*)g_sim_thread_storage(sizeof(g_cp_async_queue));
}
inline void g_cp_async_push(void* dst, const void* src, unsigned bytes, unsigned src_bytes) {
  g_sim_note(3, 0, 0);
  g_cp_async_queue& q = g_cp_async_q();
  if (q.n == 256u) g_sim_trap("cp.async: more than 256 copies pending in one thread");
  if (src_bytes > bytes) g_sim_trap("cp.async: src-size larger than cp-size");
  g_sim_note(1, src, src_bytes);
  g_sim_note(2, dst, bytes);
  q.op[q.n].dst = dst;
  q.op[q.n].src = src;
  q.op[q.n].bytes = bytes;
  q.op[q.n].src_bytes = src_bytes;
  q.op[q.n].group = q.commits;
  q.n++;
  g_sim_note(4, 0, 0);
}
// Performs the copies of groups before `group_end`, keeps the rest in order.
inline void g_cp_async_perform(unsigned group_end) {
  g_sim_note(3, 0, 0);
  g_cp_async_queue& q = g_cp_async_q();
  unsigned kept = 0;
  for (unsigned i = 0; i < q.n; i++) {
    const g_cp_async_op o = q.op[i];
    if (o.group < group_end) {
      if (o.src_bytes != 0u) memcpy(o.dst, o.src, o.src_bytes);
      memset((unsigned char*)o.dst + o.src_bytes, 0, o.bytes - o.src_bytes);
    } else {
      q.op[kept++] = o;
    }
  }
  q.n = kept;
  g_sim_note(4, 0, 0);
}
__device__ __forceinline__ void g_cp_async_4(void* dst, const void* src) { g_cp_async_push(dst, src, 4u, 4u); }
__device__ __forceinline__ void g_cp_async_8(void* dst, const void* src) { g_cp_async_push(dst, src, 8u, 8u); }
__device__ __forceinline__ void g_cp_async_16(void* dst, const void* src) { g_cp_async_push(dst, src, 16u, 16u); }
__device__ __forceinline__ void g_cp_async_4_zfill(void* dst, const void* src, unsigned src_bytes) { g_cp_async_push(dst, src, 4u, src_bytes); }
__device__ __forceinline__ void g_cp_async_8_zfill(void* dst, const void* src, unsigned src_bytes) { g_cp_async_push(dst, src, 8u, src_bytes); }
__device__ __forceinline__ void g_cp_async_16_zfill(void* dst, const void* src, unsigned src_bytes) { g_cp_async_push(dst, src, 16u, src_bytes); }
__device__ __forceinline__ void g_cp_async_commit() { g_cp_async_q().commits++; }
template <int N> __device__ __forceinline__ void g_cp_async_wait() {
  const unsigned c = g_cp_async_q().commits;
  g_cp_async_perform(c > (unsigned)N ? c - (unsigned)N : 0u);
}
// wait_all is commit_group then wait_group 0 (PTX ISA): uncommitted copies are done too.
__device__ __forceinline__ void g_cp_async_wait_all() {
  g_cp_async_commit();
  g_cp_async_perform(g_cp_async_q().commits);
}
#endif
"#;

/// Packed half-precision fused multiply-adds.
pub(super) const FMA2: &str = r#"// fma.rn.{bf16x2,f16x2} d, a, b, c: per half, a * b + c rounded once to nearest even
// (PTX ISA "Half Precision Floating Point Instructions: fma", section 9.7.4.4 in PTX
// ISA 9.0; bf16x2 from sm_80); a NaN result is the canonical NaN 0x7fff. The CPU body
// computes each half with f32's fused multiply-add, then rounds to the half type: one
// rounding wherever the f32 result is exact (the products and sums of graphc's uses,
// a small integer times a half value plus a small integer or zero, are); an emulated
// instruction counts as one.
#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned g_fma_bf16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
__device__ __forceinline__ unsigned g_fma_f16x2(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
#else
__device__ __forceinline__ unsigned g_fma_cpu_x2(unsigned a, unsigned b, unsigned c, int is_f16) {
  g_sim_note(3, 0, 0);
  unsigned d = 0;
  for (int h = 0; h < 2; h++) {
    const unsigned short x = (unsigned short)(a >> (16 * h)), y = (unsigned short)(b >> (16 * h)), z = (unsigned short)(c >> (16 * h));
    const float v = is_f16 ? fmaf(g_f16_to_f32(x), g_f16_to_f32(y), g_f16_to_f32(z)) : fmaf(g_bf16_to_f32(x), g_bf16_to_f32(y), g_bf16_to_f32(z));
    const unsigned r = v != v ? 0x7fffu : (is_f16 ? g_f32_to_f16(v) : g_f32_to_bf16(v));
    d |= r << (16 * h);
  }
  g_sim_note(4, 0, 0);
  return d;
}
__device__ __forceinline__ unsigned g_fma_bf16x2(unsigned a, unsigned b, unsigned c) {
  return g_fma_cpu_x2(a, b, c, 0);
}
__device__ __forceinline__ unsigned g_fma_f16x2(unsigned a, unsigned b, unsigned c) {
  return g_fma_cpu_x2(a, b, c, 1);
}
#endif
"#;
