//! Memory-aware scheduling: the chosen kernel order has the lowest peak of the candidates,
//! beats the program order where operand order is bad for memory, and computes the same.

mod common;

use common::{random_inputs, rel_l2};
use graphc::ir::{DType, Graph, GraphBuilder, Tensor, TensorType};
use graphc_compiler::plan::{apply_schedule, candidate_orders, plan_memory, schedule, verify_plan, MemoryOptions};

/// `y = rowsum(x @ Wa) + rowsum(x @ Wh)`, where `x @ Wa` (1 MiB) is the first operand
/// and `x @ Wh` (4 MiB) the second: computing `x @ Wa` first keeps it live while the
/// 4 MiB product is computed and reduced.
fn two_branches() -> Graph {
    let b = GraphBuilder::new();
    let x = b.input("x", DType::F32, [64, 64]);
    let wa = b.param("wa", Tensor::random(&TensorType::new(DType::F32, [64, 4096]), 1));
    let wh = b.param("wh", Tensor::random(&TensorType::new(DType::F32, [64, 16384]), 2));
    let a = x.matmul(wa).sum(&[1], true);
    let h = x.matmul(wh).sum(&[1], true);
    b.output("y", a + h);
    b.finish().unwrap()
}

#[test]
fn heaviest_subtree_first_beats_the_program_order() {
    let g = two_branches();
    let c = graphc::compile(&g).unwrap();
    let program_peak = c.schedule.candidates[0].1;
    assert_eq!(c.schedule.candidates[0].0, graphc_compiler::plan::Scheduler::Program);
    assert!(
        c.schedule.peak < program_peak,
        "{} {:?}",
        c.schedule.name,
        c.schedule.candidates
    );
    assert!(c.plan.lower_bound_bytes < program_peak);
    verify_plan(&c.program, &c.plan).unwrap();
    let inputs = random_inputs(&g, 1);
    let want = graphc::ir::interpret(&g, &inputs).unwrap();
    let got = graphc::run_cpu(&c, inputs).unwrap();
    let err = rel_l2(&got[0].1.to_f64_vec(), &want[0].1.to_f64_vec());
    assert!(err < 1e-5, "{err:.2e}");
}

/// Every candidate order of the example models is a valid order (the plan verifier
/// checks that every buffer is written before it is read), and the chosen one has the
/// lowest peak.
#[test]
fn every_candidate_order_is_valid() {
    use graphc::models::{gpt, GptConfig};
    let models = [
        gpt(&GptConfig {
            layers: 2,
            ..GptConfig::default()
        })
        .unwrap(),
        two_branches(),
    ];
    for g in &models {
        let c = graphc::compile(g).unwrap();
        let s = schedule(&c.program);
        assert_eq!(s.peak, s.candidates.iter().map(|(_, p)| *p).min().unwrap());
        let orders = candidate_orders(&c.program);
        assert_eq!(orders.len(), s.candidates.len());
        for (name, order) in &orders {
            let p = apply_schedule(&c.program, order);
            let plan = plan_memory(&p, &MemoryOptions::default()).unwrap();
            verify_plan(&p, &plan).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        // Reversing a valid order is invalid: the verifier must reject it.
        let reversed: Vec<usize> = s.order.iter().rev().copied().collect();
        if c.program.kernels.len() > 1 {
            let p = apply_schedule(&c.program, &reversed);
            let plan = plan_memory(&p, &MemoryOptions::default()).unwrap();
            assert!(verify_plan(&p, &plan).is_err(), "a reversed order must not verify");
        }
    }
}
