//! Running a compiled training step again and again: the state (parameters, optimizer
//! moments, step counter; `graphc_compiler::train`) kept between steps.
//!
//! One interface, [`Stateful`], over any executor of the step ([`StepRunner`]): the CPU
//! executor ([`CpuStep`]), cuda-sim and the CUDA session (in `graphc`'s facade). A step
//! binds the batch and the current state by name, runs, and takes each state slot's
//! output (of the slot's own name) as the slot's new value; the other outputs (the
//! loss) are returned. State is typed: a loaded value must have its slot's type.
//!
//! A runner that keeps the state in its own memory ([`StepRunner::kept`]: the CUDA
//! session, the state in device memory) gets each slot's value once (before the first
//! step, and again only when [`Stateful::load_state`] replaces it) and runs each step
//! with only the batch: the state never crosses to the host and back per step. The
//! host copy is then brought up to date when it is read ([`Stateful::state`]), only
//! for the slots stepped since ([`Stateful::transfers`] counts the bytes moved).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use graphc_compiler::Compiled;
use graphc_ir::Tensor;

use crate::kernels::run_planned;
use crate::RunError;

/// Runs one step of a compiled program on named inputs.
pub trait StepRunner {
    fn run_step(&mut self, inputs: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError>;

    /// The runner keeps the state in its own memory between steps (see the module
    /// doc); `None` (the default): it takes the state with each step's inputs.
    fn kept(&mut self) -> Option<&mut dyn KeptState> {
        None
    }
}

/// State kept where the step runs ([`StepRunner::kept`]).
pub trait KeptState {
    /// Write these slots' values (each of its input's type).
    fn write(&mut self, values: &[(&str, &Tensor)]) -> Result<(), RunError>;
    /// One step on `batch` with the slots named in `state` read where they are kept
    /// and their next values left there; returns the outputs that are not state.
    fn run(&mut self, batch: &HashMap<String, Tensor>, state: &[&str]) -> Result<Vec<(String, Tensor)>, RunError>;
    /// These slots' current values.
    fn read(&mut self, names: &[&str]) -> Result<Vec<(String, Tensor)>, RunError>;
}

/// State bytes moved between the host and a runner that keeps the state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Written to the runner ([`KeptState::write`]).
    pub written: u64,
    /// Read back ([`KeptState::read`]).
    pub read: u64,
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
    /// The state on the host: each slot's value, older than the runner's for the slots
    /// in `stale`.
    state: BTreeMap<String, Tensor>,
    /// A kept state: slots the runner has stepped since the host last read them.
    stale: BTreeSet<String>,
    /// A kept state: slots whose host value the runner does not have yet.
    unwritten: BTreeSet<String>,
    transfers: Transfers,
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
        let unwritten = state.keys().cloned().collect();
        Ok(Stateful {
            runner,
            state,
            stale: BTreeSet::new(),
            unwritten,
            transfers: Transfers::default(),
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
            self.stale.remove(&name);
            self.unwritten.insert(name.clone());
            self.state.insert(name, t);
        }
        Ok(())
    }

    /// One step on `batch`: returns the outputs that are not state (the loss).
    pub fn step(&mut self, batch: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, StateError> {
        if let Some(kept) = self.runner.kept() {
            if let Some(name) = batch.keys().find(|n| self.state.contains_key(*n)) {
                return Err(StateError::Shadowed(name.clone()));
            }
            if !self.unwritten.is_empty() {
                let values: Vec<(&str, &Tensor)> = self
                    .unwritten
                    .iter()
                    .filter_map(|n| self.state.get(n).map(|t| (n.as_str(), t)))
                    .collect();
                kept.write(&values)?;
                self.transfers.written += values.iter().map(|(_, t)| t.ty().size_bytes() as u64).sum::<u64>();
                self.unwritten.clear();
            }
            let names: Vec<&str> = self.state.keys().map(String::as_str).collect();
            let rest = kept.run(batch, &names)?;
            self.stale = self.state.keys().cloned().collect();
            self.steps += 1;
            return Ok(rest);
        }
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

    /// The current state, by slot name (read back from a runner that keeps it, for
    /// the slots stepped since the last read).
    pub fn state(&mut self) -> Result<&BTreeMap<String, Tensor>, StateError> {
        if !self.stale.is_empty() {
            if let Some(kept) = self.runner.kept() {
                let names: Vec<&str> = self.stale.iter().map(String::as_str).collect();
                for (name, t) in kept.read(&names)? {
                    let cur = self
                        .state
                        .get(&name)
                        .ok_or_else(|| StateError::MissingOutput(name.clone()))?;
                    if cur.ty() != t.ty() {
                        return Err(StateError::Type {
                            name,
                            expected: cur.ty(),
                            got: t.ty(),
                        });
                    }
                    self.transfers.read += t.ty().size_bytes() as u64;
                    self.state.insert(name, t);
                }
            }
            self.stale.clear();
        }
        Ok(&self.state)
    }

    /// State bytes moved between the host and a runner that keeps the state.
    pub fn transfers(&self) -> Transfers {
        self.transfers
    }

    /// Whether the runner keeps the state between steps ([`StepRunner::kept`]).
    pub fn keeps_state(&mut self) -> bool {
        self.runner.kept().is_some()
    }

    /// Steps run so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn runner_mut(&mut self) -> &mut R {
        &mut self.runner
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use graphc_compiler::train::{AdamW, Loss, LossKind, Optimizer, TrainOptions};
    use graphc_compiler::CompileOptions;
    use graphc_ir::{DType, GraphBuilder, TensorType};

    /// A runner that keeps the state in a memory of its own (as a GPU's), running the
    /// CPU executor on it, and counts what crosses.
    struct Device<'m> {
        step: &'m Compiled,
        memory: HashMap<String, Tensor>,
        writes: usize,
        reads: usize,
    }

    impl StepRunner for Device<'_> {
        fn run_step(&mut self, _: &HashMap<String, Tensor>) -> Result<Vec<(String, Tensor)>, RunError> {
            panic!("a runner that keeps the state is never given it");
        }

        fn kept(&mut self) -> Option<&mut dyn KeptState> {
            Some(self)
        }
    }

    impl KeptState for Device<'_> {
        fn write(&mut self, values: &[(&str, &Tensor)]) -> Result<(), RunError> {
            for (n, t) in values {
                self.writes += 1;
                self.memory.insert(n.to_string(), (*t).clone());
            }
            Ok(())
        }

        fn run(&mut self, batch: &HashMap<String, Tensor>, state: &[&str]) -> Result<Vec<(String, Tensor)>, RunError> {
            let mut inputs = batch.clone();
            for n in state {
                inputs.insert(n.to_string(), self.memory[*n].clone());
            }
            let out = CpuStep(self.step).run_step(&inputs)?;
            let mut rest = Vec::new();
            for (n, t) in out {
                if state.contains(&n.as_str()) {
                    self.memory.insert(n, t);
                } else {
                    rest.push((n, t));
                }
            }
            Ok(rest)
        }

        fn read(&mut self, names: &[&str]) -> Result<Vec<(String, Tensor)>, RunError> {
            self.reads += names.len();
            Ok(names.iter().map(|n| (n.to_string(), self.memory[*n].clone())).collect())
        }
    }

    fn step() -> Compiled {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 3]);
        let w = b.param("w", Tensor::randn(&TensorType::new(DType::F32, [3, 2]), 0.5, 1));
        b.output("y", x.matmul(w));
        let graph = b.finish().unwrap();
        let opts = CompileOptions {
            train: Some(TrainOptions {
                loss: Loss::new(LossKind::Mse, "t"),
                optimizer: Optimizer::AdamW(AdamW::default()),
                freeze: None,
                target: TensorType::new(DType::F32, [4, 2]),
                output: None,
                loss_scale: None,
                remat: Default::default(),
                accumulate: 1,
            }),
            ..Default::default()
        };
        graphc_compiler::compile(&graph, &opts).unwrap()
    }

    /// A kept state is written once, stepped where it lives and read only when asked
    /// for; the losses and the state are the host runner's.
    #[test]
    fn a_kept_state_crosses_only_when_written_or_read() {
        let step = step();
        let batch: HashMap<String, Tensor> = [
            (
                "x".to_string(),
                Tensor::randn(&TensorType::new(DType::F32, [4, 3]), 1.0, 2),
            ),
            (
                "t".to_string(),
                Tensor::randn(&TensorType::new(DType::F32, [4, 2]), 1.0, 3),
            ),
        ]
        .into();
        let mut host = Stateful::new(&step, CpuStep(&step)).unwrap();
        let device = Device {
            step: &step,
            memory: HashMap::new(),
            writes: 0,
            reads: 0,
        };
        let mut kept = Stateful::new(&step, device).unwrap();
        assert!(kept.keeps_state() && !host.keeps_state());
        let slots = 4; // w, its two moments, the step counter
        for _ in 0..3 {
            assert_eq!(host.step(&batch).unwrap(), kept.step(&batch).unwrap());
        }
        assert_eq!(
            (kept.runner.writes, kept.runner.reads),
            (slots, 0),
            "written once, never read"
        );
        assert_eq!(host.state().unwrap(), kept.state().unwrap());
        assert_eq!(kept.runner.reads, slots);
        kept.state().unwrap();
        assert_eq!(kept.runner.reads, slots, "read once after a step");
        // A loaded slot is written again before the next step, and not read back.
        let w = Tensor::zeros(&TensorType::new(DType::F32, [3, 2]));
        kept.load_state([("w".to_string(), w.clone())]).unwrap();
        host.load_state([("w".to_string(), w)]).unwrap();
        assert_eq!(host.step(&batch).unwrap(), kept.step(&batch).unwrap());
        assert_eq!(kept.runner.writes, slots + 1);
        assert_eq!(host.state().unwrap(), kept.state().unwrap());
        assert_eq!(kept.transfers().read, 2 * (6 + 6 + 6) * 4 + 2 * 8);
        // A batch input named as a slot is refused.
        let mut shadow = batch.clone();
        shadow.insert("w".to_string(), Tensor::zeros(&TensorType::new(DType::F32, [3, 2])));
        assert!(matches!(kept.step(&shadow), Err(StateError::Shadowed(n)) if n == "w"));
    }
}
