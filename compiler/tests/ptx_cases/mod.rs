//! Small kernels, one per PTX-only prelude helper (`graphc_compiler::codegen::Helper`),
//! with their inputs and a checker, for running through `--device cuda-sim` (the CPU
//! bodies) or a GPU (the PTX bodies).
//!
//! A [`Case`] is a whole translation unit (the helpers, then one `extern "C" __global__`
//! entry whose parameters are all pointers), launched as a 1-D grid of `grid_blocks`
//! blocks of `block_threads` threads with `buffers` as its arguments, in order (each
//! copied to the device; outputs too, so a word a kernel does not write keeps its initial
//! value). After the launch, `check` gets the bytes of buffer `output` and says whether
//! they are right. [`Exec::Sim`] asks for the simulator's exact results (the documented
//! mma summation order, `cp.async` copies done at the last moment the ISA allows);
//! [`Exec::Gpu`] accepts what the ISA allows a GPU to give.
#![allow(dead_code)] // Each test binary that includes this module uses part of it.

use graphc_compiler::codegen::{prelude_source, Helper};
use half::f16;

/// Where a case ran, which decides what its checker accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exec {
    /// The CPU bodies (cuda-sim): results exactly as the helpers document.
    Sim,
    /// The PTX bodies on a GPU: mma sums within rounding, early reads either value.
    Gpu,
}

/// A checker: the output buffer's bytes after the launch, and where it ran.
pub type Checker = Box<dyn Fn(&[u8], Exec) -> Result<(), String> + Send + Sync>;

pub struct Case {
    pub name: String,
    /// The whole translation unit (header-free CUDA C, as codegen emits).
    pub source: String,
    pub entry: String,
    pub block_threads: u32,
    pub grid_blocks: u32,
    /// The initial contents of every pointer parameter, in parameter order.
    pub buffers: Vec<Vec<u8>>,
    /// The buffer `check` reads after the launch.
    pub output: usize,
    pub check: Checker,
}

/// Every case: f16 conversions, mma (bf16/f16, exact and rounding sums), ldmatrix
/// (x1/x2/x4, plain and transposed), cp.async.
pub fn cases() -> Vec<Case> {
    let mut v = vec![f16_case()];
    for f16_inputs in [false, true] {
        for exact in [true, false] {
            v.push(mma_case(f16_inputs, exact));
        }
    }
    for num in [1, 2, 4] {
        for trans in [false, true] {
            v.push(ldmatrix_case(num, trans));
        }
    }
    v.push(cp_async_case());
    v
}

/// splitmix64: a fixed pattern of pseudo-random words.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

pub fn u16s_to_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn u32s_to_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_to_u32s(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Checks the length of an output, as words.
fn words(out: &[u8], n: usize) -> Result<Vec<u32>, String> {
    if out.len() != 4 * n {
        return Err(format!("output is {} bytes, expected {}", out.len(), 4 * n));
    }
    Ok(bytes_to_u32s(out))
}

// ---- f16 conversions -------------------------------------------------------------

/// The f32 inputs of the narrowing test: specials, each f16 rounding boundary (the
/// midpoints between neighbouring f16 values, and their f32 neighbours), NaN payloads,
/// and pseudo-random bit patterns.
fn f16_narrow_inputs() -> Vec<u32> {
    let mut v: Vec<u32> = vec![
        0,
        0x8000_0000,
        0x7f80_0000,
        0xff80_0000,
        0x7fc0_0000,
        0x7f80_0001,
        0xffbf_ffff,
    ];
    v.extend([
        0x477f_efff,
        0x477f_f000,
        0x477f_f001,
        0x3380_0000,
        0x3380_0001,
        0x337f_ffff,
        0x0000_0001,
    ]);
    for h in 0u16..0x7c00 {
        let lo = f16::from_bits(h).to_f32() as f64;
        let hi = f16::from_bits(h + 1).to_f32() as f64;
        let mid = ((lo + hi) / 2.0) as f32; // exact: 12 significant bits
        let m = mid.to_bits();
        for u in [m - 1, m, m + 1] {
            v.push(u);
            v.push(u | 0x8000_0000);
        }
    }
    let mut r = Rng::new(0x0f16);
    for _ in 0..8192 {
        v.push(r.next() as u32);
    }
    for p in [1u32, 0x1fff, 0x2000, 0x3f_ffff, 0x40_0000, 0x7f_ffff] {
        v.push(0x7f80_0000 | p);
        v.push(0xff80_0000 | p);
    }
    v
}

/// `g_f32_to_f16` on the inputs above, then `g_f16_to_f32` on every f16 bit pattern;
/// expected: the `half` crate (which rounds to nearest even and keeps NaN payloads,
/// quieted, as the helpers' fix-ups do).
fn f16_case() -> Case {
    let narrow = f16_narrow_inputs();
    let n = narrow.len();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let total = n + all.len();
    let kernel = format!(
        "extern \"C\" __global__ void g_test_f16(const float* x, const unsigned short* h, unsigned int* out) {{\n\
         \x20 for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < {total}u; i += gridDim.x * blockDim.x) {{\n\
         \x20   if (i < {n}u) out[i] = g_f32_to_f16(x[i]);\n\
         \x20   else out[i] = __float_as_uint(g_f16_to_f32(h[i - {n}u]));\n\
         \x20 }}\n\
         }}\n"
    );
    let expected: Vec<u32> = narrow
        .iter()
        .map(|&u| u32::from(f16::from_f32(f32::from_bits(u)).to_bits()))
        .chain(all.iter().map(|&h| f16::from_bits(h).to_f32().to_bits()))
        .collect();
    let inputs = narrow.clone();
    Case {
        name: "f16_convert".into(),
        source: prelude_source(&[Helper::F16]) + &kernel,
        entry: "g_test_f16".into(),
        block_threads: 256,
        grid_blocks: 4,
        buffers: vec![u32s_to_bytes(&narrow), u16s_to_bytes(&all), vec![0; 4 * total]],
        output: 2,
        check: Box::new(move |out, _| {
            let got = words(out, total)?;
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                if g != e {
                    let what = if i < n {
                        format!("g_f32_to_f16({:#010x})", inputs[i])
                    } else {
                        format!("g_f16_to_f32({:#06x})", i - n)
                    };
                    return Err(format!("{what} = {g:#x}, expected {e:#x}"));
                }
            }
            Ok(())
        }),
    }
}

// ---- mma.sync m16n8k16 -------------------------------------------------------------

/// Warps per block of the mma case (each its own matrices).
const MMA_WARPS: usize = 2;
/// K of the mma case: two m16n8k16 steps, the second accumulating onto the first.
const MMA_K: usize = 32;

fn half_bits(x: f32, f16_inputs: bool) -> u16 {
    if f16_inputs {
        f16::from_f32(x).to_bits()
    } else {
        half::bf16::from_f32(x).to_bits()
    }
}

fn half_value(h: u16, f16_inputs: bool) -> f32 {
    if f16_inputs {
        f16::from_bits(h).to_f32()
    } else {
        f32::from_bits(u32::from(h) << 16)
    }
}

/// The mma kernel: per warp, A 16x32 row-major, B as Bt 8x32 (row n holds B's column n,
/// k contiguous: the .col layout), C and D 16x8 row-major. Each lane packs its fragments
/// from memory as the ISA lays them out.
fn mma_kernel(func: &str) -> String {
    format!(
        "__device__ __forceinline__ unsigned int g_test_pack(const unsigned short* p) {{\n\
         \x20 return (unsigned int)p[0] | ((unsigned int)p[1] << 16);\n\
         }}\n\
         extern \"C\" __global__ void g_test_mma(const unsigned short* A, const unsigned short* Bt, const float* C, float* D) {{\n\
         \x20 const unsigned int w = threadIdx.x >> 5, lane = threadIdx.x & 31u, g = lane >> 2, t = lane & 3u;\n\
         \x20 const unsigned short* a = A + w * 16u * {MMA_K}u;\n\
         \x20 const unsigned short* bt = Bt + w * 8u * {MMA_K}u;\n\
         \x20 const unsigned int c0 = w * 128u + g * 8u + 2u * t, c1 = c0 + 64u;\n\
         \x20 float acc[4] = {{C[c0], C[c0 + 1u], C[c1], C[c1 + 1u]}};\n\
         \x20 for (unsigned int ks = 0; ks < {MMA_K}u; ks += 16u) {{\n\
         \x20   unsigned int fa[4], fb[2];\n\
         \x20   fa[0] = g_test_pack(a + g * {MMA_K}u + ks + 2u * t);\n\
         \x20   fa[1] = g_test_pack(a + (g + 8u) * {MMA_K}u + ks + 2u * t);\n\
         \x20   fa[2] = g_test_pack(a + g * {MMA_K}u + ks + 2u * t + 8u);\n\
         \x20   fa[3] = g_test_pack(a + (g + 8u) * {MMA_K}u + ks + 2u * t + 8u);\n\
         \x20   fb[0] = g_test_pack(bt + g * {MMA_K}u + ks + 2u * t);\n\
         \x20   fb[1] = g_test_pack(bt + g * {MMA_K}u + ks + 2u * t + 8u);\n\
         \x20   {func}(acc, fa, fb, acc);\n\
         \x20 }}\n\
         \x20 D[c0] = acc[0];\n\
         \x20 D[c0 + 1u] = acc[1];\n\
         \x20 D[c1] = acc[2];\n\
         \x20 D[c1 + 1u] = acc[3];\n\
         }}\n"
    )
}

/// D = A * B + C through two chained mma steps. `exact`: small integers, so every sum is
/// exact and any order gives the same bits; otherwise values in [-2, 2) whose sums round
/// (the simulator must follow the documented order: per step, products summed in k
/// order from +0, then the accumulator added).
fn mma_case(f16_inputs: bool, exact: bool) -> Case {
    let mut r = Rng::new(0x3a3a + u64::from(f16_inputs) * 2 + u64::from(exact));
    let val = |r: &mut Rng| -> f32 {
        if exact {
            r.below(9) as f32 - 4.0
        } else {
            (r.below(1 << 20) as f32 / (1 << 18) as f32) - 2.0
        }
    };
    let a: Vec<u16> = (0..MMA_WARPS * 16 * MMA_K)
        .map(|_| half_bits(val(&mut r), f16_inputs))
        .collect();
    let bt: Vec<u16> = (0..MMA_WARPS * 8 * MMA_K)
        .map(|_| half_bits(val(&mut r), f16_inputs))
        .collect();
    let c: Vec<f32> = (0..MMA_WARPS * 128)
        .map(|_| {
            if exact {
                r.below(201) as f32 - 100.0
            } else {
                val(&mut r) * 3.0
            }
        })
        .collect();
    // The documented order, and a bound on the rounding a GPU's order may differ by.
    let mut expected = vec![0f32; MMA_WARPS * 128];
    let mut bound = vec![0f32; MMA_WARPS * 128];
    for w in 0..MMA_WARPS {
        for i in 0..16 {
            for j in 0..8 {
                let mut acc = c[w * 128 + i * 8 + j];
                let mut mag = acc.abs();
                for ks in (0..MMA_K).step_by(16) {
                    let mut s = 0f32;
                    for k in ks..ks + 16 {
                        let x = half_value(a[w * 16 * MMA_K + i * MMA_K + k], f16_inputs);
                        let y = half_value(bt[w * 8 * MMA_K + j * MMA_K + k], f16_inputs);
                        s += x * y;
                        mag += (x * y).abs();
                    }
                    acc += s; // s + acc: the step's sum, then the accumulator
                }
                expected[w * 128 + i * 8 + j] = acc;
                bound[w * 128 + i * 8 + j] = mag * 1e-5;
            }
        }
    }
    let (func, ty) = if f16_inputs {
        ("g_mma_m16n8k16_f16_f32", "f16")
    } else {
        ("g_mma_m16n8k16_bf16_f32", "bf16")
    };
    let name = format!("mma_{ty}_{}", if exact { "exact" } else { "rounding" });
    let c_bytes: Vec<u8> = c.iter().flat_map(|x| x.to_le_bytes()).collect();
    Case {
        name: name.clone(),
        source: prelude_source(&[Helper::Mma]) + &mma_kernel(func),
        entry: "g_test_mma".into(),
        block_threads: 32 * MMA_WARPS as u32,
        grid_blocks: 1,
        buffers: vec![
            u16s_to_bytes(&a),
            u16s_to_bytes(&bt),
            c_bytes,
            vec![0xff; 4 * MMA_WARPS * 128],
        ],
        output: 3,
        check: Box::new(move |out, exec| {
            let got = words(out, MMA_WARPS * 128)?;
            for (i, &g) in got.iter().enumerate() {
                let e = expected[i];
                let ok = match exec {
                    Exec::Sim => g == e.to_bits(),
                    Exec::Gpu if exact => g == e.to_bits(),
                    Exec::Gpu => (f32::from_bits(g) - e).abs() <= bound[i],
                };
                if !ok {
                    let (w, rc) = (i / 128, i % 128);
                    return Err(format!(
                        "{name}: warp {w} D[{}][{}] = {:e} ({g:#010x}), expected {e:e} ({:#010x})",
                        rc / 8,
                        rc % 8,
                        f32::from_bits(g),
                        e.to_bits()
                    ));
                }
            }
            Ok(())
        }),
    }
}

// ---- ldmatrix ----------------------------------------------------------------------

/// One warp stores 32 rows of 8 b16 elements in shared memory, then loads `num` 8x8
/// matrices whose row r of matrix j is the row `perm[8j + r]`, each lane giving the
/// address of row `perm[lane]`; lane l writes its registers to out[l * num ..].
fn ldmatrix_case(num: usize, trans: bool) -> Case {
    let mut r = Rng::new(0x1d + num as u64 * 2 + u64::from(trans));
    let src: Vec<u16> = (0..256).map(|_| r.next() as u16).collect();
    let mut perm: Vec<u32> = (0..32).collect();
    for i in (1..32).rev() {
        perm.swap(i, r.below(i as u64 + 1) as usize);
    }
    let func = format!("g_ldmatrix_x{num}{}", if trans { "_trans" } else { "" });
    let kernel = format!(
        "struct alignas(16) g_test_tile {{ unsigned short e[256]; }};\n\
         extern \"C\" __global__ void g_test_ldmatrix(const unsigned short* src, const unsigned int* perm, unsigned int* out) {{\n\
         \x20 __shared__ g_test_tile tile;\n\
         \x20 const unsigned int lane = threadIdx.x;\n\
         \x20 for (unsigned int i = 0; i < 8u; i++) tile.e[lane * 8u + i] = src[lane * 8u + i];\n\
         \x20 __syncthreads();\n\
         \x20 unsigned int r[{num}];\n\
         \x20 {func}(r, &tile.e[perm[lane] * 8u]);\n\
         \x20 for (unsigned int j = 0; j < {num}u; j++) out[lane * {num}u + j] = r[j];\n\
         }}\n"
    );
    // Element (row, col) of matrix j.
    let m = |j: usize, row: usize, col: usize| u32::from(src[perm[8 * j + row] as usize * 8 + col]);
    let mut expected = Vec::with_capacity(32 * num);
    for l in 0..32 {
        for j in 0..num {
            let (q, p) = (l / 4, 2 * (l % 4));
            expected.push(if trans {
                m(j, p, q) | (m(j, p + 1, q) << 16)
            } else {
                m(j, q, p) | (m(j, q, p + 1) << 16)
            });
        }
    }
    let name = format!("ldmatrix_x{num}{}", if trans { "_trans" } else { "" });
    Case {
        name: name.clone(),
        source: prelude_source(&[Helper::Ldmatrix]) + &kernel,
        entry: "g_test_ldmatrix".into(),
        block_threads: 32,
        grid_blocks: 1,
        buffers: vec![u16s_to_bytes(&src), u32s_to_bytes(&perm), vec![0; 4 * 32 * num]],
        output: 2,
        check: Box::new(move |out, _| {
            let got = words(out, 32 * num)?;
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                if g != e {
                    return Err(format!(
                        "{name}: lane {} register {} = {g:#010x}, expected {e:#010x}",
                        i / num,
                        i % num
                    ));
                }
            }
            Ok(())
        }),
    }
}

// ---- cp.async ----------------------------------------------------------------------

const CPA_THREADS: usize = 64;
/// Observations per thread (16 words each): before any wait, after wait_group 2, 1, 0,
/// after wait_all, and the next thread's region after wait_all and __syncthreads.
const CPA_OBS: usize = 6;

/// Each thread's 16-word region of shared memory: which group fills word i (None: no
/// copy touches it) and how many of its bytes come from the source (the rest zeroed).
fn cpa_word(t: usize, i: usize) -> Option<(usize, usize)> {
    let zf16 = t % 16; // bytes of the 16-byte zfill copy (words 8..11) from the source
    let zf8 = t % 9; // of the 8-byte zfill copy (words 12..13)
    let zf4 = t % 5; // of the 4-byte zfill copy (word 14)
    let from = |start: usize, n: usize| n.saturating_sub(4 * (i - start)).min(4);
    match i {
        0..=3 => Some((0, 4)),
        4..=6 => Some((1, 4)),
        8..=11 => Some((2, from(8, zf16))),
        12..=13 => Some((2, from(12, zf8))),
        14 => Some((3, zf4)),
        _ => None,
    }
}

fn cp_async_kernel() -> String {
    let n = CPA_THREADS;
    format!(
        "struct alignas(16) g_test_smem {{ unsigned int w[{n} * 16]; }};\n\
         __device__ __forceinline__ void g_test_observe(unsigned int* out, const unsigned int* region) {{\n\
         \x20 for (unsigned int i = 0; i < 16u; i++) out[i] = region[i];\n\
         }}\n\
         extern \"C\" __global__ void g_test_cp_async(const unsigned int* src, unsigned int* out) {{\n\
         \x20 __shared__ g_test_smem sh;\n\
         \x20 const unsigned int t = threadIdx.x;\n\
         \x20 unsigned int* mine = &sh.w[t * 16u];\n\
         \x20 const unsigned int* from = src + t * 16u;\n\
         \x20 unsigned int* o = out + t * {CPA_OBS}u * 16u;\n\
         \x20 for (unsigned int i = 0; i < 16u; i++) mine[i] = 0xa5a50000u | (t << 8) | i;\n\
         \x20 __syncthreads();\n\
         \x20 g_cp_async_16(mine, from);\n\
         \x20 g_cp_async_commit();\n\
         \x20 g_cp_async_8(mine + 4, from + 4);\n\
         \x20 g_cp_async_4(mine + 6, from + 6);\n\
         \x20 g_cp_async_commit();\n\
         \x20 g_cp_async_16_zfill(mine + 8, from + 8, t % 16u);\n\
         \x20 g_cp_async_8_zfill(mine + 12, from + 12, t % 9u);\n\
         \x20 g_cp_async_commit();\n\
         \x20 g_test_observe(o, mine);\n\
         \x20 g_cp_async_wait<2>();\n\
         \x20 g_test_observe(o + 16, mine);\n\
         \x20 g_cp_async_wait<1>();\n\
         \x20 g_test_observe(o + 32, mine);\n\
         \x20 g_cp_async_4_zfill(mine + 14, from + 14, t % 5u);\n\
         \x20 g_cp_async_wait<0>();\n\
         \x20 g_test_observe(o + 48, mine);\n\
         \x20 g_cp_async_wait_all();\n\
         \x20 g_test_observe(o + 64, mine);\n\
         \x20 __syncthreads();\n\
         \x20 g_test_observe(o + 80, &sh.w[((t + 1u) % {n}u) * 16u]);\n\
         }}\n"
    )
}

/// Groups 0, 1, 2 committed, group 3 (word 14) left open; the early read and each wait
/// must see exactly the groups it covers done (Sim), or at least those (Gpu: a copy may
/// land before its wait). wait_group 0 does not cover the open group; wait_all does.
fn cp_async_case() -> Case {
    let n = CPA_THREADS;
    let mut r = Rng::new(0xc9a5);
    let src: Vec<u32> = (0..n * 16).map(|_| r.next() as u32).collect();
    let stale = |t: usize, i: usize| 0xa5a5_0000 | ((t as u32) << 8) | i as u32;
    let fresh = {
        let src = src.clone();
        move |t: usize, i: usize| match cpa_word(t, i) {
            None => stale(t, i),
            Some((_, b)) => src[t * 16 + i] & (((1u64 << (8 * b)) - 1) as u32),
        }
    };
    // The groups done at each observation: before any wait, wait<2>, wait<1>, wait<0>,
    // wait_all, and the neighbour's region after __syncthreads.
    let done = [0usize, 1, 2, 3, 4, 4];
    Case {
        name: "cp_async".into(),
        source: prelude_source(&[Helper::CpAsync]) + &cp_async_kernel(),
        entry: "g_test_cp_async".into(),
        block_threads: n as u32,
        grid_blocks: 1,
        buffers: vec![u32s_to_bytes(&src), vec![0; 4 * n * CPA_OBS * 16]],
        output: 1,
        check: Box::new(move |out, exec| {
            let got = words(out, n * CPA_OBS * 16)?;
            for t in 0..n {
                for (k, &d) in done.iter().enumerate() {
                    let owner = if k == 5 { (t + 1) % n } else { t };
                    for i in 0..16 {
                        let g = got[(t * CPA_OBS + k) * 16 + i];
                        let group = cpa_word(owner, i).map_or(0, |(grp, _)| grp);
                        let (st, fr) = (stale(owner, i), fresh(owner, i));
                        let ok = if cpa_word(owner, i).is_none() || group < d {
                            g == fr
                        } else {
                            g == st || (exec == Exec::Gpu && g == fr)
                        };
                        if !ok {
                            return Err(format!(
                                "cp_async: thread {t} observation {k} word {i} = {g:#010x} \
                                 (stale {st:#010x}, copied {fr:#010x}, group {group}, {d} groups done)"
                            ));
                        }
                    }
                }
            }
            Ok(())
        }),
    }
}
