//! Every ONNX backend node-test model that imports: optimized and fused into kernels,
//! run by the kernel executor through its memory plan's arena, it computes what the
//! interpreter computes for the imported graph, on the suite's own inputs (bitwise, NaN
//! equal to NaN, and the sign of zero ignored, which `x + 0 -> x` does not keep).
//!
//! Reads the suite materialized by `scripts/onnx_node_tests.py` (see
//! `ir/tests/onnx_conformance.rs`); skips (`graphc_testkit::skip`) without it unless `GRAPHC_REQUIRE=onnx-tests`.

mod planned;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use graphc_compiler::fuse::fuse;
use graphc_compiler::optimize::optimize;
use graphc_ir::onnx::proto::{self, ModelProto, TensorProto};
use graphc_ir::onnx::tensor::{tensor_from_proto, ExternalData};
use graphc_ir::onnx::{import_model, ImportOptions};
use graphc_ir::{interpret, Tensor};
use planned::run_arena;

fn suite_dir() -> PathBuf {
    match std::env::var_os("GRAPHC_ONNX_NODE_TESTS") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/onnx-node-tests"),
    }
}

fn read_tensor(path: &Path) -> Option<Tensor> {
    let bytes = std::fs::read(path).ok()?;
    let t: TensorProto = proto::decode(&bytes).ok()?;
    tensor_from_proto(&t, Some(&ExternalData::new(path.parent()))).ok()
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    a.ty() == b.ty()
        && a.to_f64_vec()
            .iter()
            .zip(b.to_f64_vec())
            .all(|(x, y)| *x == y || (x.is_nan() && y.is_nan()))
}

#[test]
fn fused_conformance_models_compute_the_same() {
    let dir = suite_dir();
    let Ok(index) = std::fs::read_to_string(dir.join("index.tsv")) else {
        graphc_testkit::skip(
            graphc_testkit::Need::OnnxTests,
            format!("no ONNX node tests at {}", dir.display()),
        );
        return;
    };
    let (mut checked, mut changed, mut kernels) = (0, 0, 0);
    let mut mismatches = Vec::new();
    for line in index.lines() {
        let case = line.split('\t').next().unwrap_or_default();
        let case_dir = dir.join(case);
        let Some(model) = std::fs::read(case_dir.join("model.onnx"))
            .ok()
            .and_then(|b| proto::decode::<ModelProto>(&b).ok())
        else {
            continue;
        };
        let Ok(graph) = import_model(&model, Some(&case_dir), &ImportOptions::default()) else {
            continue;
        };
        let (opt, report) = optimize(&graph, &Default::default()).unwrap_or_else(|e| panic!("{case}: {e}"));
        // A recognized composite op (the tanh GELU) agrees to a few ulps, not bitwise.
        // Inexact: a rewrite that is not bit-exact fired, or the model has an attention
        // op (ONNX's Attention imports as one), whose tiled kernel sums in another
        // order than the interpreter's two passes.
        let inexact = graphc_compiler::optimize::rules::INEXACT
            .iter()
            .any(|r| report.rules_fired.contains_key(*r))
            || graph
                .nodes()
                .iter()
                .any(|n| matches!(n.op, graphc_ir::Op::Attention { .. }));
        opt.verify().unwrap_or_else(|e| panic!("{case}: optimized graph: {e}"));
        let set = case_dir.join("test_data_set_0");
        let mut inputs = HashMap::new();
        for (k, &id) in graph.inputs().iter().enumerate() {
            let Some(t) = read_tensor(&set.join(format!("input_{k}.pb"))) else {
                continue;
            };
            inputs.insert(graph.input_name(id).unwrap_or_default().to_string(), t);
        }
        let Ok(want) = interpret(&graph, &inputs) else { continue };
        let program = fuse(&opt).unwrap_or_else(|e| panic!("{case}: fuse: {e}"));
        let got =
            run_arena(&program, opt.weights(), &inputs).unwrap_or_else(|e| panic!("{case}: fused program fails: {e}"));
        checked += 1;
        kernels += program.kernels.len();
        if opt.len() < graph.len() {
            changed += 1;
        }
        // Inexact rules (GELU, attention) agree to rounding: relative L2 within 1e-5
        // for f32 and f64, and within the dtype's tolerance for f16/bf16 (the
        // spelled-out graph rounds at every op, the recognized op once). Elements equal
        // (the same infinity, both NaN) count as no difference; a non-finite element
        // that differs is a mismatch.
        let agree = |a: &Tensor, b: &Tensor| {
            if !inexact {
                return same(a, b);
            }
            let (x, y) = (a.to_f64_vec(), b.to_f64_vec());
            let mut num = 0.0;
            for (p, q) in x.iter().zip(&y) {
                if p == q || (p.is_nan() && q.is_nan()) {
                    continue;
                }
                if !p.is_finite() || !q.is_finite() {
                    return false;
                }
                num += (p - q) * (p - q);
            }
            let den: f64 = y.iter().filter(|q| q.is_finite()).map(|q| q * q).sum();
            let tol = match a.dtype() {
                graphc_ir::DType::F16 | graphc_ir::DType::BF16 => graphc_ir::compare::tolerance(a.dtype(), false),
                _ => 1e-5,
            };
            a.ty() == b.ty() && num <= tol * tol * den.max(f64::MIN_POSITIVE)
        };
        if want.len() != got.len() || want.iter().zip(&got).any(|((_, a), (_, b))| !agree(a, b)) {
            mismatches.push(case.to_string());
        }
    }
    println!("{checked} imported models checked ({kernels} kernels), {changed} made smaller by the optimizer");
    assert!(checked > 500, "only {checked} models checked");
    assert!(mismatches.is_empty(), "optimized outputs differ: {mismatches:?}");
}
