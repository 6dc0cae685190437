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
    /// Dynamic loss scaling's scale and growth tracker (fp16).
    pub loss_scale: u64,
    /// Gradient accumulation: the gradients' sums over the microbatches and the
    /// microbatch counter (state).
    pub accumulated: u64,
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
    /// The saved activations at the peak by layer (`h.3`, `layers.11`, ... from the
    /// buffers' names, else the parameters their writer reads; `other` for the
    /// rest: embeddings, the head, the loss), in layer order.
    pub saved_by_layer: Vec<(String, u64)>,
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
        let phase = phases(program, &writer, &state_names);
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
        let layer_of_kernel = kernel_layers(program, &phase, &state_names);
        let align = plan.align.max(1);
        let rounded = |b: u64| b.div_ceil(align).saturating_mul(align);
        let (mut saved, mut grads, mut temps) = (0u64, 0u64, 0u64);
        let mut by_layer: Vec<(String, u64)> = Vec::new();
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
                    Class::Saved => {
                        saved += b;
                        let layer = program.buffers[i]
                            .name
                            .as_deref()
                            .and_then(layer_of)
                            .or_else(|| writer[i].and_then(|k| layer_of_kernel[k].clone()))
                            .unwrap_or_else(|| "other".to_string());
                        match by_layer.iter_mut().find(|(l, _)| *l == layer) {
                            Some((_, n)) => *n += b,
                            None => by_layer.push((layer, b)),
                        }
                    }
                    Class::Gradient => grads += b,
                    Class::Temp => temps += b,
                }
            }
        }
        // Layers in their order (`h.2` before `h.10`), `other` last.
        by_layer.sort_by_key(|(l, _)| {
            let (head, n) = l.rsplit_once('.').unwrap_or((l.as_str(), ""));
            (l == "other", head.to_string(), n.parse::<u64>().unwrap_or(0))
        });
        let (mut parameters, mut optimizer_state, mut loss_scale, mut inputs) = (0u64, 0u64, 0u64, 0u64);
        let mut accumulated = 0u64;
        for b in &program.buffers {
            if let BufferKind::Input { name } = &b.kind {
                let bytes = b.ty.size_bytes() as u64;
                match state.get(name).map(|s| s.class) {
                    Some(StateClass::Parameter) => parameters += bytes,
                    Some(StateClass::LossScale) => loss_scale += bytes,
                    Some(StateClass::Accumulator) => accumulated += bytes,
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
            + loss_scale
            + accumulated
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
            loss_scale,
            accumulated,
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
            saved_by_layer: by_layer,
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

    /// The classes in the order of the table: (name, bytes), adding up to `total`.
    pub fn classes(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("parameters", self.parameters),
            ("optimizer state", self.optimizer_state),
            ("loss scale", self.loss_scale),
            ("accumulated gradients", self.accumulated),
            ("saved activations", self.saved_activations),
            ("gradients", self.gradients),
            ("temporaries", self.temporaries),
            ("inputs", self.inputs),
            ("weights", self.weights),
            ("outputs", self.outputs),
            ("GEMM scratch", self.gemm_scratch),
            ("fragmentation", self.fragmentation),
            ("workspace", self.workspace),
        ]
    }

    /// The saved activations by layer in one line: runs of layers of equal bytes
    /// collapsed (`h.0..h.23: 24 x 35.7 MB`), then `other`.
    fn layers_text(&self) -> Option<String> {
        let layers: Vec<&(String, u64)> = self.saved_by_layer.iter().filter(|(l, _)| l != "other").collect();
        if layers.is_empty() {
            return None;
        }
        let mut parts = Vec::new();
        let mut i = 0;
        while i < layers.len() {
            let mut j = i + 1;
            while j < layers.len() && layers[j].1 == layers[i].1 {
                j += 1;
            }
            parts.push(if j - i == 1 {
                format!("{} {}", layers[i].0, human_bytes(layers[i].1))
            } else {
                format!(
                    "{}..{} {} x {}",
                    layers[i].0,
                    layers[j - 1].0,
                    j - i,
                    human_bytes(layers[i].1)
                )
            });
            i = j;
        }
        if let Some((_, b)) = self.saved_by_layer.iter().find(|(l, _)| l == "other") {
            parts.push(format!("other {}", human_bytes(*b)));
        }
        Some(format!("by layer: {}", parts.join(", ")))
    }

    /// What changes from this plan (at `here`) to `next` (at `there`), class by class:
    /// the classes that grow with the dimension, and by how much.
    pub fn growth_text(&self, next: &TrainBytes, here: &str, there: &str) -> String {
        let mut s = format!(
            "from {here} to {there}: total {} -> {} (+{})\n",
            human_bytes(self.total),
            human_bytes(next.total),
            human_bytes(next.total.saturating_sub(self.total))
        );
        for ((name, a), (_, b)) in self.classes().into_iter().zip(next.classes()) {
            if a != b {
                let sign = if b >= a { "+" } else { "-" };
                s.push_str(&format!(
                    "  {name:<22}{:>12} -> {:>12}  {sign}{}\n",
                    human_bytes(a),
                    human_bytes(b),
                    human_bytes(a.abs_diff(b))
                ));
            }
        }
        s
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
        if self.loss_scale > 0 {
            s.push_str(&row(
                "loss scale",
                self.loss_scale,
                "state: the scale and its growth tracker",
            ));
        }
        if self.accumulated > 0 {
            s.push_str(&row(
                "accumulated gradients",
                self.accumulated,
                "state: the gradients' sums over the microbatches",
            ));
        }
        s.push_str(&row(
            "saved activations",
            self.saved_activations,
            &format!(
                "grows with the batch; all of the step's: {}",
                human_bytes(self.saved_activations_all)
            ),
        ));
        if let Some(layers) = self.layers_text() {
            s.push_str(&format!("  {:<22}{layers}\n", ""));
        }
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

/// Each kernel's pass: forward (what the `loss` output depends on), update (writes a
/// state output), else backward.
fn phases(program: &Program, writer: &[Option<usize>], state_names: &HashSet<&str>) -> Vec<Phase> {
    let nk = program.kernels.len();
    let mut phase = vec![Phase::Backward; nk];
    let mut stack: Vec<usize> = program
        .outputs
        .iter()
        .filter(|(n, _)| n == "loss")
        .filter_map(|(_, b)| writer.get(b.index()).copied().flatten())
        .collect();
    while let Some(k) = stack.pop() {
        if std::mem::replace(&mut phase[k], Phase::Forward) == Phase::Forward {
            continue;
        }
        for b in program.kernels[k].reads() {
            if let Some(w) = writer.get(b.index()).copied().flatten() {
                stack.push(w);
            }
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
    phase
}

/// The layer of each forward kernel: that of the parameters it reads (their names
/// place them: `m.transformer.h.3.attn.c_attn.weight`; `other` for a parameter of no
/// layer: embeddings, the final norm, the head), else that of the forward kernel
/// before it.
fn kernel_layers(program: &Program, phase: &[Phase], state_names: &HashSet<&str>) -> Vec<Option<String>> {
    let mut layers: Vec<Option<String>> = vec![None; program.kernels.len()];
    let mut current: Option<String> = None;
    for (k, kernel) in program.kernels.iter().enumerate() {
        if phase[k] != Phase::Forward {
            continue;
        }
        let read = kernel
            .reads()
            .into_iter()
            .find_map(|b| match &program.buffers.get(b.index())?.kind {
                BufferKind::Input { name } if state_names.contains(name.as_str()) => {
                    Some(layer_of(name).unwrap_or_else(|| "other".to_string()))
                }
                _ => None,
            });
        if read.is_some() {
            current = read;
        }
        layers[k] = current.clone();
    }
    layers
}

/// A layer's place in the model's order, from [`layer_of`]'s name: `N` of `h.N`, and
/// `K * 1000 + M` of a ResNet stage's block `layerK.M`.
pub(crate) fn layer_index(layer: &str) -> Option<usize> {
    let (head, n) = layer.rsplit_once('.')?;
    let n: usize = n.parse().ok()?;
    let stage = head
        .strip_prefix("layer")
        .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()));
    match stage {
        Some(stage) => stage.parse::<usize>().ok()?.checked_mul(1000)?.checked_add(n),
        None => Some(n),
    }
}

/// The layer a buffer's name places it in: the first `NAME.N` / `NAME_N` / `NAME/N`
/// path component whose NAME is a layer list's (`h`, `layer`, `layers`, `block`,
/// `blocks`), as exporters name a module list's members (`/m/transformer/h.3/attn/..`).
pub(crate) fn layer_of(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split(['/', ':']).collect();
    for (k, part) in parts.iter().enumerate() {
        let lowered = part.trim_start_matches(['.', '_']);
        let mut split = lowered.split(['.', '_']);
        while let Some(head) = split.next() {
            // torchvision's ResNets: stage `layerK`, block `M` (`m.layer3.4.conv1`).
            if let Some(stage) = head
                .strip_prefix("layer")
                .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
            {
                if let Some(n) = split
                    .clone()
                    .next()
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                {
                    return Some(format!("layer{stage}.{n}"));
                }
            }
            if matches!(head, "h" | "layer" | "layers" | "block" | "blocks") {
                if let Some(n) = split
                    .clone()
                    .next()
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                {
                    return Some(format!("{head}.{n}"));
                }
                // `layers/3`
                if let Some(n) = parts
                    .get(k + 1)
                    .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                {
                    return Some(format!("{head}.{n}"));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::layer_of;

    #[test]
    fn layers_are_found_in_exported_names() {
        assert_eq!(layer_of("/m/transformer/h.3/attn/Add").as_deref(), Some("h.3"));
        assert_eq!(layer_of("m.model.layers.11.mlp.up_proj").as_deref(), Some("layers.11"));
        assert_eq!(layer_of("node_layers_2_self_attn").as_deref(), Some("layers.2"));
        assert_eq!(layer_of("/encoder/layer/0/output").as_deref(), Some("layer.0"));
        assert_eq!(layer_of("backward/h.5/x").as_deref(), Some("h.5"));
        assert_eq!(layer_of("/m/transformer/wte/Gather"), None);
        assert_eq!(layer_of("hidden.x"), None);
        assert_eq!(layer_of("m.layer3.4.conv1.weight").as_deref(), Some("layer3.4"));
        assert_eq!(super::layer_index("layer3.4"), Some(3004));
        assert_eq!(super::layer_index("h.7"), Some(7));
        assert_eq!(super::layer_index("layers.11"), Some(11));
    }
}
