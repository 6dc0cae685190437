//! Running a compiled training step again and again: the state (parameters, optimizer
//! moments, step counter; `graphc_compiler::train`) kept between steps.
//!
//! One interface, [`Stateful`], over any executor of the step ([`StepRunner`]): the CPU
//! executor ([`CpuStep`]), cuda-sim and the CUDA session (in `graphc`'s facade). A step
//! binds the batch and the current state by name, runs, and takes each state slot's
//! output (of the slot's own name) as the slot's new value; the other outputs (the
//! loss) are returned. State is typed: a loaded value must have its slot's type.

use std::collections::{BTreeMap, HashMap};

use graphc_compiler::Compiled;
use graphc_ir::Tensor;

use crate::kernels::run_planned;
use crate::RunError;

/// Runs one step of a compiled program on named inputs.
pub trait StepRunner {
    fn run_step(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError>;
}

/// The CPU executor, through the step's planned arena.
pub struct CpuStep<'m>(pub &'m Compiled);

impl StepRunner for CpuStep<'_> {
    fn run_step(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
        Ok(run_planned(
            &self.0.program,
            &self.0.plan,
            self.0.graph.weights(),
            inputs,
        )?)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("the model was not compiled as a training step")]
    NotTraining,
    #[error("state \"{0}\": {1}")]
    Init(String, String),
    #[error("state \"{0}\" is not a slot of this step")]
    Unknown(String),
    #[error("state \"{name}\" should be {expected}, got {got}")]
    Type {
        name: String,
        expected: graphc_ir::TensorType,
        got: graphc_ir::TensorType,
    },
    #[error("batch input \"{0}\" has the name of a state slot")]
    Shadowed(String),
    #[error("the step did not output state \"{0}\"")]
    MissingOutput(String),
    #[error(transparent)]
    Run(#[from] RunError),
}

/// A training step with its state, run step after step.
pub struct Stateful<R> {
    runner: R,
    state: BTreeMap<String, Tensor>,
    steps: u64,
}

impl<R: StepRunner> Stateful<R> {
    /// The step's state at its initial values (the model's weights, zero moments).
    pub fn new(model: &Compiled, runner: R) -> Result<Stateful<R>, StateError> {
        let training = model.train.as_ref().ok_or(StateError::NotTraining)?;
        let mut state = BTreeMap::new();
        for s in &training.state.slots {
            let t = s.init.tensor().map_err(|m| StateError::Init(s.name.clone(), m))?;
            state.insert(s.name.clone(), t);
        }
        Ok(Stateful {
            runner,
            state,
            steps: 0,
        })
    }

    /// Replace some slots' values (each of its slot's exact type).
    pub fn load_state(&mut self, values: impl IntoIterator<Item = (String, Tensor)>) -> Result<(), StateError> {
        for (name, t) in values {
            let cur = self.state.get(&name).ok_or_else(|| StateError::Unknown(name.clone()))?;
            if cur.ty() != t.ty() {
                return Err(StateError::Type {
                    name,
                    expected: cur.ty(),
                    got: t.ty(),
                });
            }
            self.state.insert(name, t);
        }
        Ok(())
    }

    /// One step on `batch`: returns the outputs that are not state (the loss).
    pub fn step(&mut self, batch: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, StateError> {
        let mut inputs = batch.clone();
        for (name, t) in &self.state {
            if inputs.insert(name.clone(), t.clone()).is_some() {
                return Err(StateError::Shadowed(name.clone()));
            }
        }
        let outputs = self.runner.run_step(&inputs)?;
        drop(inputs);
        let mut rest = Vec::new();
        let mut next = BTreeMap::new();
        for (name, t) in outputs {
            if self.state.contains_key(&name) {
                next.insert(name, t);
            } else {
                rest.push((name, t));
            }
        }
        if let Some(missing) = self.state.keys().find(|k| !next.contains_key(*k)) {
            return Err(StateError::MissingOutput(missing.clone()));
        }
        self.state = next;
        self.steps += 1;
        Ok(rest)
    }

    /// The current state, by slot name.
    pub fn state(&self) -> &BTreeMap<String, Tensor> {
        &self.state
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }
}
