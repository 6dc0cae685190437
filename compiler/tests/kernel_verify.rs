//! The kernel IR verifier: every error variant from a hand-broken program, and every
//! fixture verifies.

mod codegen_common;

use codegen_common as c;
use graphc_compiler::kernel::{
    verify, verify_kernel, BufferId, ElementwiseKernel, Expr, ExprId, InputId, KernelKind, KernelVerifyError as E,
    MatMulKernel, OpKernel, Program, RowKernel, Stage, StageId,
};
use graphc_ir::{BinaryOp, DType, ReduceOp, Tensor, UnaryOp};

fn err(p: &Program) -> E {
    let e = verify(p).unwrap_err();
    assert!(e.to_string().starts_with("kernel 0 ("), "{e}");
    assert_eq!(e.kernel_index(), 0);
    e
}

/// `relu(x * y + bias)`: e0..e2 loads, e3 mul, e4 add, e5 relu stored to b3.
fn ew(f: impl FnOnce(&mut Program)) -> E {
    let mut p = c::ew_contiguous_f32();
    verify(&p).unwrap();
    f(&mut p);
    err(&p)
}

fn ew_k(p: &mut Program) -> &mut ElementwiseKernel {
    match &mut p.kernels[0].kind {
        KernelKind::Elementwise(e) => e,
        _ => unreachable!(),
    }
}

fn row_k(p: &mut Program) -> &mut RowKernel {
    match &mut p.kernels[0].kind {
        KernelKind::Row(r) => r,
        _ => unreachable!(),
    }
}

/// Layer norm: e3 = stage 0, e6 = stage 1; row stores e3 -> b4 and e9 -> b5.
fn layernorm(f: impl FnOnce(&mut RowKernel)) -> E {
    let mut p = c::row_layernorm();
    verify(&p).unwrap();
    f(row_k(&mut p));
    err(&p)
}

fn mm(f: impl FnOnce(&mut Program)) -> E {
    let mut p = c::matmul_bias_relu();
    verify(&p).unwrap();
    f(&mut p);
    err(&p)
}

/// Concat of f16 `[4,3,5]`, `[4,1,5]`, `[4,6,5]` (b0..b2) into b3 `[4,10,5]`.
fn concat(f: impl FnOnce(&mut Program)) -> E {
    let mut p = c::op_concat();
    verify(&p).unwrap();
    f(&mut p);
    err(&p)
}

fn op_k(p: &mut Program) -> &mut OpKernel {
    match &mut p.kernels[0].kind {
        KernelKind::Op(o) => o,
        _ => unreachable!(),
    }
}

#[test]
fn every_fixture_verifies() {
    for (name, p) in c::all() {
        verify(&p).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn no_such_kernel() {
    let p = c::ew_contiguous_f32();
    let e = verify_kernel(&p, 5).unwrap_err();
    assert_eq!(e, E::NoSuchKernel { index: 5, count: 1 });
    assert_eq!(e.to_string(), "kernel index 5 out of range (the program has 1 kernels)");
}

#[test]
fn missing_buffer() {
    let e = ew(|p| ew_k(p).inputs[0].buffer = BufferId(42));
    assert!(
        matches!(
            e,
            E::MissingBuffer {
                buffer: 42,
                count: 4,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "kernel 0 (fused_relu): input 0: buffer b42 does not exist (4 buffers)"
    );
}

#[test]
fn access_rank() {
    let e = ew(|p| ew_k(p).inputs[1].strides = vec![1]);
    assert!(
        matches!(
            e,
            E::AccessRank {
                strides: 1,
                rank: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e
        .to_string()
        .contains("input 1: access of b1 has 1 strides for a space of rank 2"));
}

#[test]
fn space_too_large() {
    let e = ew(|p| ew_k(p).space = vec![usize::MAX, 2]);
    assert!(matches!(e, E::SpaceTooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("too many elements"));
}

#[test]
fn out_of_bounds() {
    let e = ew(|p| ew_k(p).inputs[0].offset = 1);
    assert!(
        matches!(
            e,
            E::OutOfBounds {
                lo: 1,
                hi: 16384,
                len: 16384,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e
        .to_string()
        .contains("input 0: access of b0 reaches elements 1..=16384, out of bounds of its 16384 elements"));
}

#[test]
fn store_not_temp() {
    let e = ew(|p| ew_k(p).stores[0].access.buffer = BufferId(0));
    assert!(matches!(e, E::StoreNotTemp { .. }), "{e:?}");
    assert!(e
        .to_string()
        .contains("store 0: writes buffer b0 (input \"x\"), which is not a temp"));
}

#[test]
fn missing_value() {
    let e = ew(|p| ew_k(p).stores[0].value = ExprId(9));
    assert!(
        matches!(
            e,
            E::MissingValue {
                value: ExprId(9),
                count: 6,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e
        .to_string()
        .contains("store 0: value e9 does not exist (6 expressions)"));
}

#[test]
fn store_dtype() {
    let e = ew(|p| p.buffers[3].ty.dtype = DType::F16);
    assert!(matches!(e, E::StoreDtype { dtype: DType::F32, .. }), "{e:?}");
    assert!(e
        .to_string()
        .contains("store 0: stores e5 of f32 into b3 (temp), which is f16[64,256]"));
}

#[test]
fn stored_twice() {
    let e = ew(|p| {
        let s = ew_k(p).stores[0].clone();
        ew_k(p).stores.push(s);
    });
    assert!(matches!(e, E::StoredTwice { .. }), "{e:?}");
    assert!(e.to_string().contains("store 1: buffer b3 (temp) is stored twice"));
}

#[test]
fn store_size() {
    let e = ew(|p| p.buffers[3].ty = graphc_ir::TensorType::new(DType::F32, vec![64, 255]));
    assert!(
        matches!(
            e,
            E::StoreSize {
                elements: 16384,
                buffer_elements: 16320,
                ..
            }
        ),
        "{e:?}"
    );
}

#[test]
fn store_coverage() {
    let e = ew(|p| ew_k(p).stores[0].access.strides = vec![256, 0]);
    assert!(matches!(e, E::StoreCoverage { .. }), "{e:?}");
    assert!(e.to_string().contains("does not write every element exactly once"));
    // A reversed store is a permutation: fine.
    let mut p = c::ew_contiguous_f32();
    ew_k(&mut p).stores[0].access.offset = 64 * 256 - 1;
    ew_k(&mut p).stores[0].access.strides = vec![-256, -1];
    verify(&p).unwrap();
}

#[test]
fn operand_order() {
    let e = ew(|p| ew_k(p).body.exprs[3].0 = Expr::Binary(BinaryOp::Mul, ExprId(4), ExprId(1)));
    assert!(matches!(e, E::OperandOrder { operand: ExprId(4), .. }), "{e:?}");
    assert!(e.to_string().contains("e3 (mul): operand e4 does not precede it"));
}

#[test]
fn missing_input() {
    let e = ew(|p| ew_k(p).body.exprs[0].0 = Expr::Load(InputId(9)));
    assert!(matches!(e, E::MissingInput { inputs: 3, .. }), "{e:?}");
    assert!(e.to_string().contains("e0 (load 9): the kernel has 3 inputs"));
}

#[test]
fn missing_stage() {
    let e = layernorm(|k| k.body.exprs[3].0 = Expr::Stage(StageId(7)));
    assert!(matches!(e, E::MissingStage { stages: 2, .. }), "{e:?}");
    assert!(e.to_string().contains("e3 (stage 7): the kernel has 2 stages"));
}

#[test]
fn not_allowed() {
    let e = ew(|p| ew_k(p).body.exprs[0].0 = Expr::Stage(StageId(0)));
    assert!(matches!(e, E::NotAllowed { kind: "row", .. }), "{e:?}");
    assert!(e.to_string().contains("stages are only allowed in row kernels"));
    let e = ew(|p| ew_k(p).body.exprs[0].0 = Expr::Acc);
    assert!(e.to_string().contains("only allowed in matmul kernels"), "{e}");
}

#[test]
fn not_scalar() {
    let t = Tensor::from_f32([2usize], vec![1.0, 2.0]).unwrap();
    let e = ew(|p| ew_k(p).body.exprs[0].0 = Expr::Const(t));
    assert!(matches!(e, E::NotScalar { .. }), "{e:?}");
    assert!(e.to_string().contains("e0 (const): constant is f32[2], not a scalar"));
}

#[test]
fn gather_index() {
    let g = Expr::Gather {
        input: InputId(2),
        index: ExprId(0),
        stride: 1,
        extent: 4,
    };
    let e = ew(|p| ew_k(p).body.exprs[2].0 = g);
    assert!(
        matches!(
            e,
            E::GatherIndex {
                index: ExprId(0),
                dtype: DType::F32,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("e2 (gather 2): index e0 is f32"));
}

#[test]
fn stage_value_order() {
    let e = layernorm(|k| k.stages[0].value = ExprId(5));
    assert!(matches!(e, E::StageValueOrder { value: ExprId(5), .. }), "{e:?}");
    assert!(e
        .to_string()
        .contains("e3 (stage 0): the stage's value e5 does not precede it"));
}

#[test]
fn expr_type() {
    let e = ew(|p| ew_k(p).body.exprs[0] = (Expr::Index(5), DType::I64));
    assert!(matches!(e, E::ExprType { .. }), "{e:?}");
    assert!(e.to_string().contains("e0 (index 5): "), "{e}");
}

#[test]
fn declared_type() {
    let e = ew(|p| ew_k(p).body.exprs[5].1 = DType::F16);
    assert!(
        matches!(
            e,
            E::DeclaredType {
                declared: DType::F16,
                computed: DType::F32,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("e5 (relu): declared f16 but computes f32"));
}

#[test]
fn missing_stage_value() {
    let e = layernorm(|k| {
        k.stages.push(Stage {
            op: ReduceOp::Sum,
            value: ExprId(99),
        })
    });
    assert!(
        matches!(
            e,
            E::MissingStageValue {
                stage: 2,
                value: ExprId(99),
                count: 13,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e
        .to_string()
        .contains("stage 2: value e99 does not exist (13 expressions)"));
}

#[test]
fn stage_order() {
    // Stage 0 reduces a value that uses stage 1.
    let mut p = c::row_softmax(4, 8, DType::F32);
    let k = row_k(&mut p);
    k.body.exprs = vec![
        (Expr::Load(InputId(0)), DType::F32),
        (Expr::Stage(StageId(1)), DType::F32),
        (Expr::Binary(BinaryOp::Add, ExprId(0), ExprId(1)), DType::F32),
        (Expr::Stage(StageId(0)), DType::F32),
    ];
    k.stages = vec![
        Stage {
            op: ReduceOp::Max,
            value: ExprId(2),
        },
        Stage {
            op: ReduceOp::Sum,
            value: ExprId(0),
        },
    ];
    k.stores[0].value = ExprId(3);
    let e = err(&p);
    assert!(matches!(e, E::StageOrder { stage: 0, uses: 1, .. }), "{e:?}");
    assert!(e
        .to_string()
        .contains("stage 0: its value e2 uses stage 1, not an earlier one"));
}

#[test]
fn stage_type() {
    let e = layernorm(|k| {
        let b = k.body.push(Expr::Unary(UnaryOp::IsNan, ExprId(0)), DType::Bool);
        k.stages.push(Stage {
            op: ReduceOp::Sum,
            value: b,
        });
    });
    assert!(matches!(e, E::StageType { stage: 2, .. }), "{e:?}");
    assert!(e.to_string().contains("bool"), "{e}");
}

#[test]
fn row_store_varies() {
    let e = layernorm(|k| k.row_stores[0].value = ExprId(0));
    assert!(
        matches!(
            e,
            E::RowStoreVaries {
                store: 0,
                value: ExprId(0),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e
        .to_string()
        .contains("row store 0: value e0 varies along the inner dims"));
}

#[test]
fn matmul_shape() {
    let e = mm(|p| p.buffers[1].ty.dtype = DType::I64);
    assert!(matches!(e, E::MatMulShape { .. }), "{e:?}");
    assert!(e.to_string().contains(": matmul: "), "{e}");
    // k past the operand: out of bounds of operand a.
    let e = mm(|p| {
        if let KernelKind::MatMul(MatMulKernel { k, .. }) = &mut p.kernels[0].kind {
            *k += 1;
        }
    });
    assert!(e.to_string().contains("operand a"), "{e}");
}

#[test]
fn op_operand_type() {
    let e = concat(|p| op_k(p).inputs[0].1.dtype = DType::F32);
    assert!(matches!(e, E::OpOperandType { input: 0, .. }), "{e:?}");
    assert!(e
        .to_string()
        .contains("input 0: declared f32[4,3,5] but buffer b0 (input \"in0\") is f16[4,3,5]"));
}

#[test]
fn op_type() {
    let e = concat(|p| op_k(p).inputs[1].1 = graphc_ir::TensorType::new(DType::F16, vec![3, 1, 5]));
    assert!(matches!(e, E::OpType { .. }), "{e:?}");
    assert!(e.to_string().contains(": concat: "), "{e}");
}

#[test]
fn op_output() {
    let e = concat(|p| p.buffers[3].ty = graphc_ir::TensorType::new(DType::F16, vec![4, 9, 5]));
    assert!(matches!(e, E::OpOutput { .. }), "{e:?}");
    assert!(e
        .to_string()
        .contains("concat gives f16[4,10,5] but its output b3 (temp) is f16[4,9,5]"));
}

/// The concat kernel with a sibling concat of its operands `inputs` into a new temp
/// of type `ty`.
fn with_sibling(p: &mut Program, inputs: Vec<usize>, ty: graphc_ir::TensorType) -> BufferId {
    p.buffers.push(graphc_compiler::kernel::Buffer {
        ty,
        kind: graphc_compiler::kernel::BufferKind::Temp,
        name: None,
    });
    let output = BufferId((p.buffers.len() - 1) as u32);
    op_k(p).siblings.push(graphc_compiler::kernel::Sibling {
        op: graphc_ir::Op::Concat { axis: 1 },
        inputs,
        output,
    });
    output
}

#[test]
fn op_siblings() {
    // Concat of in0 and in2 beside the kernel's own: fine, and it writes both.
    let mut p = c::op_concat();
    let out = with_sibling(
        &mut p,
        vec![0, 2],
        graphc_ir::TensorType::new(DType::F16, vec![4, 9, 5]),
    );
    verify(&p).unwrap();
    assert_eq!(p.kernels[0].writes(), vec![BufferId(3), out]);
    assert!(graphc_compiler::kernel::print_program(&p).contains("also op {\"concat\":{\"axis\":1}} of in0 in2 -> b4"));
    // An operand past the kernel's.
    let e = concat(|p| {
        with_sibling(p, vec![0, 3], graphc_ir::TensorType::new(DType::F16, vec![4, 9, 5]));
    });
    assert!(matches!(e, E::OpType { .. }), "{e:?}");
    assert!(
        e.to_string().contains("sibling 0 (concat) reads operands [0, 3] of 3"),
        "{e}"
    );
    // Its type wrong, or the kernel's own output again.
    let e = concat(|p| {
        with_sibling(p, vec![0, 2], graphc_ir::TensorType::new(DType::F16, vec![4, 8, 5]));
    });
    assert!(matches!(e, E::OpOutput { .. }), "{e:?}");
    let e = concat(|p| {
        with_sibling(p, vec![0, 1, 2], graphc_ir::TensorType::new(DType::F16, vec![4, 10, 5]));
        op_k(p).siblings[0].output = BufferId(3);
    });
    assert!(matches!(e, E::StoredTwice { .. }), "{e:?}");
}
