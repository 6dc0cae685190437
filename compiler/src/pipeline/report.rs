//! What the pipeline's stages report, as typed values ([`PassReport`], [`PassDetail`]),
//! and their text, rendered only where it is shown (the `Display` impls).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::passes::precision::Precision;
use crate::plan::{Scheduler, Strategy};

/// A stage of the pipeline. Displayed (and serialized) as its lowercase name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    /// Training, stage 1: trainable parameters become state (`train::make_state`).
    State,
    /// Training, stage 2: loss, reverse-mode gradients and the optimizer's update
    /// (`train::build_step`).
    Autodiff,
    Dce,
    Precision,
    Optimize,
    /// Weight-only quantization (`passes::quantize`, `--weights int8|int4`).
    Quantize,
    /// A shape family's optimized graph written out at one value of its dimension
    /// (`pipeline::family`): the front half of a compile without importing or
    /// optimizing again.
    Specialize,
    Fuse,
    Plan,
    /// CUDA C generation (`pipeline::generate_kernels`).
    Codegen,
    /// NVRTC compilation of the generated kernels (`pipeline::build`).
    Build,
}

impl Pass {
    /// The lowercase name: `dce`, `precision`, `optimize`, `fuse`, `plan`, `codegen`,
    /// `build`.
    pub fn name(self) -> &'static str {
        match self {
            Pass::State => "state",
            Pass::Autodiff => "autodiff",
            Pass::Dce => "dce",
            Pass::Precision => "precision",
            Pass::Optimize => "optimize",
            Pass::Quantize => "quantize",
            Pass::Specialize => "specialize",
            Pass::Fuse => "fuse",
            Pass::Plan => "plan",
            Pass::Codegen => "codegen",
            Pass::Build => "build",
        }
    }

    /// What `nodes_before` and `nodes_after` of this pass count.
    pub fn units(self) -> (&'static str, &'static str) {
        match self {
            Pass::Fuse => ("nodes", "kernels"),
            Pass::Plan => ("kernels", "arena buffers"),
            Pass::Codegen | Pass::Build => ("kernels", "kernels"),
            Pass::State
            | Pass::Autodiff
            | Pass::Dce
            | Pass::Precision
            | Pass::Optimize
            | Pass::Quantize
            | Pass::Specialize => ("nodes", "nodes"),
        }
    }
}

impl fmt::Display for Pass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one pass did.
#[derive(Clone, Debug, Serialize)]
pub struct PassReport {
    pub pass: Pass,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub time: Duration,
    /// What the pass reports besides the counts, in the order shown.
    pub details: Vec<PassDetail>,
}

/// `fuse: 40 nodes -> 12 kernels in 0.31 ms; 12 launches instead of ...`: the counts,
/// the time and every detail after a `; `.
impl fmt::Display for PassReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (before, after) = self.pass.units();
        write!(
            f,
            "{}: {} {before} -> {} {after} in {:.2} ms",
            self.pass,
            self.nodes_before,
            self.nodes_after,
            self.time.as_secs_f64() * 1e3
        )?;
        for d in &self.details {
            write!(f, "; {d}")?;
        }
        Ok(())
    }
}

/// One fact a pass reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PassDetail {
    /// dce: weights no node reads any more.
    UnusedWeightsDropped(Vec<String>),
    /// precision: how the compute nodes were split between the low type and f32.
    Precision {
        precision: Precision,
        low_nodes: usize,
        f32_nodes: usize,
        casts: usize,
    },
    /// optimize: the e-graph run.
    Optimize {
        constants_folded: usize,
        rule_applications: usize,
        iterations: usize,
        stop_reason: String,
    },
    /// quantize: how many weight matrices were quantized, to what, and their bytes.
    Quantized {
        weights: usize,
        bits: usize,
        bytes_before: u64,
        bytes_after: u64,
    },
    /// state: trainable parameters made state, their elements, float weights frozen.
    State {
        parameters: usize,
        elements: u64,
        frozen: usize,
    },
    /// autodiff: the loss and optimizer, the forward values the backward reads, and
    /// the slots of state the step updates.
    Autodiff {
        loss: String,
        optimizer: String,
        saved: usize,
        state_slots: usize,
    },
    /// optimize: weights created by constant folding.
    WeightsFolded(Vec<String>),
    /// optimize: weights the optimized graph no longer reads.
    WeightsNoLongerUsed(Vec<String>),
    /// specialize: the value the shape family's dimension took, and how many of the
    /// graph's integers (dims, shape attributes, bounds) depend on it.
    Specialized { dim: String, value: usize, integers: usize },
    /// fuse: launches and global memory traffic, fused and unfused.
    Fusion {
        launches: usize,
        unfused_kernels: usize,
        bytes: usize,
        unfused_bytes: usize,
    },
    /// plan: the kernel order chosen, its peak, and every candidate with its peak.
    Schedule {
        name: Scheduler,
        peak: u64,
        candidates: Vec<(Scheduler, u64)>,
    },
    /// plan: the arena against its lower bound.
    Arena {
        arena_bytes: u64,
        lower_bound_bytes: u64,
        ratio: f64,
        strategy: Strategy,
        in_place: usize,
        /// GEMM scratch live at the peak step (`peak_step`): part of the lower bound, not
        /// of the schedule's peak (which counts tensors only), so the two differ by it.
        #[serde(skip_serializing_if = "is_zero")]
        peak_scratch_bytes: u64,
        peak_step: u32,
    },
}

fn is_zero(b: &u64) -> bool {
    *b == 0
}

impl fmt::Display for PassDetail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PassDetail::UnusedWeightsDropped(w) => write!(f, "unused weights dropped: {}", w.join(", ")),
            PassDetail::Precision {
                precision: p,
                low_nodes,
                f32_nodes,
                casts,
            } => write!(
                f,
                "{p}: {low_nodes} nodes in {p}, {f32_nodes} kept in f32, {casts} casts (weight casts fold into {p} weights)"
            ),
            PassDetail::Optimize {
                constants_folded,
                rule_applications,
                iterations,
                stop_reason,
            } => write!(
                f,
                "{constants_folded} constants folded, {rule_applications} rule applications, {iterations} iterations, stopped: {stop_reason}"
            ),
            PassDetail::Quantized {
                weights,
                bits,
                bytes_before,
                bytes_after,
            } => write!(
                f,
                "{weights} weight matrices to int{bits}: {bytes_before} bytes -> {bytes_after} ({:.3}x)",
                *bytes_after as f64 / (*bytes_before).max(1) as f64
            ),
            PassDetail::State {
                parameters,
                elements,
                frozen,
            } => write!(
                f,
                "{parameters} trainable parameters ({elements} elements) made state, {frozen} frozen"
            ),
            PassDetail::Autodiff {
                loss,
                optimizer,
                saved,
                state_slots,
            } => write!(
                f,
                "{loss} loss, {optimizer} update; the backward reads {saved} forward values; {state_slots} state slots"
            ),
            PassDetail::Specialized { dim, value, integers } => {
                write!(f, "{dim} = {value} in {integers} integers of the shape family")
            }
            PassDetail::WeightsFolded(w) => write!(f, "weights folded: {}", w.join(", ")),
            PassDetail::WeightsNoLongerUsed(w) => write!(f, "weights no longer used: {}", w.join(", ")),
            PassDetail::Fusion {
                launches,
                unfused_kernels,
                bytes,
                unfused_bytes,
            } => write!(
                f,
                "{launches} launches instead of {unfused_kernels} unfused; {bytes} bytes of global memory traffic instead of {unfused_bytes}"
            ),
            PassDetail::Schedule { name, peak, candidates } => {
                write!(f, "schedule {name} (peak {peak} bytes; ")?;
                for (i, (n, p)) in candidates.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    write!(f, "{sep}{n} {p}")?;
                }
                f.write_str(")")
            }
            PassDetail::Arena {
                arena_bytes,
                lower_bound_bytes,
                ratio,
                strategy,
                in_place,
                peak_scratch_bytes,
                peak_step,
            } => {
                write!(
                    f,
                    "arena {arena_bytes} bytes, lower bound {lower_bound_bytes} ({ratio:.3}x, {strategy}), {in_place} in place"
                )?;
                if *peak_scratch_bytes > 0 {
                    write!(
                        f,
                        "; the lower bound includes the {peak_scratch_bytes} bytes of GEMM scratch live at step \
                         {peak_step}, which the schedule's peak (tensors only) leaves out"
                    )?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_names_display_and_serialize_alike() {
        for p in [
            Pass::State,
            Pass::Autodiff,
            Pass::Dce,
            Pass::Precision,
            Pass::Optimize,
            Pass::Fuse,
            Pass::Plan,
            Pass::Codegen,
            Pass::Build,
        ] {
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
        }
    }

    #[test]
    fn report_renders_counts_time_and_details() {
        let r = PassReport {
            pass: Pass::Plan,
            nodes_before: 3,
            nodes_after: 2,
            time: Duration::from_micros(1500),
            details: vec![
                PassDetail::Schedule {
                    name: Scheduler::Dfs,
                    peak: 64,
                    candidates: vec![(Scheduler::Program, 96), (Scheduler::Dfs, 64)],
                },
                PassDetail::Arena {
                    arena_bytes: 512,
                    lower_bound_bytes: 512,
                    ratio: 1.0,
                    strategy: Strategy::GreedySize,
                    in_place: 1,
                    peak_scratch_bytes: 0,
                    peak_step: 0,
                },
            ],
        };
        assert_eq!(
            r.to_string(),
            "plan: 3 kernels -> 2 arena buffers in 1.50 ms; schedule dfs (peak 64 bytes; program 96, dfs 64); \
             arena 512 bytes, lower bound 512 (1.000x, greedy:size), 1 in place"
        );
        let scratch = PassDetail::Arena {
            arena_bytes: 768,
            lower_bound_bytes: 768,
            ratio: 1.0,
            strategy: Strategy::Search,
            in_place: 0,
            peak_scratch_bytes: 256,
            peak_step: 2,
        };
        assert_eq!(
            scratch.to_string(),
            "arena 768 bytes, lower bound 768 (1.000x, search), 0 in place; the lower bound includes the 256 \
             bytes of GEMM scratch live at step 2, which the schedule's peak (tensors only) leaves out"
        );
    }
}
