//! Row kernels' thread mappings and stages written from hand-built programs: rows of
//! few chunks sharing a warp, a one-hot sum read as its one element, a value every pass
//! reads kept in registers.

mod codegen_common;

use codegen_common as c;
use graphc_compiler::codegen::{generate, CudaKernel};
use graphc_compiler::kernel::{KernelKind, RowKernel};
use graphc_ir::{BinaryOp, DType, ReduceOp, UnaryOp};

fn gen(p: &graphc_compiler::kernel::Program) -> CudaKernel {
    generate(p, 0).unwrap_or_else(|e| panic!("codegen failed: {e}"))
}

#[test]
fn short_rows_share_a_warp() {
    // 16 f32 a row: 4 chunks of 4, so 4 lanes a row and 8 rows a warp, reduced over
    // those 4 lanes; a block takes 64 rows.
    let k = gen(&c::row_softmax(64, 16, DType::F32));
    let s = &k.source;
    assert!(s.contains("4 lanes per row"), "{s}");
    assert!(s.contains("const int t = lane % 4;"), "{s}");
    assert!(s.contains("row = (int)blockIdx.x * 64 + warp * 8 + lane / 4"), "{s}");
    assert!(s.contains("for (int off = 2; off > 0; off >>= 1)"), "{s}");
    assert_eq!(k.launch.grid.blocks(132), 1);
    // Rows that would not fill whole warps keep a warp each (the lanes of a warp leave
    // the loop over rows together).
    let k = gen(&c::row_softmax(60, 16, DType::F32));
    assert!(k.source.contains("a warp per row"), "{}", k.source);
}

#[test]
fn a_one_hot_sum_reads_one_element() {
    // sum_j select(j == label, -x_j, 0) over rows of 1000: the label's element only,
    // when it is in the row (an ignored label, -100, sums to 0).
    let (rows, n) = (8, 1000);
    let mut p = c::P::new();
    let x = p.input("x", DType::F32, &[rows, n]);
    let label = p.input("label", DType::I64, &[rows]);
    let out = p.temp(DType::F32, &[rows]);
    let mut b = c::B::new();
    let xj = b.load(0, DType::F32);
    let l = b.load(1, DType::I64);
    let j = b.index(1, DType::I64);
    let hit = b.bin(BinaryOp::Eq, j, l);
    let neg = b.un(UnaryOp::Neg, xj);
    let zero = b.c(DType::F32, 0.0);
    let picked = b.select(hit, neg, zero);
    let total = b.stage(0, DType::F32);
    let prog = p.kernel(
        "pick",
        KernelKind::Row(RowKernel {
            outer: vec![rows],
            inner: vec![n],
            inputs: vec![c::contig(x, &[rows, n]), c::acc(label, 0, &[1, 0])],
            body: b.b,
            stages: vec![graphc_compiler::kernel::Stage {
                op: ReduceOp::Sum,
                value: picked,
            }],
            row_stores: vec![c::store(total, out, &[rows])],
            stores: vec![],
        }),
    );
    let s = gen(&prog).source;
    assert!(s.contains("one element (j == r1)"), "{s}");
    assert!(s.contains("if (r1 >= 0 && r1 < 1000)"), "{s}");
    assert!(!s.contains("for (int j = t;"), "a pass over the row: {s}");
    assert!(!s.contains("__shfl_xor_sync"), "a reduction across threads: {s}");
    // The row's threads all read before any stores (which may be in place).
    assert!(s.contains("a block per row"), "{s}");
    assert!(s.contains("__syncthreads();"), "{s}");
}

#[test]
fn a_value_every_pass_reads_is_kept_instead_of_its_inputs() {
    // s = x + h over rows of 256: summed by stage 0, squared about the mean by stage 1,
    // stored. `s` is computed once where the cache is loaded and kept in registers;
    // `x` and `h` are not kept.
    let (rows, n) = (16, 256);
    let mut p = c::P::new();
    let x = p.input("x", DType::F32, &[rows, n]);
    let h = p.input("h", DType::F32, &[rows, n]);
    let out = p.temp(DType::F32, &[rows, n]);
    let mut b = c::B::new();
    let lx = b.load(0, DType::F32);
    let lh = b.load(1, DType::F32);
    let s = b.bin(BinaryOp::Add, lx, lh);
    let m = b.stage(0, DType::F32);
    let d = b.bin(BinaryOp::Sub, s, m);
    let sq = b.bin(BinaryOp::Mul, d, d);
    let prog = p.kernel(
        "kept",
        KernelKind::Row(RowKernel {
            outer: vec![rows],
            inner: vec![n],
            inputs: vec![c::contig(x, &[rows, n]), c::contig(h, &[rows, n])],
            body: b.b,
            stages: vec![
                graphc_compiler::kernel::Stage {
                    op: ReduceOp::Mean,
                    value: s,
                },
                graphc_compiler::kernel::Stage {
                    op: ReduceOp::Sum,
                    value: sq,
                },
            ],
            row_stores: vec![],
            stores: vec![c::store(s, out, &[rows, n])],
        }),
    );
    let src = gen(&prog).source;
    assert!(src.contains(&format!("float x{}[", s.0)), "{src}");
    assert!(!src.contains("float c0["), "{src}");
    assert_eq!(src.matches("(e0 + e1)").count(), 1, "{src}");
}
