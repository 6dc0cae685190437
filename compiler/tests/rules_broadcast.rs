//! Ops over broadcasts computed at the small shape (`rules/broadcast.rs`): each rule
//! fires, the value it rewrites is computed at the small shape and broadcast, and the
//! outputs are unchanged (bitwise) on random inputs through the interpreter. The last
//! test is the whole chain a transformers export builds its masks with at batch size.

use std::collections::HashMap;

use graphc_compiler::optimize::{optimize, OptimizeReport};
use graphc_ir::{interpret, BinaryOp, DType, Graph, GraphBuilder, Op, PadMode, Shape, Tensor, TensorData};

const B: usize = 300;
const S: usize = 24;

fn finish(b: GraphBuilder) -> Graph {
    b.finish().unwrap()
}

/// Optimize; outputs bitwise equal on random inputs (integer inputs in `0..S`).
fn check(g: &Graph) -> (Graph, OptimizeReport) {
    let (opt, report) = optimize(g, &Default::default()).unwrap();
    opt.verify().unwrap();
    for seed in 0..2u64 {
        let mut inputs = HashMap::new();
        for (i, &id) in g.inputs().iter().enumerate() {
            let ty = g.node(id).ty.clone();
            let t = if ty.dtype.is_int() {
                let v: Vec<f64> = (0..ty.numel() as u64)
                    .map(|k| ((k * 7 + seed * 3 + i as u64) % S as u64) as f64)
                    .collect();
                Tensor::new(ty.shape.clone(), TensorData::from_f64(ty.dtype, &v)).unwrap()
            } else {
                Tensor::randn(&ty, 1.0, seed * 10 + i as u64)
            };
            inputs.insert(g.input_name(id).unwrap().to_string(), t);
        }
        let want = interpret(g, &inputs).unwrap();
        let got = interpret(&opt, &inputs).unwrap();
        assert_eq!(got, want, "{}", graphc_ir::print(&opt));
    }
    (opt, report)
}

fn fired(r: &OptimizeReport, rule: &str) -> bool {
    r.rules_fired.get(rule).copied().unwrap_or(0) > 0
}

/// The largest node of the optimized graph that computes (not a view or a leaf) from
/// no input (an index-only value), in elements.
fn largest_index_only(g: &Graph) -> usize {
    let order = g.topo_order().unwrap();
    let mut from_input = vec![false; g.len()];
    let mut largest = 0;
    for id in order {
        let n = g.node(id);
        from_input[id.index()] = matches!(n.op, Op::Input { .. }) || n.inputs.iter().any(|i| from_input[i.index()]);
        let view_or_leaf = matches!(
            n.op,
            Op::Broadcast { .. } | Op::Reshape { .. } | Op::Constant { .. } | Op::Input { .. } | Op::Parameter { .. }
        );
        if !from_input[id.index()] && !view_or_leaf {
            largest = largest.max(n.ty.numel());
        }
    }
    largest
}

#[test]
fn a_causal_mask_at_batch_size_is_computed_once() {
    // le(broadcast(col), broadcast(row)) at [b, 1, s, s], then select with an input. (At
    // sizes where computing it per element costs more than a launch: a tiny mask stays
    // fused into its consumer, which the cost model prefers.)
    let (b_, s_) = (512, 64);
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [b_, 1, s_, s_]);
    let row = b
        .iota(DType::I64, [s_, 1], 0)
        .broadcast_to(&Shape::new([b_, 1, s_, s_]));
    let col = b.iota(DType::I64, [s_], 0).broadcast_to(&Shape::new([b_, 1, s_, s_]));
    let keep = col.le(row);
    b.output("y", b.select(keep, x, b.scalar(DType::F32, f64::NEG_INFINITY)));
    let (opt, r) = check(&finish(b));
    assert!(fired(&r, "elementwise-of-broadcasts"), "{r:?}");
    assert!(largest_index_only(&opt) <= s_ * s_, "{}", graphc_ir::print(&opt));
}

#[test]
fn pad_slice_and_concat_of_broadcasts() {
    // A cumulative sum's first steps over positions broadcast to the batch.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::I64, [B, S]);
    let pos = b.iota(DType::I64, [S], 0).broadcast_to(&Shape::new([B, S]));
    let shifted = pos.pad(&[(0, 0), (1, -1)], PadMode::Constant, 0.0);
    let sum = pos + shifted;
    let minus = b.constant(Tensor::from_f64(DType::I64, vec![B, 1], &vec![-1.0; B]).unwrap());
    let cat = b.concat(&[minus, pos], 1).slice(1, 0, S as i64, 1);
    b.output("y", x + sum * 3.0 - cat);
    let (opt, r) = check(&finish(b));
    for rule in ["pad-of-broadcast", "concat-of-broadcasts", "slice-of-broadcast"] {
        assert!(fired(&r, rule), "{rule}: {r:?}");
    }
    assert!(largest_index_only(&opt) <= S + 1, "{}", graphc_ir::print(&opt));
}

#[test]
fn gathers_of_broadcasts() {
    // GatherND as the importer lowers it: the flattened [B, S] positions, indexed by
    // b * S + j: one period of S elements, and the batch offsets drop out of the index.
    let b = GraphBuilder::new();
    let j = b.input("j", DType::I64, [S]);
    let pos = b.iota(DType::I64, [S], 0) * 5.0;
    let flat = pos.broadcast_to(&Shape::new([B, S])).reshape([B * S]);
    let offsets = b.constant(
        Tensor::from_f64(
            DType::I64,
            vec![B, 1],
            &(0..B).map(|i| (i * S) as f64).collect::<Vec<_>>(),
        )
        .unwrap(),
    );
    let idx = j.reshape([1, S]).broadcast_to(&Shape::new([B, S])) + offsets.broadcast_to(&Shape::new([B, S]));
    b.output("y", flat.gather(idx, 0));
    let (opt, r) = check(&finish(b));
    for rule in ["gather-of-periodic", "mod-of-add-multiple", "gather-of-broadcast-index"] {
        assert!(fired(&r, rule), "{rule}: {r:?}");
    }
    assert!(largest_index_only(&opt) <= S, "{}", graphc_ir::print(&opt));
}

#[test]
fn mod_of_add_multiple_needs_multiples() {
    // 7 is not a multiple of 4: left alone.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::I64, [S]);
    let y = (x + 7.0).binary(BinaryOp::Mod, b.scalar(DType::I64, 4.0).broadcast_to(&Shape::new([S])));
    b.output("y", y);
    let (_, r) = check(&finish(b));
    assert!(!fired(&r, "mod-of-add-multiple"), "{r:?}");
    // 8 is.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::I64, [S]);
    let y = (x + 8.0).binary(BinaryOp::Mod, b.scalar(DType::I64, 4.0).broadcast_to(&Shape::new([S])));
    b.output("y", y);
    let (opt, r) = check(&finish(b));
    assert!(fired(&r, "mod-of-add-multiple"), "{r:?}");
    assert!(!opt.nodes().iter().any(|n| n.op == Op::Binary(BinaryOp::Add)));
}

#[test]
fn an_ordinary_broadcast_add_is_unchanged() {
    // x + broadcast(bias): x is no broadcast, nothing to shrink.
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [B, S]);
    let bias = b.input("bias", DType::F32, [S]);
    b.output("y", x + bias);
    let (opt, r) = check(&finish(b));
    assert!(!fired(&r, "elementwise-of-broadcasts"));
    assert_eq!(
        opt.nodes().iter().filter(|n| n.op == Op::Binary(BinaryOp::Add)).count(),
        1
    );
}
