//! CUDA C generation from hand-built kernel programs: structure of the generated code,
//! launch configs, GEMM descriptions, errors, and snapshots of representative kernels.

mod codegen_common;

use codegen_common as c;
use graphc_compiler::codegen::{
    generate, generate_all, CodegenError, CudaKernel, GemmEpilogue, GemmOutput, GridSize, ParamAccess, ParamTarget,
};
use graphc_compiler::kernel::{BufferId, ElementwiseKernel, ExprId, KernelKind, MatMulKernel, RowKernel};
use graphc_ir::{BinaryOp, DType, Op, ReduceOp, UnaryOp};

fn gen(p: &graphc_compiler::kernel::Program) -> CudaKernel {
    generate(p, 0).unwrap_or_else(|e| panic!("codegen failed: {e}"))
}

#[test]
fn every_fixture_generates_deterministic_header_free_code() {
    for (name, p) in c::all() {
        let k = gen(&p);
        let again = gen(&p);
        assert_eq!(k, again, "{name}: output is not deterministic");
        assert_eq!(k.name, format!("k0_{}", p.kernels[0].kind_name().replace('-', "_")));
        if k.has_source() {
            assert!(!k.source.contains("#include"), "{name} includes a header");
            assert!(
                k.source.contains("extern \"C\" __global__ void __launch_bounds__"),
                "{name}"
            );
            assert!(
                k.source.contains(&format!(" {}(", k.entry)),
                "{name}: entry not defined"
            );
            assert!(k.entry.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
            assert!(!k.source.contains("__GRAPHC_ENTRY__"));
            assert!(k.launch.block > 0 && k.launch.block <= 1024);
            // Every parameter is declared, pointers restrict-qualified.
            for i in 0..k.params.len() {
                assert!(k.source.contains(&format!("__restrict__ p{i}")), "{name}: p{i}");
            }
        }
        // Serializable (a plan carries it).
        let json = serde_json::to_string(&k).unwrap();
        let back: CudaKernel = serde_json::from_str(&json).unwrap();
        assert_eq!(back, k);
    }
}

#[test]
fn contiguous_elementwise_uses_vector_loads() {
    let k = gen(&c::ew_contiguous_f32());
    let s = &k.source;
    assert!(s.contains("vectorized: 4 elements per step"), "{s}");
    assert!(s.contains("*(g_vec16*)a0 = *(const g_vec16*)(p0 + i);"), "{s}");
    // The bias repeats every 256 elements.
    assert!(s.contains("*(g_vec16*)a2 = *(const g_vec16*)(p2 + i % 256);"), "{s}");
    assert!(s.contains("*(g_vec16*)(p3 + i) = *(const g_vec16*)o0;"), "{s}");
    // numel is a multiple of 4: no tail loop.
    assert!(!s.contains("i < 16384; i += nthreads"), "{s}");
    assert_eq!(k.launch.block, 256);
    assert_eq!(
        k.launch.grid,
        GridSize::PerSm {
            blocks_per_sm: 8,
            max_blocks: 16
        }
    );
    assert_eq!(k.launch.grid.blocks(132), 16);
    assert_eq!(k.params.len(), 4);
    assert_eq!(k.params[3].access, ParamAccess::Write);
    assert_eq!(k.params[2].target, ParamTarget::Buffer(BufferId(2)));
}

#[test]
fn strided_elementwise_takes_the_general_path() {
    let k = gen(&c::ew_general());
    let s = &k.source;
    assert!(!s.contains("g_vec16"), "{s}");
    assert!(s.contains("general: collapsed space [64, 96]"), "{s}");
    // The transposed read, the column broadcast and the offset strided read.
    assert!(s.contains("p0[i0 + i1 * 64]"), "{s}");
    assert!(s.contains("p1[i0]"), "{s}");
    assert!(s.contains("p2[3 + i0 * 200 + i1 * 2]"), "{s}");
    assert!(s.contains("g_max_f32"), "{s}");
}

#[test]
fn collapsed_dims_merge_across_accesses() {
    // [2, 3, 4] read contiguously and with a broadcast along dim 1 and 2 ...
    let dims = [2, 3, 4];
    let mut p = c::P::new();
    let x = p.input("x", DType::F32, &[4, 2, 3]);
    let out = p.temp(DType::F32, &dims);
    let mut b = c::B::new();
    let l = b.load(0, DType::F32);
    // x read transposed: [2,3,4] from a [4,2,3] buffer: strides [3, 1, 6].
    let prog = p.kernel(
        "t",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![c::acc(x, 0, &[3, 1, 6])],
            body: b.b,
            stores: vec![c::store(l, out, &dims)],
        }),
    );
    let k = gen(&prog);
    // dims 0 and 1 merge (3 == 1 * 3 for the input, 12 == 4 * 3 for the store).
    assert!(k.source.contains("collapsed space [6, 4]"), "{}", k.source);
}

#[test]
fn half_types_are_header_free_and_rounded() {
    let k = gen(&c::ew_f16());
    let s = &k.source;
    assert!(s.contains("cvt.f32.f16"), "{s}");
    assert!(s.contains("cvt.rn.f16.f32"), "{s}");
    // The f16 chain stays in f32 (one rounding, at the store).
    assert!(!s.contains("g_rnd_f16(g_gelu_f32("), "{s}");
    assert!(s.contains("g_gelu_f32("), "{s}");
    // f16 sets the vector width to 8 with an f32 store: 4 per step (16-byte f32 stores).
    assert!(s.contains("vectorized: 4 elements per step"), "{s}");
    assert!(s.contains("unsigned short a0[4]"), "{s}");
    let k = gen(&c::ew_bf16());
    let s = &k.source;
    assert!(s.contains("g_bf16_to_f32"), "{s}");
    assert!(s.contains("vectorized: 8 elements per step"), "{s}");
    // The scalar is loaded once, outside the loop.
    assert!(s.contains("const float s1 = g_bf16_to_f32(p1[0]);"), "{s}");
    assert!(!s.contains("cuda_fp16"));
}

#[test]
fn misaligned_offset_falls_back_to_scalar_path() {
    let dims = [64];
    let mut p = c::P::new();
    let x = p.input("x", DType::F32, &[65]);
    let out = p.temp(DType::F32, &dims);
    let mut b = c::B::new();
    let l = b.load(0, DType::F32);
    let prog = p.kernel(
        "slice",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![c::acc(x, 1, &[1])],
            body: b.b,
            stores: vec![c::store(l, out, &dims)],
        }),
    );
    assert!(!gen(&prog).source.contains("g_vec16"));
}

#[test]
fn odd_sizes_get_a_tail_loop() {
    let k = gen(&c::row_softmax(3, 5, DType::F32));
    assert!(k.source.contains("a warp per row"));
    let dims = [1001];
    let mut p = c::P::new();
    let x = p.input("x", DType::F32, &dims);
    let out = p.temp(DType::F32, &dims);
    let mut b = c::B::new();
    let l = b.load(0, DType::F32);
    let e = b.un(UnaryOp::Exp, l);
    let prog = p.kernel(
        "exp",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![c::contig(x, &dims)],
            body: b.b,
            stores: vec![c::store(e, out, &dims)],
        }),
    );
    let s = gen(&prog).source;
    assert!(s.contains("v < 250"), "{s}");
    assert!(s.contains("for (int i = 1000 + tid; i < 1001; i += nthreads)"), "{s}");
}

#[test]
fn softmax_row_kernel_caches_the_row() {
    let k = gen(&c::row_softmax(256, 200, DType::F32));
    let s = &k.source;
    assert!(
        s.contains("a warp per row, 8 elements per thread, inputs cached in registers, vector accesses of 4"),
        "{s}"
    );
    assert!(s.contains("float c0[8];"), "{s}");
    assert!(s.contains("__shfl_xor_sync"), "{s}");
    assert!(!s.contains("__syncthreads"), "warp rows need no block sync: {s}");
    // -inf start and NaN-propagating max.
    assert!(s.contains("float a0 = __uint_as_float(0xff800000u);"), "{s}");
    assert!(s.contains("if (e0 > a0 || e0 != e0) a0 = e0;"), "{s}");
    // The input is read from global memory once.
    assert_eq!(s.matches("(p0 + ").count(), 1, "{s}");
    assert_eq!(k.launch.block, 256);
    // A block per 8 rows on any device.
    assert_eq!(k.launch.grid.blocks(132), 32);
    assert_eq!(k.launch.grid.blocks(8), 32);

    let k = gen(&c::row_softmax(32, 4096, DType::F16));
    let s = &k.source;
    assert!(
        s.contains("a block per row, 16 elements per thread, inputs cached"),
        "{s}"
    );
    assert!(s.contains("__shared__ float red_float[32];"), "{s}");
    assert!(s.contains("__syncthreads();"), "{s}");
    assert_eq!(k.launch.block, 256);
    // f32 accumulation, the result rounded to f16 once.
    assert!(s.contains("const float st1 = g_rnd_f16(a1);"), "{s}");

    // Too long to cache: each pass reads again.
    let k = gen(&c::row_softmax(4, 100_000, DType::F32));
    let s = &k.source;
    assert!(!s.contains("cached"), "{s}");
    assert_eq!(s.matches("(p0 + ").count(), 3, "{s}");
    assert_eq!(k.launch.block, 1024);
}

#[test]
fn layernorm_row_kernel() {
    let k = gen(&c::row_layernorm());
    let s = &k.source;
    // 192 vectors of 4: 64 threads take 3 each.
    assert!(s.contains("a block per row, 12 elements per thread"), "{s}");
    assert_eq!(k.launch.block, 64);
    // mean = sum / n, per-row values computed once, row stores by one thread.
    assert!(s.contains("(a0 / 768.0f)"), "{s}");
    assert!(s.contains("if (t == 0)"), "{s}");
    assert!(s.contains("p3[rb0] = r3;") && s.contains("p4[rb1] = r9;"), "{s}");
    assert!(s.contains("(1.0f / sqrtf(r"), "{s}");
    // gamma and beta have zero row strides: ib1 = 0.
    assert!(
        s.contains("*(g_vec16*)vx1 = *(const g_vec16*)(p1 + ib1 + ci * 4);"),
        "{s}"
    );
    assert_eq!(k.params.len(), 6);
}

#[test]
fn row_kernel_over_a_strided_axis() {
    let k = gen(&c::row_axis0());
    let s = &k.source;
    assert!(s.contains("ib0 + j0 * 64"), "{s}");
    assert!(s.contains("ib0 = o0;"), "{s}");
    // Two stages, both reading the input (cached: 512 / 32 = 16 per thread).
    assert!(s.contains("stage 1: reduce_max"), "{s}");
}

#[test]
fn contiguous_aligned_rows_use_vector_accesses() {
    // f32 softmax [64, 1024]: 4 floats per 16-byte access, loads and stores.
    let k = gen(&c::row_softmax(64, 1024, DType::F32));
    let s = &k.source;
    assert!(s.contains("vector accesses of 4 elements"), "{s}");
    assert!(
        s.contains("*(g_vec16*)vx0 = *(const g_vec16*)(p0 + ib0 + ci * 4);"),
        "{s}"
    );
    assert!(
        s.contains("*(g_vec16*)(p1 + sb0 + ci * 4) = *(const g_vec16*)vo0;"),
        "{s}"
    );
    assert!(!s.contains("p0["), "no scalar loads: {s}");
    assert!(
        s.contains("a block per row, 16 elements per thread, inputs cached in registers"),
        "{s}"
    );
    assert_eq!(k.launch.block, 64);

    // bf16 layernorm [64, 768] (+ gelu): 8 bf16 per access, gamma and beta too, f32
    // accumulation, rounded once per stage result.
    let k = gen(&c::row_layernorm_gelu(64, 768, DType::BF16));
    let s = &k.source;
    assert!(s.contains("vector accesses of 8 elements"), "{s}");
    for p in ["p0 + ib0", "p1 + ib1", "p2 + ib2"] {
        assert!(s.contains(&format!("*(const g_vec16*)({p} + ci * 8);")), "{p}: {s}");
    }
    assert!(
        s.contains("*(g_vec16*)(p3 + sb0 + ci * 8) = *(const g_vec16*)vo0;"),
        "{s}"
    );
    assert!(s.contains("c0[v * 8 + u] = g_bf16_to_f32(vx0[u]);"), "{s}");
    assert!(s.contains("float a0 = 0.0f;"), "{s}");
    assert!(s.contains("const float st0 = g_rnd_bf16((a0 / 768.0f));"), "{s}");
    assert!(s.contains("vo0[u] = g_f32_to_bf16("), "{s}");

    // Mixed widths: bf16 in, f32 out: 4 elements per access (8 bytes of bf16).
    let mut p = c::row_layernorm_gelu(64, 768, DType::BF16);
    p.buffers[3].ty = graphc_ir::TensorType::new(DType::F32, vec![64, 768]);
    if let KernelKind::Row(RowKernel { body, stores, .. }) = &mut p.kernels[0].kind {
        let v = body.push(graphc_compiler::kernel::Expr::Cast(stores[0].value), DType::F32);
        stores[0].value = v;
    }
    let s = gen(&p).source;
    assert!(
        s.contains("*(g_vec8*)vx0 = *(const g_vec8*)(p0 + ib0 + ci * 4);"),
        "{s}"
    );
    assert!(
        s.contains("*(g_vec16*)(p3 + sb0 + ci * 4) = *(const g_vec16*)vo0;"),
        "{s}"
    );
}

#[test]
fn rows_that_cannot_be_vectorized_fall_back_to_scalar() {
    // 1001 f16 elements: not a multiple of 8 (1000 is: 125 vectors, 2000-byte rows).
    let s = gen(&c::row_softmax(64, 1001, DType::F16)).source;
    assert!(!s.contains("vector accesses") && !s.contains("g_vec16"), "{s}");
    assert!(s.contains("p0[ib0 + j0]"), "{s}");
    let s = gen(&c::row_softmax(64, 1000, DType::F16)).source;
    assert!(s.contains("vector accesses of 8 elements"), "{s}");
    // Rows start 2 floats into the buffer: not 16-byte aligned.
    let s = gen(&c::row_softmax_offset(64, 1024, DType::F32, 2)).source;
    assert!(!s.contains("g_vec16"), "{s}");
    assert!(s.contains("const int ib0 = 2 + o0 * 1024;"), "{s}");
    assert!(s.contains("p0[ib0 + j0]"), "{s}");
    // Aligned offset, but a row stride that is not (rows of 1022 in a 1026-wide buffer).
    let mut p = c::row_softmax(64, 1024, DType::F32);
    p.buffers[0].ty = graphc_ir::TensorType::new(DType::F32, vec![64, 1026]);
    if let KernelKind::Row(RowKernel { inputs, .. }) = &mut p.kernels[0].kind {
        inputs[0].strides = vec![1026, 1];
    }
    assert!(!gen(&p).source.contains("g_vec16"));
    // A strided inner axis.
    assert!(!gen(&c::row_axis0()).source.contains("g_vec16"));
}

#[test]
fn launch_shapes_follow_the_row_length() {
    // softmax [8192, 8192] f32: a 512-thread block per row, 16 floats per thread in
    // registers, one block per row.
    let k = gen(&c::row_softmax(8192, 8192, DType::F32));
    assert_eq!(k.launch.block, 512);
    assert_eq!(k.launch.grid.blocks(132), 8192);
    assert!(
        k.source
            .contains("a block per row, 16 elements per thread, inputs cached in registers, vector accesses of 4"),
        "{}",
        k.source
    );
    // layernorm+gelu [8192, 4096] bf16: 256 threads, 16 per thread (two 16-byte loads).
    let k = gen(&c::row_layernorm_gelu(8192, 4096, DType::BF16));
    assert_eq!(k.launch.block, 256);
    assert_eq!(k.launch.grid.blocks(132), 8192);
    assert!(
        k.source
            .contains("a block per row, 16 elements per thread, inputs cached in registers, vector accesses of 8"),
        "{}",
        k.source
    );
    // 16K bf16 still cached (1024 threads x 16); 32K f32 is read again per pass, by vectors.
    let k = gen(&c::row_layernorm_gelu(16, 16384, DType::BF16));
    assert_eq!(k.launch.block, 1024);
    assert!(k.source.contains("inputs cached"), "{}", k.source);
    let k = gen(&c::row_softmax(8, 32768, DType::F32));
    assert_eq!(k.launch.block, 1024);
    assert!(!k.source.contains("cached"), "{}", k.source);
    assert_eq!(
        k.source.matches("*(const g_vec16*)(p0 + ib0 + ci * 4)").count(),
        3,
        "{}",
        k.source
    );
    // Short rows: a warp each.
    assert_eq!(gen(&c::row_softmax(64, 512, DType::F32)).launch.block, 256);
}

#[test]
fn strided_reductions_with_adjacent_rows_are_coalesced() {
    // softmax over axis 1 of [8, 64, 1024]: lanes take adjacent rows (hw), 4 warps split
    // the 64 channels.
    let k = gen(&c::row_softmax_channels(8, 64, 1024, DType::F32));
    let s = &k.source;
    assert!(
        s.contains("32 adjacent rows per block, 4 threads along each row, 16 elements per thread"),
        "{s}"
    );
    assert!(s.contains("row = (int)blockIdx.x * 32 + lane"), "{s}");
    assert!(s.contains("const int t = warp;"), "{s}");
    assert!(s.contains("c0[v] = p0[ib0 + j0 * 1024];"), "{s}");
    assert!(s.contains("red_float[warp * 32 + lane] = a0;"), "{s}");
    assert!(s.contains("if (y > a0 || y != y) a0 = y;"), "{s}");
    assert_eq!(k.launch.block, 128);
    assert_eq!(k.launch.grid.blocks(132), 256);
    // Sum and max over axis 0 of [512, 64]: 64 rows, too few for 32 a block (2 blocks):
    // 8 adjacent rows a block (one 32-byte sector of f32), the 4 lanes of a warp on a
    // row and 8 warps along each, reduced across those lanes, then the warps.
    let k = gen(&c::row_axis0());
    assert!(
        k.source
            .contains("8 adjacent rows per block, 32 threads along each row"),
        "{}",
        k.source
    );
    assert!(k.source.contains("const int t = warp * 4 + lane / 8;"), "{}", k.source);
    assert!(
        k.source.contains("row = (int)blockIdx.x * 8 + lane % 8"),
        "{}",
        k.source
    );
    assert!(
        k.source.contains("for (int off = 8; off < 32; off <<= 1)"),
        "{}",
        k.source
    );
    assert!(
        k.source.contains("if (lane < 8) red_float[warp * 8 + lane] = a0;"),
        "{}",
        k.source
    );
    assert!(k.source.contains("if (t == 0)"), "{}", k.source);
    // Rows not a multiple of 32: left to a warp per row.
    let k = gen(&c::row_softmax_channels(1, 64, 40, DType::F32));
    assert!(k.source.contains("a warp per row"), "{}", k.source);
}

#[test]
fn integer_reductions_wrap_and_start_at_type_bounds() {
    let dims = [8, 16];
    let mut p = c::P::new();
    let x = p.input("x", DType::I8, &dims);
    let o1 = p.temp(DType::I8, &[8]);
    let o2 = p.temp(DType::I8, &[8]);
    let mut b = c::B::new();
    let l = b.load(0, DType::I8);
    let s0 = b.stage(0, DType::I8);
    let s1 = b.stage(1, DType::I8);
    let prog = p.kernel(
        "r",
        KernelKind::Row(RowKernel {
            outer: vec![8],
            inner: vec![16],
            inputs: vec![c::contig(x, &dims)],
            body: b.b,
            stages: vec![
                graphc_compiler::kernel::Stage {
                    op: ReduceOp::Max,
                    value: l,
                },
                graphc_compiler::kernel::Stage {
                    op: ReduceOp::Mean,
                    value: l,
                },
            ],
            row_stores: vec![c::store(s0, o1, &[8]), c::store(s1, o2, &[8])],
            stores: vec![],
        }),
    );
    let s = gen(&prog).source;
    assert!(s.contains("long long a0 = (-128LL);"), "{s}");
    assert!(s.contains("(unsigned long long)a1 +"), "{s}");
    assert!(s.contains("(a1 / 16LL)"), "{s}");
}

#[test]
fn matmul_bias_relu_is_native() {
    let k = gen(&c::matmul_bias_relu());
    assert!(!k.has_source(), "{}", k.source);
    let g = k.gemm.unwrap();
    assert_eq!(g.epilogue, GemmEpilogue::BiasRelu);
    assert_eq!((g.m, g.n, g.k, g.batch), (128, 256, 64, 1));
    assert_eq!(g.bias.as_ref().map(|b| b.buffer), Some(BufferId(2)));
    assert_eq!(g.d, GemmOutput::Buffer(BufferId(3)));
    assert!(!g.a.trans && !g.b.trans);
    assert_eq!((g.a.ld, g.b.ld), (64, 256));
    assert_eq!(g.d_dtype, DType::F16);
    assert_eq!(g.scratch_bytes, 0);
    assert!(g.beta_c.is_none());
    assert_eq!(g.beta, 0.0);
}

#[test]
fn matmul_erf_gelu_needs_an_epilogue_kernel() {
    let k = gen(&c::matmul_bias_gelu_erf());
    let g = k.gemm.clone().unwrap();
    assert_eq!(g.epilogue, GemmEpilogue::Bias);
    // The product goes into the output, which the epilogue overwrites: no scratch.
    assert_eq!(g.d, GemmOutput::Buffer(BufferId(3)));
    assert_eq!(g.scratch_bytes, 0);
    assert!(k.has_source());
    assert!(k.source.contains("g_gelu_f32"), "{}", k.source);
    assert!(!k.source.contains("g_gelu_tanh"), "{}", k.source);
    // Reads the output, then writes it.
    assert_eq!(k.params.len(), 2);
    assert_eq!(k.params[0].target, ParamTarget::Buffer(BufferId(3)));
    assert_eq!(k.params[0].access, ParamAccess::Read);
    assert_eq!(k.params[1].target, ParamTarget::Buffer(BufferId(3)));
    assert_eq!(k.params[1].access, ParamAccess::Write);
    assert!(k.source.contains("g_vec16"), "the epilogue is vectorized: {}", k.source);
}

#[test]
fn matmul_tanh_gelu_is_native() {
    let k = gen(&c::matmul_gelu_tanh());
    assert!(!k.has_source());
    assert_eq!(k.gemm.unwrap().epilogue, GemmEpilogue::Gelu);
}

/// The tanh GELU's backward after a 16-bit GEMM is cuBLASLt's DGELU with the
/// pre-activation as its aux matrix; in f32, or with an aux cuBLASLt does not take (a
/// row stride not D's, or not a multiple of 8), a generated epilogue.
#[test]
fn matmul_gelu_tanh_grad_is_dgelu_with_the_pre_activation_as_aux() {
    for dt in [DType::BF16, DType::F16] {
        let k = gen(&c::matmul_dgelu(dt, 128, 128));
        assert!(!k.has_source(), "{dt}: {}", k.source);
        let g = k.gemm.unwrap();
        assert_eq!(g.epilogue, GemmEpilogue::DGelu, "{dt}");
        let aux = g.aux.expect("an aux matrix");
        assert_eq!(aux.buffer, BufferId(2));
        assert_eq!((aux.ld, aux.trans, aux.offset), (128, false, 0));
        assert!(g.bias.is_none() && g.beta_c.is_none());
    }
    for (dt, n, ld) in [(DType::F32, 128, 128), (DType::BF16, 128, 136), (DType::BF16, 36, 36)] {
        let k = gen(&c::matmul_dgelu(dt, n, ld));
        let g = k.gemm.clone().unwrap();
        assert_eq!(g.epilogue, GemmEpilogue::None, "{dt} n {n} ld {ld}");
        assert!(g.aux.is_none());
        assert!(k.source.contains("g_gelu_tanh_grad_f32"), "{dt}: {}", k.source);
    }
}

#[test]
fn matmul_residual_uses_beta_c() {
    let k = gen(&c::matmul_residual());
    assert!(!k.has_source());
    let g = k.gemm.unwrap();
    assert_eq!(g.epilogue, GemmEpilogue::None);
    let cop = g.beta_c.unwrap();
    assert_eq!(cop.buffer, BufferId(2));
    assert_eq!(cop.ld, 256);
    assert_eq!(g.beta, 1.0);
    assert_eq!(g.alpha, 1.0);
}

#[test]
fn matmul_transposed_operand() {
    let k = gen(&c::matmul_transb());
    let g = k.gemm.unwrap();
    assert!(!g.a.trans);
    assert!(g.b.trans);
    assert_eq!(g.b.ld, 64);
    assert!(!k.source.contains("g_vec"), "plain product: no epilogue kernel");
}

#[test]
fn matmul_batched_with_broadcast_operand() {
    let k = gen(&c::matmul_batched_scaled());
    let g = k.gemm.clone().unwrap();
    assert_eq!(g.batch, 4);
    assert_eq!(g.a.batch_stride, 16 * 8);
    assert_eq!(g.b.batch_stride, 0);
    // The scale by 2 is cuBLASLt's alpha; the product goes straight to the output.
    assert_eq!(g.alpha, 2.0);
    assert!(matches!(g.d, GemmOutput::Buffer(_)), "{g:?}");
    assert!(!k.has_source(), "{}", k.source);
}

#[test]
fn matmul_operand_that_needs_materializing() {
    // b read with a broadcast row: strides [0, 1] over [k, n].
    let p = c::matmul(DType::F32, (8, 8, 8), None, Some(vec![0, 1]), |_, _, a, _| a);
    let e = generate(&p, 0).unwrap_err();
    assert!(matches!(e, CodegenError::OperandLayout { .. }), "{e}");
    assert!(e.to_string().contains("must be materialized"), "{e}");
    // Batch dims that do not collapse to one stride.
    let mut p = c::matmul_batched_scaled();
    if let KernelKind::MatMul(MatMulKernel { batch, a, .. }) = &mut p.kernels[0].kind {
        *batch = vec![2, 2];
        a.strides = vec![1000, 128, 8, 1];
    }
    let e = generate(&p, 0).unwrap_err();
    assert!(e.to_string().contains("batch"), "{e}");
}

#[test]
fn op_kernels() {
    let s = gen(&c::op_concat()).source;
    assert!(
        s.contains("if (o1 < 3)") && s.contains("else if (o1 < 4)") && s.contains("else"),
        "{s}"
    );
    let s = gen(&c::op_pad(graphc_ir::PadMode::Constant)).source;
    assert!(s.contains("(-1.5f)"), "{s}");
    let s = gen(&c::op_pad(graphc_ir::PadMode::Reflect)).source;
    assert!(s.contains("c0 = -c0"), "{s}");
    let s = gen(&c::op_pad(graphc_ir::PadMode::Edge)).source;
    assert!(s.contains("c1 = c1 < 0 ? 0 : (c1 > 7 ? 7 : c1);"), "{s}");
    let s = gen(&c::op_gather(1)).source;
    assert!(s.contains("if (g < 0) g += 16LL;"), "{s}");
    assert!(s.contains("(g >= 0 && g < 16LL)"), "{s}");
    let s = gen(&c::op_argmax()).source;
    assert!(s.contains("if (x > bv)") && s.contains("if (x != x)"), "{s}");
    let s = gen(&c::op_argmin_int()).source;
    assert!(s.contains("if (x < bv)") && !s.contains("x != x"), "{s}");
    let k = gen(&c::op_int_matmul());
    assert!(k.source.contains("__shared__ long long as_[16][17];"), "{}", k.source);
    assert!(k.entry.starts_with("g_matmul_tiled_"));
    assert_eq!(k.launch.block, 256);
}

#[test]
fn reflect_pad_too_wide_is_an_error() {
    let p = c::op_program(
        Op::Pad {
            pads: vec![(3, 0)],
            mode: graphc_ir::PadMode::Reflect,
            value: 0.0,
        },
        &[(DType::F32, vec![3])],
        (DType::F32, vec![6]),
    );
    assert!(generate(&p, 0).unwrap_err().to_string().contains("reflect"));
}

#[test]
fn unsupported_op_kernel_names_the_op() {
    let p = c::op_program(
        Op::Reduce {
            op: ReduceOp::Sum,
            axes: vec![0],
            keepdims: false,
        },
        &[(DType::F32, vec![3])],
        (DType::F32, vec![]),
    );
    let e = generate(&p, 0).unwrap_err();
    assert_eq!(
        e,
        CodegenError::UnsupportedOp {
            kernel: "k0_reduce_sum".to_string(),
            op: "reduce_sum".to_string()
        }
    );
}

#[test]
fn malformed_programs_are_errors_not_panics() {
    // A body that uses an expression before it is defined.
    let mut p = c::ew_contiguous_f32();
    if let KernelKind::Elementwise(ElementwiseKernel { body, .. }) = &mut p.kernels[0].kind {
        body.exprs[3].0 = graphc_compiler::kernel::Expr::Binary(BinaryOp::Mul, ExprId(4), ExprId(1));
    }
    assert!(generate(&p, 0).is_err());
    // A load past the inputs.
    let mut p = c::ew_contiguous_f32();
    if let KernelKind::Elementwise(ElementwiseKernel { body, .. }) = &mut p.kernels[0].kind {
        body.exprs[0].0 = graphc_compiler::kernel::Expr::Load(graphc_compiler::kernel::InputId(9));
    }
    assert!(generate(&p, 0).is_err());
    assert_eq!(generate(&p, 3).unwrap_err(), CodegenError::NoSuchKernel(3, 1));
    // Row store of a per-element value.
    let mut p = c::row_axis0();
    if let KernelKind::Row(RowKernel { row_stores, .. }) = &mut p.kernels[0].kind {
        row_stores[0].value = ExprId(0);
    }
    assert!(generate(&p, 0)
        .unwrap_err()
        .to_string()
        .contains("varies along the inner dims"));
}

#[test]
fn identical_kernels_share_an_entry() {
    let mut p = c::row_layernorm();
    let k = p.kernels[0].clone();
    p.kernels.push(k);
    let ks = generate_all(&p).unwrap();
    assert_eq!(ks[0].source, ks[1].source);
    assert_eq!(ks[0].entry, ks[1].entry);
    assert_eq!(ks[1].name, "k1_row");
}

#[test]
fn scalar_and_empty_spaces() {
    let k = gen(&c::ew_tiny(&[]));
    assert!(k.source.contains("i < 1;"), "{}", k.source);
    assert_eq!(k.launch.grid.blocks(132), 1);
    let k = gen(&c::ew_tiny(&[0, 5]));
    assert_eq!(k.launch.grid.blocks(132), 0, "no work: no launch");
}

#[test]
fn large_spaces_index_in_64_bits() {
    let dims = [1usize << 16, 1 << 16];
    let mut p = c::P::new();
    let x = p.input("x", DType::U8, &dims);
    let out = p.temp(DType::U8, &dims);
    let mut b = c::B::new();
    let l = b.load(0, DType::U8);
    let one = b.c(DType::U8, 1.0);
    let a = b.bin(BinaryOp::Add, l, one);
    let prog = p.kernel(
        "inc",
        KernelKind::Elementwise(ElementwiseKernel {
            space: dims.to_vec(),
            inputs: vec![c::contig(x, &dims)],
            body: b.b,
            stores: vec![c::store(a, out, &dims)],
        }),
    );
    let s = gen(&prog).source;
    assert!(s.contains("const long long tid"), "{s}");
    assert!(s.contains("268435456LL"), "{s}");
}

#[test]
fn snapshot_elementwise_fast() {
    insta::assert_snapshot!(gen(&c::ew_contiguous_f32()).source);
}

/// A multi-tensor kernel: each part its own block range running its own loops (the
/// vector path with a tail, the general path), one grid for all.
#[test]
fn multi_tensor_parts_get_block_ranges_of_one_grid() {
    let k = gen(&c::multi_tensor());
    let src = &k.source;
    // Part 0: 64*256/4 vector steps, 16 blocks of 256; part 1: one vector step and a
    // tail; part 2: 240 elements on the general path.
    assert!(src.contains("if (blockIdx.x < 16u) {  // part 0: [64, 256]"), "{src}");
    assert!(src.contains("} else if (blockIdx.x < 17u) {  // part 1: [7]"), "{src}");
    assert!(
        src.contains("} else if (blockIdx.x < 18u) {  // part 2: [10, 24]"),
        "{src}"
    );
    assert!(src.contains("(blockIdx.x - 17u) * blockDim.x"), "{src}");
    assert!(src.contains("// general: collapsed space"), "{src}");
    assert_eq!(k.launch.grid, GridSize::Fixed { blocks: 18 });
    assert_eq!(k.params.len(), 8, "the scalar once: {:?}", k.params);
    insta::assert_snapshot!(src);
}

#[test]
fn snapshot_elementwise_general() {
    insta::assert_snapshot!(gen(&c::ew_general()).source);
}

#[test]
fn snapshot_softmax() {
    insta::assert_snapshot!(gen(&c::row_softmax(256, 200, DType::F32)).source);
}

#[test]
fn snapshot_layernorm() {
    insta::assert_snapshot!(gen(&c::row_layernorm()).source);
}

#[test]
fn snapshot_softmax_vector() {
    insta::assert_snapshot!(gen(&c::row_softmax(64, 1024, DType::F32)).source);
}

#[test]
fn snapshot_layernorm_gelu_bf16_vector() {
    insta::assert_snapshot!(gen(&c::row_layernorm_gelu(8192, 4096, DType::BF16)).source);
}

#[test]
fn snapshot_softmax_channels() {
    insta::assert_snapshot!(gen(&c::row_softmax_channels(8, 64, 1024, DType::F32)).source);
}

#[test]
fn snapshot_matmul_epilogue() {
    let k = gen(&c::matmul_bias_gelu_erf());
    insta::assert_snapshot!(format!(
        "{}\n// gemm: {}",
        k.source,
        serde_json::to_string(&k.gemm).unwrap()
    ));
}
