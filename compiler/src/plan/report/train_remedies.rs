//! What would make a training step fit beyond what any plan can be told (the remedies
//! [`super::check_training_budget_for`] adds, from the step's bytes by class,
//! [`TrainBytes`]):
//!
//! - **recomputation of the layers** (`--remat auto|full`): offered when the step
//!   recomputes fewer than all of its layers, with the saved activations of the layers
//!   not recomputed yet (at the peak) as what it can free at most;
//! - **gradient accumulation** (`--accumulate N`): the batch split into N microbatches
//!   of the size whose activations fit beside the state (activations scaled linearly
//!   from this plan) and one f32 gradient sum per parameter;
//! - **sharding across GPUs** of the budget's size, as a statement: how many data-
//!   parallel GPUs ZeRO-1 (optimizer state sharded), ZeRO-2 (and the gradients) and
//!   ZeRO-3 (and the parameters) would need, each GPU running batch / GPUs of the step.

use serde::Serialize;

use super::diagnosis_text::verdict;
use super::{human_bytes, Rerun, TrainBytes};

/// Recomputing the layers not recomputed yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayersEstimate {
    /// Layers of the step (by their parameters' names), and how many are recomputed.
    pub layers: usize,
    pub recomputed: usize,
    /// Saved activations at the peak of the layers kept (what recomputing them could
    /// free, less each layer's input, which stays).
    pub kept_layers_bytes: u64,
    pub total_after_bytes: u64,
}

/// A smaller microbatch, gradients summed over `steps` of them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccumulateEstimate {
    pub dim: String,
    pub batch: usize,
    pub microbatch: usize,
    pub steps: usize,
    /// The gradients' sums the accumulation holds (f32, one per parameter element).
    pub sums_bytes: u64,
    pub total_after_bytes: u64,
}

/// Data-parallel sharding of the step's state (a statement: graphc runs one GPU).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ShardEstimate {
    /// ZeRO stages 1, 2 and 3: the fewest GPUs of the budget's size (up to
    /// [`MAX_GPUS`]) and the bytes on each there; `None` when no count does.
    pub stages: Vec<(u8, Option<(usize, u64)>)>,
    /// Whether the activations were divided among the GPUs (a batch dimension is
    /// known) or each GPU runs the whole step's activations.
    pub batch_split: bool,
}

/// The most GPUs [`ShardEstimate`] considers.
pub const MAX_GPUS: usize = 4096;

/// The batch dimension of `rerun` and its value: the dim named `batch` (or containing
/// it), else the first with a value.
fn batch_dim(rerun: &Rerun) -> Option<(String, usize)> {
    let with_value = || rerun.dims.iter().filter_map(|(n, v)| v.map(|v| (n.clone(), v)));
    with_value()
        .find(|(n, _)| n.to_ascii_lowercase().contains("batch"))
        .or_else(|| with_value().next())
}

/// The activations (what scales with the batch) of a step's bytes.
fn activations(t: &TrainBytes) -> u64 {
    t.saved_activations + t.temporaries + t.inputs + t.gemm_scratch + t.fragmentation + t.outputs
}

/// Recomputing the layers not recomputed yet; `None` when there are none or all are.
/// `layers` 0: not counted (no recomputation ran), so those holding saved activations.
pub fn layers(t: &TrainBytes, layers: usize, recomputed: usize) -> Option<LayersEstimate> {
    let layers = if layers == 0 {
        t.saved_by_layer.iter().filter(|(l, _)| l != "other").count()
    } else {
        layers
    };
    if layers == 0 || recomputed >= layers {
        return None;
    }
    let per_layer = t.saved_by_layer.iter().filter(|(l, _)| l != "other").map(|(_, b)| *b);
    let kept_layers_bytes: u64 = per_layer.clone().sum();
    // One layer's values are made again at a time, during its backward.
    let again = per_layer.max().unwrap_or(0);
    Some(LayersEstimate {
        layers,
        recomputed,
        kept_layers_bytes,
        total_after_bytes: t.total.saturating_sub(kept_layers_bytes).saturating_add(again),
    })
}

/// The microbatch whose activations fit beside the state, the gradient sums included:
/// the largest divisor of the batch under the linear estimate. `None` without a batch
/// dimension, or when even a microbatch of 1 would not fit.
pub fn accumulate(t: &TrainBytes, budget: u64, rerun: &Rerun, sums_bytes: u64) -> Option<AccumulateEstimate> {
    let (dim, batch) = batch_dim(rerun)?;
    if batch < 2 {
        return None;
    }
    let act = activations(t);
    // Already accumulating: the sums are in the total.
    let sums = if t.accumulated > 0 { 0 } else { sums_bytes };
    let fixed = t.total.saturating_sub(act).saturating_add(sums);
    let room = budget.checked_sub(fixed)?;
    let per_row = act.div_ceil(batch as u64).max(1);
    let rows = usize::try_from(room / per_row).unwrap_or(usize::MAX).min(batch - 1);
    let microbatch = (1..=rows).rev().find(|d| batch % d == 0)?;
    let steps = batch / microbatch;
    Some(AccumulateEstimate {
        dim,
        batch,
        microbatch,
        steps,
        sums_bytes: sums,
        total_after_bytes: fixed.saturating_add(per_row.saturating_mul(microbatch as u64)),
    })
}

/// How many GPUs each ZeRO stage would need.
pub fn shard(t: &TrainBytes, budget: u64, rerun: &Rerun) -> ShardEstimate {
    let batch = batch_dim(rerun).map(|(_, b)| b);
    let act = activations(t);
    let per_gpu = |stage: u8, k: u64| -> u64 {
        let shard = |b: u64, on: bool| if on { b.div_ceil(k) } else { b };
        let act_k = match batch {
            Some(b) => {
                let rows = (b as u64).div_ceil(k).max(1);
                act.saturating_mul(rows) / (b as u64).max(1)
            }
            None => act,
        };
        shard(t.optimizer_state, stage >= 1)
            + shard(t.gradients + t.accumulated, stage >= 2)
            + shard(t.parameters, stage >= 3)
            + t.loss_scale
            + t.weights
            + t.workspace
            + act_k
    };
    let stages = (1u8..=3)
        .map(|stage| {
            // The bytes only fall with more GPUs: the first count that fits, by
            // doubling then bisection.
            let fits = |k: u64| per_gpu(stage, k) <= budget;
            let max = MAX_GPUS as u64;
            let mut hi = 2u64;
            while hi < max && !fits(hi) {
                hi *= 2;
            }
            let hi = hi.min(max);
            if !fits(hi) {
                return (stage, None);
            }
            let mut lo = hi / 2; // does not fit (or is 1)
            if lo >= 2 && fits(lo) {
                lo = 1;
            }
            let mut hi = hi;
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if fits(mid) {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            (stage, Some((hi as usize, per_gpu(stage, hi))))
        })
        .collect();
    ShardEstimate {
        stages,
        batch_split: batch.is_some(),
    }
}

impl LayersEstimate {
    pub(super) fn text(&self, budget: u64, rerun: &Rerun) -> String {
        let now = if self.recomputed == 0 {
            "no layer is".to_string()
        } else {
            format!("{} of {} layers are", self.recomputed, self.layers)
        };
        format!(
            "recomputing the layers in the backward (gradient checkpointing): {now} recomputed now; \
             `{}` keeps only each layer's input and frees up to {} of saved activations at the peak, \
             less one layer's made again in its backward (total about {}: {}; `--remat auto` recomputes \
             the fewest layers that fit)",
            rerun.with("--remat", "full"),
            human_bytes(self.kept_layers_bytes),
            human_bytes(self.total_after_bytes),
            verdict(self.total_after_bytes, budget)
        )
    }
}

impl AccumulateEstimate {
    pub(super) fn text(&self, budget: u64, rerun: &Rerun) -> String {
        let sums = if self.sums_bytes > 0 {
            format!(" plus the gradients' sums ({})", human_bytes(self.sums_bytes))
        } else {
            String::new()
        };
        format!(
            "gradient accumulation: {dim}={} as {} microbatches of {} (`--dim {dim}={} --accumulate {}`), one \
             update on their summed gradients: the activations of one microbatch{sums}, total about {} ({}); \
             `{}` finds the largest microbatch",
            self.batch,
            self.steps,
            self.microbatch,
            self.microbatch,
            self.steps,
            human_bytes(self.total_after_bytes),
            verdict(self.total_after_bytes, budget),
            rerun.fit(
                &self.dim,
                &format!("{}B", budget),
                Some(("--accumulate", &self.steps.to_string()))
            ),
            dim = self.dim,
        )
    }
}

impl ShardEstimate {
    pub(super) fn text(&self, budget: u64) -> String {
        let stage = |s: u8| match s {
            1 => "ZeRO-1 (optimizer state sharded)",
            2 => "ZeRO-2 (and the gradients)",
            _ => "ZeRO-3 (and the parameters)",
        };
        let parts: Vec<String> = self
            .stages
            .iter()
            .map(|(s, n)| match n {
                Some((1, bytes)) => format!("{} 1 GPU ({})", stage(*s), human_bytes(*bytes)),
                Some((k, bytes)) => format!("{} {k} GPUs ({} each)", stage(*s), human_bytes(*bytes)),
                None => format!("{} more than {MAX_GPUS} GPUs", stage(*s)),
            })
            .collect();
        let split = if self.batch_split {
            "each running its share of the batch"
        } else {
            "each running the whole step's activations (no batch dimension to divide)"
        };
        format!(
            "sharding across GPUs of {} (a statement, not a run: graphc plans one GPU), data-parallel, {split}: {}",
            human_bytes(budget),
            parts.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(params: u64, opt: u64, act: u64) -> TrainBytes {
        TrainBytes {
            parameters: params,
            optimizer_state: opt,
            loss_scale: 0,
            accumulated: 0,
            inputs: 0,
            weights: 0,
            outputs: 0,
            saved_activations: act / 2,
            gradients: 0,
            temporaries: act - act / 2,
            gemm_scratch: 0,
            fragmentation: 0,
            workspace: 0,
            total: params + opt + act,
            peak_step: 0,
            peak_phase: "backward",
            saved_by_layer: vec![("h.0".into(), act / 4), ("h.1".into(), act / 4)],
            saved_activations_all: act,
            gradients_all: 0,
            forward_kernels: 0,
            backward_kernels: 0,
            update_kernels: 0,
            multi_tensor_kernels: 0,
            multi_tensor_parts: 0,
            state_slots: 0,
            in_place: 0,
        }
    }

    /// 100 parameter bytes, 200 of optimizer state, 800 of activations at batch 8,
    /// budget 700: microbatches of 4 (400 + 300 + 100 of sums = 800 > 700) do not fit,
    /// of 2 (200 + 400 = 600) do.
    #[test]
    fn accumulation_takes_the_largest_microbatch_dividing_the_batch() {
        let t = bytes(100, 200, 800);
        let rerun = Rerun {
            dims: vec![("batch".into(), Some(8)), ("seq".into(), Some(16))],
            ..Rerun::default()
        };
        let a = accumulate(&t, 700, &rerun, 100).unwrap();
        assert_eq!((a.microbatch, a.steps, a.total_after_bytes), (2, 4, 600));
        assert!(a.text(700, &rerun).contains("--dim batch=2 --accumulate 4"));
        // Without room for even the sums: none.
        assert_eq!(accumulate(&t, 350, &rerun, 100), None);
        // Without a batch dim: none.
        assert_eq!(accumulate(&t, 700, &Rerun::default(), 100), None);
    }

    /// ZeRO-1 shards the optimizer state only; ZeRO-3 everything: more GPUs for the
    /// former, the activations divided among them.
    #[test]
    fn sharding_needs_fewer_gpus_at_higher_stages() {
        let t = bytes(400, 800, 800);
        let rerun = Rerun {
            dims: vec![("batch".into(), Some(8))],
            ..Rerun::default()
        };
        let s = shard(&t, 1000, &rerun);
        // ZeRO-1: 400 + 800/k + 800/k <= 1000 -> k = 3 (400 + 267 + 300 = 967).
        assert_eq!(s.stages[0].1.map(|x| x.0), Some(3));
        // ZeRO-3: (400 + 800)/k + 800·ceil(8/k)/8 <= 1000 -> k = 2 (600 + 400).
        assert_eq!(s.stages[2].1, Some((2, 1000)));
        assert!(s.text(1000).contains("ZeRO-3 (and the parameters) 2 GPUs"));
        // The parameters alone over the budget: ZeRO-1 never fits.
        let s = shard(&bytes(2000, 10, 10), 1000, &rerun);
        assert_eq!(s.stages[0].1, None);
        assert!(s.stages[2].1.is_some());
    }

    #[test]
    fn layers_are_offered_until_all_are_recomputed() {
        let t = bytes(100, 200, 800);
        let l = layers(&t, 2, 0).unwrap();
        assert_eq!((l.kept_layers_bytes, l.total_after_bytes), (400, 900));
        assert!(l.text(800, &Rerun::default()).contains("--remat full"));
        assert_eq!(layers(&t, 2, 2), None);
        // Not counted: the layers holding saved activations.
        assert_eq!(layers(&t, 0, 0).map(|l| l.layers), Some(2));
        let mut none = t.clone();
        none.saved_by_layer.clear();
        assert_eq!(layers(&none, 0, 0), None);
    }
}
