//! Training from Rust: compile a whole training step ([`graphc_compiler::train`]:
//! parameters as state, the loss, reverse-mode gradients, the optimizer's update) and
//! run it step after step on the CPU, cuda-sim or a GPU, state kept between steps
//! ([`graphc_runtime::state::Stateful`]).
//!
//! ```
//! use graphc::models::{mlp, MlpConfig};
//! use graphc::train::{self, Loss, LossKind, Optimizer, Sgd, TrainOptions};
//! use graphc_ir::{DType, Tensor, TensorType};
//! let graph = mlp(&MlpConfig::default()).unwrap();
//! let x = Tensor::random(&TensorType::new(DType::F32, [8, 64]), 1);
//! let y = Tensor::random(&TensorType::new(DType::F32, [8, 64]), 2);
//! let opts = TrainOptions {
//!     loss: Loss::new(LossKind::Mse, "y"),
//!     optimizer: Optimizer::Sgd(Sgd::new(0.1)),
//!     freeze: None,
//!     target: y.ty(),
//!     output: None,
//!     loss_scale: None,
//!     remat: Default::default(),
//!     accumulate: 1,
//! };
//! let step = train::compile_step(&graph, opts, &Default::default()).unwrap();
//! let mut session = train::cpu_session(&step).unwrap();
//! let batch = [("x".to_string(), x), ("y".to_string(), y)].into();
//! let first = train::step_loss(&mut session, &batch).unwrap();
//! let second = train::step_loss(&mut session, &batch).unwrap();
//! assert!(second < first);
//! ```

use std::collections::{BTreeMap, HashMap};

pub use graphc_compiler::train::{AdamW, Loss, LossKind, LossScaling, Optimizer, Remat, Sgd, StateClass, TrainOptions};
use graphc_compiler::{CompileOptions, Compiled};
use graphc_ir::{Graph, Tensor};
pub use graphc_runtime::state::{CpuStep, KeptState, StateError, Stateful, StepRunner, Transfers};
use graphc_runtime::RunError;

use crate::Error;

/// Compile `graph`'s training step with `opts` (budget, planner options from `base`).
pub fn compile_step(graph: &Graph, train: TrainOptions, base: &CompileOptions) -> Result<Compiled, Error> {
    let opts = CompileOptions {
        train: Some(train),
        ..base.clone()
    };
    crate::compile_with(graph, &opts)
}

/// The target (or labels) type the loss of `opts` expects of `graph`'s output: for
/// `mse` the output's type, for cross-entropy i64 labels of its leading dims. For
/// planning without a batch at hand (`graphc plan --train`, `graphc fit --train`).
pub fn expected_target(graph: &Graph, opts: &TrainOptions) -> Result<graphc_ir::TensorType, Error> {
    let out = match &opts.output {
        Some(name) => graph.outputs().iter().find(|o| &o.name == name),
        None => graph.outputs().first(),
    }
    .ok_or_else(|| Error::Train("the model has no such output".into()))?;
    let ty = graph.node(out.node).ty.clone();
    Ok(match opts.loss.kind {
        LossKind::CrossEntropy => {
            let d = ty.shape.dims();
            graphc_ir::TensorType::new(
                graphc_ir::DType::I64,
                d.split_last().map(|(_, r)| r.to_vec()).unwrap_or_default(),
            )
        }
        LossKind::Mse => ty,
    })
}

/// A session of the step on the CPU executor.
pub fn cpu_session(step: &Compiled) -> Result<Stateful<CpuStep<'_>>, Error> {
    Stateful::new(step, CpuStep(step)).map_err(state_error)
}

/// cuda-sim as a step runner: every kernel's CUDA C run on the host, the state kept in
/// the simulated device memory between steps.
pub struct SimStep<'m> {
    pub session: crate::cuda::sim::SimSession,
    pub weights: &'m BTreeMap<String, Tensor>,
}

impl StepRunner for SimStep<'_> {
    fn run_step(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(self.session.run(self.weights, inputs)?)
    }

    /// The state kept in the simulated device memory, as [`CudaStep`] keeps it on a GPU.
    fn kept(&mut self) -> Option<&mut dyn KeptState> {
        Some(self)
    }
}

impl KeptState for SimStep<'_> {
    fn write(&mut self, values: &[(&str, &Tensor)]) -> Result<(), RunError> {
        Ok(self.session.write_inputs(self.weights, values)?)
    }

    fn run(&mut self, batch: &HashMap<String, Tensor>, state: &[&str]) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(self.session.run_kept(self.weights, batch, state)?)
    }

    fn read(&mut self, names: &[&str]) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(self.session.read_inputs(names)?)
    }
}

/// A session of the step on cuda-sim.
pub fn sim_session<'m>(
    step: &'m Compiled,
    opts: &crate::cuda::sim::SimOptions,
) -> Result<Stateful<SimStep<'m>>, Error> {
    let session = crate::cuda::sim::SimSession::new(step, opts)?;
    let runner = SimStep {
        session,
        weights: step.graph.weights(),
    };
    Stateful::new(step, runner).map_err(state_error)
}

/// A CUDA session as a step runner: the state is kept in device memory between steps
/// (uploaded once, updated in place by each step, read back when asked for); each
/// step uploads the batch and downloads the loss.
pub struct CudaStep(pub crate::cuda::Session);

impl StepRunner for CudaStep {
    fn run_step(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(self.0.run(inputs)?)
    }

    fn kept(&mut self) -> Option<&mut dyn KeptState> {
        Some(self)
    }
}

impl KeptState for CudaStep {
    fn write(&mut self, values: &[(&str, &Tensor)]) -> Result<(), RunError> {
        Ok(self.0.write_inputs(values)?)
    }

    fn run(&mut self, batch: &HashMap<String, Tensor>, state: &[&str]) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(self.0.run_kept(batch, state)?)
    }

    fn read(&mut self, names: &[&str]) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(self.0.read_inputs(names)?)
    }
}

/// A session of the step on a GPU.
pub fn cuda_session(step: &Compiled, opts: crate::cuda::SessionOptions) -> Result<Stateful<CudaStep>, Error> {
    let session = crate::cuda::Session::new(step, opts)?;
    Stateful::new(step, CudaStep(session)).map_err(state_error)
}

/// One step; the loss (before the step's update) as f64.
pub fn step_loss<R: StepRunner>(session: &mut Stateful<R>, batch: &HashMap<String, Tensor>) -> Result<f64, Error> {
    Ok(step_once(session, batch)?.loss)
}

/// What one step reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepOutcome {
    /// The loss (before the step's update; unscaled).
    pub loss: f64,
    /// With dynamic loss scaling: the scale the loss was multiplied by, and whether
    /// the step was skipped (an inf or NaN gradient: no slot but the scale's changed).
    pub loss_scale: Option<f64>,
    pub skipped: bool,
}

/// One step, with what it reports.
pub fn step_once<R: StepRunner>(
    session: &mut Stateful<R>,
    batch: &HashMap<String, Tensor>,
) -> Result<StepOutcome, Error> {
    let out = session.step(batch).map_err(state_error)?;
    let loss = out
        .iter()
        .find(|(n, _)| n == graphc_compiler::train::LOSS_OUTPUT)
        .ok_or_else(|| Error::Train("the step has no loss output".into()))?;
    let loss = loss.1.to_f64_vec().first().copied().unwrap_or(f64::NAN);
    let scaler = out
        .iter()
        .find(|(n, _)| n == graphc_compiler::train::scale::OUTPUT)
        .map(|(_, t)| t.to_f64_vec());
    Ok(StepOutcome {
        loss,
        loss_scale: scaler.as_ref().and_then(|v| v.first().copied()),
        skipped: scaler.as_ref().and_then(|v| v.get(1)).is_some_and(|&s| s != 0.0),
    })
}

/// The trainable parameters and the running statistics (batch norm) of a session's
/// state, by model name, in state order
/// (read back from the device when the session keeps the state there).
pub fn parameters<R: StepRunner>(step: &Compiled, session: &mut Stateful<R>) -> Result<Vec<(String, Tensor)>, Error> {
    let Some(training) = &step.train else {
        return Ok(Vec::new());
    };
    let state = session.state().map_err(state_error)?;
    Ok(training
        .state
        .slots
        .iter()
        .filter(|s| matches!(s.class, StateClass::Parameter | StateClass::Statistics))
        .filter_map(|s| state.get(&s.name).map(|t| (s.name.clone(), t.clone())))
        .collect())
}

fn state_error(e: StateError) -> Error {
    match e {
        StateError::Run(r) => Error::Run(r),
        other => Error::Train(other.to_string()),
    }
}
