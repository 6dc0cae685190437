//! The precision pass on random graphs (every op kind and dtype): at bf16 and fp16 it
//! returns a graph that verifies, keeps the interface (input and output names and
//! types), computes every matmul of f32 values in the low type or in f32, and runs
//! through the interpreter wherever the original does. Numerical agreement is checked
//! on real models (`tests/precision.rs`); random graphs are too ill-conditioned for a
//! tolerance.

#[path = "../../ir/tests/common/random_graph.rs"]
mod random_graph;

use std::collections::HashMap;

use graphc_compiler::passes::precision::{apply_precision, Precision};
use graphc_ir::{interpret, DType, Graph, Tensor};

fn with_weights(mut g: Graph, seed: u64) -> Graph {
    let params: Vec<(String, graphc_ir::TensorType)> =
        g.parameters().map(|(_, n, t)| (n.to_string(), t.clone())).collect();
    for (i, (name, ty)) in params.into_iter().enumerate() {
        g.set_weight(name, Tensor::random(&ty, seed * 31 + i as u64));
    }
    g
}

#[test]
fn random_graphs_stay_valid_with_the_same_interface() {
    let (mut lowered, mut ran) = (0, 0);
    for seed in 0..300u64 {
        let g = with_weights(random_graph::random_graph(seed), seed);
        let inputs: HashMap<String, Tensor> = g
            .inputs()
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                (
                    g.input_name(id).unwrap().to_string(),
                    Tensor::random(&g.node(id).ty, seed * 1000 + i as u64),
                )
            })
            .collect();
        let original = interpret(&g, &inputs);
        for p in [Precision::Bf16, Precision::Fp16] {
            let (out, report) = apply_precision(&g, p).unwrap_or_else(|e| panic!("graph {seed} {p}: {e}"));
            out.verify()
                .unwrap_or_else(|e| panic!("graph {seed} {p}: {e}\n{}", graphc_ir::print(&out)));
            lowered += report.low_nodes;
            let names = |g: &Graph| -> Vec<(String, graphc_ir::TensorType)> {
                g.outputs()
                    .iter()
                    .map(|o| (o.name.clone(), g.node(o.node).ty.clone()))
                    .chain(
                        g.inputs()
                            .iter()
                            .map(|&i| (g.input_name(i).unwrap().to_string(), g.node(i).ty.clone())),
                    )
                    .collect()
            };
            assert_eq!(names(&out), names(&g), "graph {seed} {p}: the interface changed");
            // Matmuls of f32 become low or stay f32; those of other types are untouched.
            let low = p.low_type().unwrap();
            let count = |g: &Graph, d: DType| {
                g.nodes()
                    .iter()
                    .filter(|n| n.op == graphc_ir::Op::MatMul && n.ty.dtype == d)
                    .count()
            };
            for d in DType::ALL {
                if d == low || d == DType::F32 {
                    continue;
                }
                assert_eq!(count(&out, d), count(&g, d), "graph {seed} {p}: {d} matmuls");
            }
            assert_eq!(
                count(&out, low) + count(&out, DType::F32),
                count(&g, low) + count(&g, DType::F32),
                "graph {seed} {p}"
            );
            if let Ok(want) = &original {
                let got = interpret(&out, &inputs)
                    .unwrap_or_else(|e| panic!("graph {seed} {p}: the lowered graph fails: {e}"));
                assert_eq!(got.len(), want.len());
                ran += 1;
            }
        }
    }
    eprintln!("{ran} lowered graphs ran; {lowered} nodes lowered in all");
    assert!(lowered > 300, "the pass lowered almost nothing: {lowered}");
}

#[test]
fn fp32_and_tf32_are_the_identity() {
    for seed in 0..20u64 {
        let g = with_weights(random_graph::random_graph(seed), seed);
        for p in [Precision::Fp32, Precision::Tf32] {
            let (out, r) = apply_precision(&g, p).unwrap();
            assert_eq!(graphc_ir::print(&out), graphc_ir::print(&g));
            assert_eq!((r.low_nodes, r.casts), (0, 0));
        }
    }
}

/// A mask filled with f32's lowest (transformers' fill) lowered to bf16 or f16 keeps
/// finite values finite (saturated to the low type's lowest, as a bf16 model's mask
/// holds), so a row whose keys are all masked is a uniform softmax as in f32, not NaN;
/// an infinite fill stays infinite.
#[test]
fn lowered_mask_fills_saturate_instead_of_becoming_infinite() {
    use graphc_ir::nn::softmax;
    use graphc_ir::GraphBuilder;
    for fill in [f32::MIN as f64, f64::NEG_INFINITY] {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [2, 4]);
        let w = b.param("w", Tensor::from_f64(DType::F32, vec![4, 4], &[0.5; 16]).unwrap());
        // Row 1 masks every key.
        let mv: Vec<f64> = (0..8).map(|i| if i >= 4 { fill } else { 0.0 }).collect();
        let m = b.param("m", Tensor::from_f64(DType::F32, vec![2, 4], &mv).unwrap());
        b.output("y", softmax(x.matmul(w) + m, -1));
        let g = b.finish().unwrap();
        let inputs = HashMap::from([(
            "x".to_string(),
            Tensor::randn(&graphc_ir::TensorType::new(DType::F32, [2, 4]), 1.0, 3),
        )]);
        let want = interpret(&g, &inputs).unwrap()[0].1.to_f64_vec();
        for p in [Precision::Bf16, Precision::Fp16] {
            let (low, _) = apply_precision(&g, p).unwrap();
            let got = interpret(&low, &inputs).unwrap()[0].1.to_f64_vec();
            if fill.is_finite() {
                assert!(got.iter().all(|v| v.is_finite()), "{p}: {got:?}");
                for (a, b) in got[4..].iter().zip(&want[4..]) {
                    assert!((a - 0.25).abs() < 1e-2 && (b - 0.25).abs() < 1e-6, "{p}: {got:?}");
                }
            } else {
                assert!(got[4..].iter().all(|v| v.is_nan()), "{p}: {got:?}");
            }
        }
    }
}
