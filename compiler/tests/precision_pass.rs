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
