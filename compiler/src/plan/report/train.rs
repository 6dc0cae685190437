//! The memory of a training step by class, as PyTorch users count it: parameters,
//! gradients, optimizer state, saved activations, temporaries.
//!
//! Kernels are split by what they compute: the **forward** pass is every kernel the
//! `loss` output depends on; the **update** kernels write the state (parameters,
//! moments, step counter); the **backward** pass is the rest. Arena buffers are then
//! **saved activations** (written by the forward pass, read after it), **gradients**
//! (written by the backward pass, read by an update) or **temporaries** (everything
//! else: the backward's intermediates, the forward's values it drops).
//!
//! The classes outside the arena are exact sums of their buffers; the arena is
//! decomposed at its peak step (the step where the most bytes are live, which sizes
//! it), so that `parameters + optimizer state + inputs + weights + outputs +
//! saved activations + gradients + temporaries + GEMM scratch + fragmentation +
//! workspace = total`. The whole step's sums (every saved activation, every gradient,
//! however briefly it lives) are given beside, for comparison with frameworks that keep
//! all of them at once.

use std::collections::HashSet;

use serde::Serialize;

use super::super::{Device, MemoryPlan};
use super::human_bytes;
use crate::kernel::{BufferKind, Program};
use crate::train::{State, StateClass};

/// A training step's bytes by class (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TrainBytes {
    pub parameters: u64,
    /// Optimizer moments and the step counter.
    pub optimizer_state: u64,
    /// The batch (model inputs and the target).
    pub inputs: u64,
    /// Frozen weights and constants.
    pub weights: u64,
    /// The loss, and state written beside its input (not in place).
    pub outputs: u64,
    /// At the arena's peak step.
    pub saved_activations: u64,
    pub gradients: u64,
    pub temporaries: u64,
    pub gemm_scratch: u64,
    /// Arena bytes above the peak (placement).
    pub fragmentation: u64,
    pub workspace: u64,
    pub total: u64,
    /// The step (kernel index) of the arena's peak, and whether it is in the forward
    /// pass, the backward pass or an update.
    pub peak_step: u32,
    pub peak_phase: &'static str,
    /// Every saved activation and every gradient of the step, summed.
    pub saved_activations_all: u64,
    pub gradients_all: u64,
    /// Kernels of each pass.
    pub forward_kernels: usize,
    pub backward_kernels: usize,
    pub update_kernels: usize,
    /// Update kernels that are multi-tensor launches, and the per-parameter updates
    /// they run (`crate::train::multi`).
    pub multi_tensor_kernels: usize,
    pub multi_tensor_parts: usize,
    /// State slots, and how many are updated in place (donated).
    pub state_slots: usize,
    pub in_place: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Forward,
    Backward,
    Update,
}

impl TrainBytes {
    /// The classes of `plan` (a plan of the training step `program` with `state`) for a
    /// run on `device`.
    pub fn of(program: &Program, plan: &MemoryPlan, state: &State, device: Device) -> TrainBytes {
        let nk = program.kernels.len();
        let nb = program.buffers.len();
        let mut writer: Vec<Option<usize>> = vec![None; nb];
        for (k, kernel) in program.kernels.iter().enumerate() {
            for b in kernel.writes() {
                if let Some(w) = writer.get_mut(b.index()) {
                    w.get_or_insert(k);
                }
            }
        }
        let state_names: HashSet<&str> = state.slots.iter().map(|s| s.name.as_str()).collect();
        // Forward: what the loss depends on.
        let mut phase = vec![Phase::Backward; nk];
        let mut stack: Vec<usize> = program
            .outputs
            .iter()
            .filter(|(n, _)| n == "loss")
            .filter_map(|(_, b)| writer.get(b.index()).copied().flatten())
            .collect();
        let mut forward = vec![false; nk];
        while let Some(k) = stack.pop() {
            if std::mem::replace(&mut forward[k], true) {
                continue;
            }
            for b in program.kernels[k].reads() {
                if let Some(w) = writer.get(b.index()).copied().flatten() {
                    stack.push(w);
                }
            }
        }
        for (k, f) in forward.iter().enumerate() {
            if *f {
                phase[k] = Phase::Forward;
            }
        }
        for (name, b) in &program.outputs {
            if state_names.contains(name.as_str()) {
                if let Some(w) = writer.get(b.index()).copied().flatten() {
                    if phase[w] != Phase::Forward {
                        phase[w] = Phase::Update;
                    }
                }
            }
        }
        // Buffer classes.
        #[derive(Clone, Copy, PartialEq)]
        enum Class {
            Saved,
            Gradient,
            Temp,
        }
        let mut read_by: Vec<Vec<Phase>> = vec![Vec::new(); nb];
        for (k, kernel) in program.kernels.iter().enumerate() {
            for b in kernel.reads() {
                if let Some(r) = read_by.get_mut(b.index()) {
                    r.push(phase[k]);
                }
            }
        }
        let class = |i: usize| -> Class {
            let w = writer.get(i).copied().flatten().map(|k| phase[k]);
            match w {
                Some(Phase::Forward) if read_by[i].iter().any(|p| *p != Phase::Forward) => Class::Saved,
                Some(Phase::Backward) if read_by[i].contains(&Phase::Update) => Class::Gradient,
                _ => Class::Temp,
            }
        };
        let align = plan.align.max(1);
        let rounded = |b: u64| b.div_ceil(align).saturating_mul(align);
        let (mut saved, mut grads, mut temps) = (0u64, 0u64, 0u64);
        let (mut saved_all, mut grads_all) = (0u64, 0u64);
        let peak = plan.peak_step;
        for pb in &plan.buffers {
            let i = pb.buffer.index();
            if i >= nb {
                continue; // GEMM scratch is counted apart
            }
            let c = class(i);
            match c {
                Class::Saved => saved_all += pb.bytes,
                Class::Gradient => grads_all += pb.bytes,
                Class::Temp => {}
            }
            // Live as the lower bound counts it: an in-place buffer from the step after
            // the one that hands it its storage.
            let from = pb.start + u32::from(pb.reuses.is_some());
            if from <= peak && peak < pb.end {
                let b = rounded(pb.bytes);
                match c {
                    Class::Saved => saved += b,
                    Class::Gradient => grads += b,
                    Class::Temp => temps += b,
                }
            }
        }
        let (mut parameters, mut optimizer_state, mut inputs) = (0u64, 0u64, 0u64);
        for b in &program.buffers {
            if let BufferKind::Input { name } = &b.kind {
                let bytes = b.ty.size_bytes() as u64;
                match state.get(name).map(|s| s.class) {
                    Some(StateClass::Parameter) => parameters += bytes,
                    Some(_) => optimizer_state += bytes,
                    None => inputs += bytes,
                }
            }
        }
        let workspace = match device {
            Device::Cuda => plan.workspace_bytes,
            Device::Cpu => 0,
        };
        let gemm_scratch = plan.peak_scratch_bytes;
        let fragmentation = plan.arena_bytes.saturating_sub(saved + grads + temps + gemm_scratch);
        let total = parameters
            + optimizer_state
            + inputs
            + plan.weights_bytes
            + plan.outputs_bytes
            + saved
            + grads
            + temps
            + gemm_scratch
            + fragmentation
            + workspace;
        let count = |p: Phase| phase.iter().filter(|x| **x == p).count();
        let multi = program.multi_tensor_parts();
        TrainBytes {
            parameters,
            optimizer_state,
            inputs,
            weights: plan.weights_bytes,
            outputs: plan.outputs_bytes,
            saved_activations: saved,
            gradients: grads,
            temporaries: temps,
            gemm_scratch,
            fragmentation,
            workspace,
            total,
            peak_step: peak,
            peak_phase: match phase.get(peak as usize) {
                Some(Phase::Forward) => "forward",
                Some(Phase::Backward) => "backward",
                Some(Phase::Update) => "update",
                None => "-",
            },
            saved_activations_all: saved_all,
            gradients_all: grads_all,
            forward_kernels: count(Phase::Forward),
            backward_kernels: count(Phase::Backward),
            update_kernels: count(Phase::Update),
            multi_tensor_kernels: multi.len(),
            multi_tensor_parts: multi.iter().sum(),
            state_slots: state.slots.len(),
            in_place: program.donated.len(),
        }
    }

    /// The table `graphc plan --train` prints.
    pub fn text(&self) -> String {
        let pct = |b: u64| {
            if self.total == 0 {
                0.0
            } else {
                100.0 * b as f64 / self.total as f64
            }
        };
        let row =
            |name: &str, b: u64, note: &str| format!("  {name:<22}{:>12}  {:>5.1}%  {note}\n", human_bytes(b), pct(b));
        let multi = if self.multi_tensor_kernels > 0 {
            format!(
                " ({} multi-tensor, running {} parameters' updates)",
                self.multi_tensor_kernels, self.multi_tensor_parts
            )
        } else {
            String::new()
        };
        let mut s = format!(
            "training step: {} forward, {} backward and {} update kernels{multi}; {} state slots, {} updated in place\n",
            self.forward_kernels, self.backward_kernels, self.update_kernels, self.state_slots, self.in_place
        );
        s.push_str("bytes by class (the arena's classes at its peak, step ");
        s.push_str(&format!("{}, in the {} pass):\n", self.peak_step, self.peak_phase));
        s.push_str(&row("parameters", self.parameters, "state, updated in place"));
        s.push_str(&row(
            "optimizer state",
            self.optimizer_state,
            "state: moments and the step counter",
        ));
        s.push_str(&row(
            "saved activations",
            self.saved_activations,
            &format!(
                "grows with the batch; all of the step's: {}",
                human_bytes(self.saved_activations_all)
            ),
        ));
        s.push_str(&row(
            "gradients",
            self.gradients,
            &format!(
                "each freed by its update; all of the step's: {}",
                human_bytes(self.gradients_all)
            ),
        ));
        s.push_str(&row("temporaries", self.temporaries, "grows with the batch"));
        s.push_str(&row("inputs", self.inputs, "the batch and its targets"));
        s.push_str(&row("weights", self.weights, "frozen weights and constants"));
        s.push_str(&row("outputs", self.outputs, "the loss; state not updated in place"));
        s.push_str(&row("GEMM scratch", self.gemm_scratch, ""));
        s.push_str(&row("fragmentation", self.fragmentation, "arena above its peak"));
        s.push_str(&row("workspace", self.workspace, "cuBLASLt"));
        s.push_str(&format!("  {:<22}{:>12}\n", "total", human_bytes(self.total)));
        s
    }
}
