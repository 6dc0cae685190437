//! Embedded training: compile an MLP's whole training step (forward, MSE loss,
//! backward, AdamW update) and run it on the CPU, state kept between steps.
//! `cargo run --release --example train`
//!
//! The same step runs on cuda-sim (`graphc::train::sim_session`) or a GPU
//! (`graphc::train::cuda_session`); `graphc plan MODEL --train ...` prints its memory
//! by class.

use graphc::ir::{DType, Tensor, TensorType};
use graphc::models::{mlp, MlpConfig};
use graphc::train::{self, AdamW, Loss, LossKind, Optimizer, TrainOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = MlpConfig {
        batch: 32,
        widths: vec![16, 64, 4],
        ..MlpConfig::default()
    };
    let graph = mlp(&cfg)?;
    // A target the MLP can learn: a fixed random linear map of the input.
    let x = Tensor::randn(&TensorType::new(DType::F32, [cfg.batch, 16]), 1.0, 1);
    let w = Tensor::randn(&TensorType::new(DType::F32, [16, 4]), 0.5, 2);
    let y = graphc::ir::interp::eval_op(
        &graphc::ir::Op::MatMul,
        &[&x, &w],
        &TensorType::new(DType::F32, [cfg.batch, 4]),
    )?;
    let opts = TrainOptions {
        loss: Loss::new(LossKind::Mse, "target"),
        optimizer: Optimizer::AdamW(AdamW {
            lr: 1e-2,
            ..AdamW::default()
        }),
        freeze: None,
        target: y.ty(),
        output: None,
        loss_scale: None,
        remat: Default::default(),
        accumulate: 1,
    };
    let step = train::compile_step(&graph, opts, &Default::default())?;
    if let Some(t) = &step.train {
        println!(
            "# {} parameters, {} state slots, {} kernels, {} updated in place",
            t.report.trainable.len(),
            t.state.slots.len(),
            step.program.kernels.len(),
            step.program.donated.len()
        );
    }
    let mut session = train::cpu_session(&step)?;
    let batch = [("x".to_string(), x), ("target".to_string(), y)].into();
    for n in 1..=50 {
        let loss = train::step_loss(&mut session, &batch)?;
        if n % 10 == 1 || n == 50 {
            println!("step {n} loss {loss:.6}");
        }
    }
    for (name, t) in train::parameters(&step, &mut session)? {
        println!("# {name}: {}", t.ty());
    }
    Ok(())
}
