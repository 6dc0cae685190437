//! The counting build of cuda-sim on kernels whose counts are known by hand: sectors
//! per warp request (coalescing), shared-memory bank conflicts, barriers, atomics,
//! work per warp. Counted, never timed.

use graphc_runtime::cuda::sim::count::{count_kernel_source, CountArg};
use graphc_runtime::cuda::sim::{self, SimOptions};
use graphc_testkit::{skip, Need};

fn have_cxx() -> bool {
    match sim::build::find_compiler() {
        Ok(_) => true,
        Err(e) => {
            skip(Need::Cxx, e);
            false
        }
    }
}

fn count(
    source: &str,
    grid: u32,
    block: u32,
    args: &[CountArg],
    sample: &[u32],
) -> graphc_compiler::perf::KernelCounters {
    count_kernel_source("k", source, "k", grid, block, 0, args, sample, &SimOptions::default()).expect("counts")
}

fn input(bytes: u64) -> CountArg {
    CountArg { bytes, write: false }
}

fn output(bytes: u64) -> CountArg {
    CountArg { bytes, write: true }
}

#[test]
fn a_coalesced_f32_copy_touches_four_sectors_per_request_and_a_stride_32_read_thirty_two() {
    if !have_cxx() {
        return;
    }
    let n = 64 * 256u64;
    let copy = r#"extern "C" __global__ void k(const float* __restrict__ x, float* __restrict__ y) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = x[i];
}"#;
    let c = count(copy, 64, 256, &[input(4 * n), output(4 * n)], &[0, 32, 63]);
    assert_eq!((c.sampled_blocks, c.warps, c.threads), (3, 24, 768));
    assert_eq!((c.load_requests, c.load_sectors, c.load_bytes), (24, 96, 24 * 128));
    assert_eq!((c.store_requests, c.store_sectors), (24, 96));
    assert_eq!(c.sectors_per_request(), 4.0);
    // Each block reads 1 KiB and writes 1 KiB: 64 distinct sectors.
    assert_eq!(c.block_distinct_sectors, 3 * 64);
    assert_eq!(c.scale(), 64.0 / 3.0);

    let strided = r#"extern "C" __global__ void k(const float* __restrict__ x, float* __restrict__ y) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = x[(unsigned long long)i * 32];
}"#;
    let c = count(strided, 4, 64, &[input(4 * 32 * 256), output(4 * 256)], &[0]);
    assert_eq!((c.load_requests, c.load_sectors), (2, 64));
    assert_eq!((c.store_requests, c.store_sectors), (2, 8));
    // 16-byte vector loads: 32 lanes x 16 bytes = 512 bytes = 16 sectors a request.
    let vec4 = r#"extern "C" __global__ void k(const float4* __restrict__ x, float4* __restrict__ y) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  y[i] = x[i];
}"#;
    let c = count(vec4, 1, 32, &[input(512), output(512)], &[0]);
    assert_eq!((c.load_requests, c.load_sectors), (1, 16));
}

#[test]
fn shared_memory_bank_conflicts_are_counted_per_wavefront() {
    if !have_cxx() {
        return;
    }
    // One warp: a conflict-free store (s[t]), a 32-way conflicting load (column t of a
    // 32x32 tile: every lane in bank 0), a broadcast (every lane reads s[0]), and a
    // padded column (stride 33: conflict-free).
    let src = r#"extern "C" __global__ void k(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float s[32 * 33];
  const unsigned t = threadIdx.x;
  for (int r = 0; r < 32; r++) s[r * 32 + t] = x[t];
  __syncthreads();
  float a = s[t * 32];
  float b = s[0];
  __syncthreads();
  float c = s[t * 33];
  y[t] = a + b + c;
}"#;
    let c = count(src, 1, 32, &[input(128), output(128)], &[0]);
    assert_eq!(c.shared_store_requests, 32);
    assert_eq!(c.shared_load_requests, 3);
    // 32 stores of 1 wavefront, then 32 + 1 + 1 for the loads.
    assert_eq!(c.shared_ideal_wavefronts, 35);
    assert_eq!(c.shared_wavefronts, 32 + 32 + 1 + 1);
    assert_eq!(c.barriers, 2);
}

#[test]
fn atomics_divergence_and_loops_are_counted_per_warp() {
    if !have_cxx() {
        return;
    }
    // Lane t loops t times: the warp issues the busiest lane's 31 iterations; every
    // lane adds into one word (an atomic request per occurrence).
    let src = r#"extern "C" __global__ void k(const float* __restrict__ x, float* __restrict__ y) {
  const unsigned t = threadIdx.x;
  float s = 0.0f;
  for (unsigned i = 0; i < t; i++) s += x[i];
  atomicAdd(&y[0], s);
}"#;
    let c = count(src, 1, 32, &[input(128), output(4)], &[0]);
    assert_eq!(c.atomic_requests, 1);
    // The loop's loads: lane t makes t of them; occurrence k groups lanes k+1..31 (31
    // requests). A float atomicAdd is, on the host, a load and a compare-and-swap: two
    // requests where a GPU issues one.
    assert_eq!(c.load_requests, 31 + 2);
    assert!(c.warp_basic_blocks >= 31, "{c:?}");
    assert!(c.thread_basic_blocks > c.warp_basic_blocks * 10, "{c:?}");
}

/// Each basic block weighs the kernel's own instructions in it (the instrumentation,
/// spills and frame not counted), and `#pragma unroll` unrolls on the host as NVCC
/// does: the unrolled loop issues its loads, multiplies and adds without a compare and
/// branch per iteration.
#[test]
fn instructions_are_weighed_and_unrolled_loops_drop_their_control() {
    if !have_cxx() {
        return;
    }
    let src = |pragma: &str| {
        format!(
            r#"extern "C" __global__ void k(const float* __restrict__ x, float* __restrict__ y) {{
  float s = 0.0f;
  {pragma}
  for (int i = 0; i < 16; ++i) s += x[threadIdx.x + 32 * i] * 2.0f;
  y[threadIdx.x] = s;
}}"#
        )
    };
    let unrolled = count(&src("#pragma unroll"), 1, 32, &[input(4 * 512), output(128)], &[0]);
    let rolled = count(&src("#pragma unroll 1"), 1, 32, &[input(4 * 512), output(128)], &[0]);
    assert_eq!(unrolled.load_requests, 16);
    // 16 loads, multiplies and adds at least; not the dozens a host call would add.
    assert!((48..=160).contains(&unrolled.warp_instructions), "{unrolled:?}");
    assert!(
        rolled.warp_instructions >= unrolled.warp_instructions + 16 * 2,
        "{rolled:?} {unrolled:?}"
    );
}

/// A bf16 attention through the pipeline: its kernel's `mma.sync` are counted (one per
/// warp, not per lane), its emulated instructions count as one basic block each (not
/// their host loops), and the launch is modeled from the counts.
#[test]
fn a_compiled_attention_counts_its_tensor_core_work() {
    use graphc_compiler::perf::{GpuSpec, LaunchWork};
    use graphc_ir::{nn::softmax, DType, GraphBuilder};
    if !have_cxx() {
        return;
    }
    let b = GraphBuilder::new();
    let q = b.input("q", DType::BF16, [1, 2, 64, 64]);
    let k = b.input("k", DType::BF16, [1, 2, 64, 64]);
    let v = b.input("v", DType::BF16, [1, 2, 64, 64]);
    let s = q.matmul(k.transpose(&[0, 1, 3, 2])) * 0.125;
    b.output("o", softmax(s, -1).matmul(v));
    let g = b.finish().unwrap();
    let compiled = graphc_compiler::compile(&g, &Default::default()).unwrap();
    let kernels = graphc_compiler::codegen::generate_all(&compiled.program).unwrap();
    let opts = SimOptions {
        sanitize: sim::Sanitize::Count,
        ..SimOptions::default()
    };
    let session = sim::SimSession::with_kernels(&compiled.program, &compiled.plan, &kernels, &opts).unwrap();
    let launches = session.count_launches(&vec![None; kernels.len()]);
    let counted: Vec<_> = launches
        .iter()
        .filter_map(|l| match &l.work {
            LaunchWork::Counted { counters, .. } => Some(counters),
            _ => None,
        })
        .collect();
    let attention = counted
        .iter()
        .find(|c| c.mmas > 0)
        .expect("an attention kernel on tensor cores");
    // 64 queries x 64 keys x 64 dims per head, QK^T and PV: 2 * 64^3 multiply-adds, an
    // m16n8k16 mma does 16*8*16: at least 256 mma per head (more where tiles are padded
    // or recomputed, but not 4x).
    let per_head = attention.mmas as f64 / attention.sampled_blocks as f64 * attention.grid as f64 / 2.0;
    assert!((256.0..=1024.0).contains(&per_head), "{attention:?}");
    // An mma's host emulation runs dozens of basic blocks per lane; counted as one, the
    // warp's blocks stay within a small multiple of its mma and memory requests.
    let warp_requests = (attention.load_requests + attention.store_requests + attention.shared_load_requests) as f64;
    let per_warp = attention.warp_basic_blocks as f64 / (attention.mmas as f64 + warp_requests);
    assert!(per_warp < 20.0, "{per_warp}: {attention:?}");
    let t = graphc_compiler::perf::step_time(&compiled.program, &launches, GpuSpec::by_name("h200").unwrap(), "");
    assert!(t.modeled_s > 0.0 && t.kernels.iter().any(|k| k.kind == "attention"));
}

#[test]
fn an_ldmatrix_reads_one_wavefront_per_matrix_transposed_or_not() {
    if !have_cxx() {
        return;
    }
    // One warp: 32 rows of 16 bytes staged (72 two-byte stores of one wavefront each),
    // then ldmatrix.x4 plain and transposed of rows 144 bytes apart (conflict-free:
    // 4 wavefronts each, one per 8x8 matrix, as the hardware reads 8 rows of 16 bytes
    // for either), then x4 of rows 128 bytes apart (the 8 rows of a matrix in the same
    // 4 banks: 8 wavefronts each, 32).
    let kernel = r#"extern "C" __global__ void k(const unsigned short* __restrict__ x, unsigned* __restrict__ y) {
  __shared__ __align__(16) unsigned short s[32 * 72];
  const unsigned t = threadIdx.x;
  for (int i = t; i < 32 * 72; i += 32) s[i] = x[i];
  __syncthreads();
  unsigned a[4], b[4], c[4];
  g_ldmatrix_x4(a, s + t * 72);
  g_ldmatrix_x4_trans(b, s + t * 72);
  g_ldmatrix_x4(c, s + t * 64);
  y[t] = a[0] ^ a[3] ^ b[1] ^ b[2] ^ c[0];
}"#;
    let prelude = graphc_compiler::codegen::prelude_source(&[graphc_compiler::codegen::Helper::Ldmatrix]);
    let src = format!("{prelude}\n{kernel}");
    let c = count(&src, 1, 32, &[input(2 * 32 * 72), output(128)], &[0]);
    assert_eq!(c.shared_store_requests, 72);
    assert_eq!(c.shared_load_requests, 3);
    assert_eq!(c.shared_ideal_wavefronts, 72 + 4 + 4 + 4);
    assert_eq!(c.shared_wavefronts, 72 + 4 + 4 + 32);
}
