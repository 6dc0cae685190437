//! Seeded weights and inputs for the random graphs the runtime's tests run.

use std::collections::HashMap;

use graphc_ir::{Graph, Tensor};

/// `g` with every parameter bound to random weights from `seed`.
pub fn with_weights(mut g: Graph, seed: u64) -> Graph {
    let params: Vec<(String, graphc_ir::TensorType)> =
        g.parameters().map(|(_, n, t)| (n.to_string(), t.clone())).collect();
    for (i, (name, ty)) in params.into_iter().enumerate() {
        g.set_weight(name, Tensor::random(&ty, seed * 31 + i as u64));
    }
    g
}

/// Random inputs for every input of `g`, from `seed`.
pub fn inputs(g: &Graph, seed: u64) -> HashMap<String, Tensor> {
    g.inputs()
        .iter()
        .enumerate()
        .map(|(i, &id)| {
            let name = g.input_name(id).expect("input").to_string();
            (name, Tensor::random(&g.node(id).ty, seed * 1000 + i as u64))
        })
        .collect()
}
