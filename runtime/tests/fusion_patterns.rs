//! The fusion patterns the kernel IR exists for: softmax, log-softmax, layer norm and
//! RMS norm each become ONE row kernel (written with the builder, written the way ONNX
//! exports spell them, and inside the exported fixtures), an elementwise tree with
//! broadcasts and casts becomes one kernel with a store per value read outside it, and
//! a linear layer carries bias, activation and residual add as its epilogue. Each is
//! also run by the kernel executor (through its memory plan's arena) against the
//! interpreter.

mod planned;

use std::collections::HashMap;

use graphc_compiler::fuse::fuse;
use graphc_compiler::kernel::{print_program, ElementwiseKernel, KernelKind, MatMulKernel, Program};
use graphc_ir::nn::{self, GeluApprox};
use graphc_ir::{interpret, DType, Graph, GraphBuilder, Tensor, TensorType, UnaryOp};
use planned::run_arena;

fn run_both(g: &Graph) -> Program {
    let program = fuse(g).unwrap();
    let inputs: HashMap<String, Tensor> = g
        .inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let name = g.input_name(id).unwrap().to_string();
            (name, Tensor::randn(&g.node(id).ty, 1.0, 40 + i as u64))
        })
        .collect();
    let want = interpret(g, &inputs).unwrap();
    let got = run_arena(&program, g.weights(), &inputs).unwrap();
    for (n, a, b) in graphc_ir::compare::zip_outputs(&got, &want).unwrap() {
        for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
            assert!(x == &y || (x.is_nan() && y.is_nan()), "{n}: {x} vs {y}");
        }
    }
    program
}

fn kinds(p: &Program) -> Vec<&str> {
    p.kernels.iter().map(|k| k.kind_name()).collect()
}

fn one_row_kernel(build: impl for<'a> Fn(&'a GraphBuilder) -> graphc_ir::Value<'a>, what: &str) {
    let b = GraphBuilder::new();
    let y = build(&b);
    b.output("y", y);
    let g = b.finish().unwrap();
    let p = run_both(&g);
    assert_eq!(kinds(&p), ["row"], "{what}:\n{}", print_program(&p));
}

#[test]
fn softmax_is_one_kernel() {
    one_row_kernel(|b| nn::softmax(b.input("x", DType::F32, [4, 8, 32]), -1), "softmax");
    one_row_kernel(
        |b| nn::softmax(b.input("x", DType::F32, [4, 8, 32]), 1),
        "softmax axis 1",
    );
    one_row_kernel(|b| nn::softmax(b.input("x", DType::BF16, [6, 40]), -1), "bf16 softmax");
}

#[test]
fn log_softmax_is_one_kernel() {
    one_row_kernel(
        |b| nn::log_softmax(b.input("x", DType::F32, [4, 8, 32]), -1),
        "log-softmax",
    );
}

#[test]
fn layer_norm_and_rms_norm_are_one_kernel() {
    fn g(b: &GraphBuilder) -> graphc_ir::Value<'_> {
        b.param("g", Tensor::randn(&TensorType::new(DType::F32, [32]), 1.0, 1))
    }
    one_row_kernel(
        |b| {
            let beta = b.param("b", Tensor::randn(&TensorType::new(DType::F32, [32]), 1.0, 2));
            nn::layer_norm(b.input("x", DType::F32, [4, 8, 32]), Some(g(b)), Some(beta), 1e-5)
        },
        "layer norm",
    );
    one_row_kernel(
        |b| nn::rms_norm(b.input("x", DType::F32, [4, 8, 32]), Some(g(b)), 1e-6),
        "rms norm",
    );
}

/// The ONNX spellings (opset < 17 layer norm, Llama's RMS norm in f32 with a cast back):
/// `ReduceMean`/`Sub`/`Pow`/`Sqrt`/`Div`, and `Pow`/`ReduceMean`/`Add`/`Sqrt`/
/// `Reciprocal`/`Mul` with casts around it.
#[test]
fn onnx_spellings_of_the_norms_are_one_kernel() {
    one_row_kernel(
        |b| {
            let x = b.input("x", DType::F32, [4, 8, 32]);
            let c = x - x.mean(&[-1], true);
            let var = c.binary(graphc_ir::BinaryOp::Pow, 2.0).mean(&[-1], true);
            c / (var + 1e-5).unary(UnaryOp::Sqrt)
        },
        "layer norm (opset < 17)",
    );
    one_row_kernel(
        |b| {
            let x = b.input("x", DType::F16, [4, 8, 32]).cast(DType::F32);
            let ms = x.binary(graphc_ir::BinaryOp::Pow, 2.0).mean(&[-1], true);
            let r = (ms + 1e-6).unary(UnaryOp::Sqrt).unary(UnaryOp::Reciprocal);
            (x * r).cast(DType::F16)
        },
        "rms norm with casts",
    );
}

#[test]
fn elementwise_tree_with_broadcasts_and_casts_is_one_kernel_with_two_stores() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [16, 64]);
    let bias = b.input("bias", DType::F32, [64]);
    let h = (x + bias).unary(UnaryOp::Tanh); // read twice outside: a store
    let y = (nn::gelu(h, GeluApprox::Tanh) * x.unary(UnaryOp::Sigmoid)).cast(DType::F16);
    b.output("y", y);
    b.output("h", h);
    let g = b.finish().unwrap();
    let p = run_both(&g);
    assert_eq!(kinds(&p), ["elementwise"], "{}", print_program(&p));
    let KernelKind::Elementwise(ElementwiseKernel { stores, inputs, .. }) = &p.kernels[0].kind else {
        unreachable!()
    };
    assert_eq!(stores.len(), 2);
    assert_eq!(inputs.len(), 2, "x once, bias broadcast once");
}

#[test]
fn linear_layer_carries_its_epilogue() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 8, 32]);
    let w = b.param("w", Tensor::randn(&TensorType::new(DType::F32, [48, 32]), 0.2, 3));
    let bias = b.param("bias", Tensor::randn(&TensorType::new(DType::F32, [48]), 0.2, 4));
    let w2 = b.param("w2", Tensor::randn(&TensorType::new(DType::F32, [32, 48]), 0.2, 5));
    let h = nn::gelu(nn::linear(x, w, Some(bias)), GeluApprox::Erf);
    let y = nn::linear(h, w2, None) + x;
    b.output("y", y);
    let g = b.finish().unwrap();
    let p = run_both(&g);
    assert_eq!(kinds(&p), ["matmul", "matmul"], "{}", print_program(&p));
    for k in &p.kernels {
        let KernelKind::MatMul(MatMulKernel { batch, m, .. }) = &k.kind else {
            unreachable!()
        };
        assert!(batch.is_empty() && *m == 16, "batch folded into rows: {batch:?} x {m}");
    }
}

/// An embedding lookup (token and position embeddings added) is read through its
/// indices by the kernel that consumes it: no gathered copy is written.
#[test]
fn embedding_gathers_fold_into_their_consumer() {
    let b = GraphBuilder::new();
    let ids = b.input("ids", DType::I64, [2, 8]);
    let wte = b.param("wte", Tensor::randn(&TensorType::new(DType::F32, [50, 16]), 1.0, 6));
    let wpe = b.param("wpe", Tensor::randn(&TensorType::new(DType::F32, [8, 16]), 1.0, 7));
    let h = wte.gather(ids, 0) + wpe;
    b.output("h", h.unary(UnaryOp::Tanh));
    let g = b.finish().unwrap();
    let program = fuse(&g).unwrap();
    assert_eq!(kinds(&program), ["elementwise"], "{}", print_program(&program));
    // Indices in range (randn would not be): every token id, some negative.
    let ids: Vec<f64> = (0..16).map(|i| ((i * 7) % 100) as f64 - 50.0).collect();
    let inputs: HashMap<String, Tensor> =
        [("ids".to_string(), Tensor::from_f64(DType::I64, [2, 8], &ids).unwrap())].into();
    let want = interpret(&g, &inputs).unwrap();
    let got = run_arena(&program, g.weights(), &inputs).unwrap();
    assert_eq!(got[0].1, want[0].1);
    // Out of range: an error naming the index, as the interpreter gives.
    let bad: HashMap<String, Tensor> = [(
        "ids".to_string(),
        Tensor::from_f64(DType::I64, [2, 8], &[50.0; 16]).unwrap(),
    )]
    .into();
    let e = run_arena(&program, g.weights(), &bad).unwrap_err().to_string();
    assert!(e.contains("gather index 50 out of range"), "{e}");
}

/// Exported linear layers multiply `[b*s, k] x [k, n]` and reshape the product to
/// `[b, s, n]` before their activation and residual add: the epilogue is re-indexed
/// over the product's shape and still joins the GEMM.
#[test]
fn epilogue_through_a_reshape_of_the_product_joins_the_matmul() {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [2, 8, 32]);
    let w = b.param("w", Tensor::randn(&TensorType::new(DType::F32, [32, 48]), 0.2, 8));
    let bias = b.param("bias", Tensor::randn(&TensorType::new(DType::F32, [48]), 0.2, 9));
    let res = b.input("res", DType::F32, [2, 8, 48]);
    let h = (x.reshape([16, 32]).matmul(w) + bias).reshape([2, 8, 48]);
    let y = nn::gelu(h, GeluApprox::Tanh) * 0.5 + res;
    b.output("y", y);
    let g = b.finish().unwrap();
    let p = run_both(&g);
    assert_eq!(kinds(&p), ["matmul"], "{}", print_program(&p));
}

/// A linear layer's weight and bias gradients, `xᵀ dy` and `Σ dy` over the tokens
/// (batch and sequence folded into `k`), are one matmul kernel in f16 and bf16
/// (cuBLASLt's BGRADA for a `[in, out]` weight, which sums the GEMM's `b`; BGRADB for
/// an `[out, in]` one, which sums `a`), and the kernel executor gives the
/// interpreter's values. In f32, or when the sum is not of the whole operand, they
/// stay two kernels.
#[test]
fn bias_gradient_joins_the_weight_gradient_gemm() {
    use graphc_compiler::kernel::Operand;
    for dt in [DType::BF16, DType::F16, DType::F32] {
        for (weight_in_out, operand) in [(true, Operand::B), (false, Operand::A)] {
            let b = GraphBuilder::new();
            let x = b.input("x", dt, [2, 3, 16]).reshape([6, 16]);
            let dy = b.input("dy", dt, [2, 3, 8]);
            let dw = if weight_in_out {
                x.transpose(&[1, 0]).matmul(dy.reshape([6, 8]))
            } else {
                dy.reshape([6, 8]).transpose(&[1, 0]).matmul(x)
            };
            b.output("dw", dw);
            b.output("db", dy.sum(&[0, 1], false));
            let g = b.finish().unwrap();
            let p = run_both(&g);
            let what = format!(
                "{dt} weight {}:\n{}",
                if weight_in_out { "[in, out]" } else { "[out, in]" },
                print_program(&p)
            );
            if dt == DType::F32 {
                assert_eq!(kinds(&p), ["matmul", "row"], "{what}");
                continue;
            }
            assert_eq!(kinds(&p), ["matmul"], "{what}");
            let KernelKind::MatMul(mm) = &p.kernels[0].kind else {
                unreachable!()
            };
            assert_eq!(mm.bias_grad.as_ref().map(|g| g.operand), Some(operand), "{what}");
        }
        // Half the tokens summed: not the GEMM's operand over k.
        let b = GraphBuilder::new();
        let x = b.input("x", dt, [6, 16]);
        let dy = b.input("dy", dt, [6, 8]);
        b.output("dw", x.transpose(&[1, 0]).matmul(dy));
        b.output("db", dy.slice(0, 0, 3, 1).sum(&[0], false));
        let g = b.finish().unwrap();
        let p = run_both(&g);
        assert!(kinds(&p).contains(&"row"), "{dt}:\n{}", print_program(&p));
    }
}
