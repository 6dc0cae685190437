//! The text of a [`Diagnosis`]: the breakdown, the peak and its tensors, and each
//! [`Remedy`] in words with its estimate and the command that applies it.

use std::fmt::{self, Write};

use super::diagnosis::{
    Breakdown, Diagnosis, DimEstimate, PeakReport, PrecisionEstimate, QuantEstimate, RecomputeEstimate, Remat, Remedy,
};
use super::{budget_arg, display_name, human_bytes, live_words, plural, size_row, table, Rerun};

/// `fits, N to spare` or `still over by N`.
pub(super) fn verdict(total: u64, budget: u64) -> String {
    if total <= budget {
        format!("fits, {} to spare", human_bytes(budget - total))
    } else {
        format!("still over by {}", human_bytes(total - budget))
    }
}

impl Breakdown {
    fn render(&self, f: &mut String) {
        let weights_note = if self.weights_by_dtype.len() > 1 {
            self.weights_by_dtype
                .iter()
                .map(|d| format!("{} {}", d.dtype.name(), human_bytes(d.bytes)))
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            self.weights_by_dtype
                .first()
                .map_or(String::new(), |d| format!("all {}", d.dtype.name()))
        };
        let rows = vec![
            size_row("weights", self.weights_bytes, weights_note),
            size_row(
                "arena",
                self.arena_bytes,
                format!(
                    "{}; lower bound {}",
                    plural(self.intermediates, "intermediate", "intermediates"),
                    human_bytes(self.lower_bound_bytes)
                ),
            ),
            size_row(
                "inputs",
                self.inputs_bytes,
                if self.state_bytes > 0 {
                    format!(
                        "of which the training state (parameters, optimizer state) {}: fixed",
                        human_bytes(self.state_bytes)
                    )
                } else {
                    String::new()
                },
            ),
            size_row("outputs", self.outputs_bytes, String::new()),
            size_row(
                "workspace",
                self.workspace_bytes,
                if self.workspace_bytes > 0 {
                    "cuBLASLt".into()
                } else {
                    String::new()
                },
            ),
            size_row("total", self.total_bytes, String::new()),
        ];
        f.push_str(&table("  ", &rows, &[false, true, true, false]));
    }
}

impl PeakReport {
    /// The peak line, then its tensors (the top 8, the GEMM scratch, then a count).
    fn render(&self, f: &mut String) {
        // The same words as the summary's peak line (the count covers the scratch row).
        let _ = writeln!(
            f,
            "peak: step {} of {}, kernel {} ({}): {} live in the arena, {}",
            self.step,
            self.kernels,
            self.kernel,
            self.kind,
            live_words(self.tensors.len(), self.scratch_bytes),
            human_bytes(self.bytes)
        );
        const TOP: usize = 8;
        let mut rows: Vec<Vec<String>> = self
            .tensors
            .iter()
            .take(TOP)
            .map(|t| {
                vec![
                    display_name(&t.name).to_string(),
                    format!("b{}", t.buffer.0),
                    format!("{} ({})", t.kernel, t.op),
                    human_bytes(t.bytes),
                    format!("{} B", t.bytes),
                ]
            })
            .collect();
        if self.scratch_bytes > 0 {
            rows.push(vec![
                "(GEMM scratch)".into(),
                "-".into(),
                format!("{} ({})", self.kernel, self.kind),
                human_bytes(self.scratch_bytes),
                format!("{} B", self.scratch_bytes),
            ]);
        }
        f.push_str(&table("  ", &rows, &[false, false, false, true, true]));
        if let Some(rest) = self.tensors.get(TOP..).filter(|r| !r.is_empty()) {
            let _ = writeln!(
                f,
                "  and {} more totalling {}",
                rest.len(),
                human_bytes(rest.iter().map(|t| t.bytes).fold(0, u64::saturating_add))
            );
        }
    }
}

impl Remedy {
    /// The remedy in words (one line), its estimate against `budget` and the command
    /// that applies it (from `rerun`); `low_precision`: the program is in bf16/fp16
    /// already (see [`Diagnosis::low_precision`]), so the weights can only shrink by
    /// quantization.
    pub fn text(&self, budget: u64, low_precision: bool, rerun: &Rerun) -> String {
        let shrink = if low_precision {
            "quantization"
        } else {
            "bf16/fp16, quantization"
        };
        match self {
            Remedy::WeightsExceedBudget { weights_bytes } => format!(
                "the weights alone ({}) exceed the budget ({}): no activation remedy (a smaller batch or \
                 sequence, recomputation) can help; the weights themselves must shrink ({shrink}) \
                 or be split across devices",
                human_bytes(*weights_bytes),
                human_bytes(budget)
            ),
            Remedy::WorkspaceExceedsBudget {
                workspace_bytes,
                weights_bytes,
                quantized_gemms_need_none,
            } => format!(
                "the cuBLASLt workspace the GEMMs reserve ({}) alone exceeds the budget ({}): no activation \
                 remedy on its own (a smaller batch or sequence, bf16, recomputation) can help; {}",
                human_bytes(*workspace_bytes),
                human_bytes(budget),
                if *quantized_gemms_need_none {
                    "int8 or int4 weights (below) make every GEMM a generated kernel, which needs no workspace"
                        .to_string()
                } else {
                    format!(
                        "the budget must cover the workspace plus the weights ({}) and activations",
                        human_bytes(*weights_bytes)
                    )
                }
            ),
            Remedy::FixedExceedBudget {
                weights_bytes,
                workspace_bytes,
            } => format!(
                "the weights ({}) and the cuBLASLt workspace ({}) together exceed the budget ({}): no \
                 activation remedy (a smaller batch or sequence, recomputation) can help; the weights must shrink \
                 ({shrink}) or the budget grow",
                human_bytes(*weights_bytes),
                human_bytes(*workspace_bytes),
                human_bytes(budget)
            ),
            Remedy::SmallerDim(e) => e.text(budget, rerun),
            Remedy::LowerPrecision(e) => e.text(budget, rerun),
            Remedy::Recompute(e) => e.text(budget),
            Remedy::QuantizeWeights(e) => e.text(budget, rerun),
            Remedy::Freeze(e) => e.text(budget, rerun),
            Remedy::RecomputeLayers(e) => e.text(budget, rerun),
            Remedy::Accumulate(e) => e.text(budget, rerun),
            Remedy::Shard(e) => e.text(budget),
        }
    }
}

impl DimEstimate {
    fn text(&self, budget: u64, rerun: &Rerun) -> String {
        let estimate = if self.fits_percent == 0 {
            "even if they scale linearly, less than 1% of the current size fits".to_string()
        } else {
            format!(
                "if they scale linearly, about {}% of the current size fits",
                self.fits_percent
            )
        };
        let with = self.with_weights.map(|b| format!("int{b}"));
        let together = with
            .as_ref()
            .map_or(String::new(), |w| format!(" together with {w} weights"));
        match &self.dim {
            None => format!(
                "a smaller batch or sequence length{together}: activations (arena, inputs, outputs: {}) scale \
                 with them; {estimate}; this model's shapes are static, so that means re-exporting it smaller or \
                 with a symbolic dimension",
                human_bytes(self.activations_bytes)
            ),
            Some(name) => format!(
                "a smaller {name}{together}: activations (arena, inputs, outputs: {}) scale with it; {estimate}; \
                 `{}` finds the largest {name} that fits",
                human_bytes(self.activations_bytes),
                rerun.fit(name, &budget_arg(budget), with.as_deref().map(|w| ("--weights", w)))
            ),
        }
    }
}

impl PrecisionEstimate {
    fn text(&self, budget: u64, rerun: &Rerun) -> String {
        format!(
            "bf16/fp16 instead of f32 (`{}`): weights in f32 {} of {}, intermediates in f32 at \
             the peak {} of {}, inputs and outputs in f32 {}; halving them saves about {} (total about {}: {})",
            rerun.with("--precision", "bf16"),
            human_bytes(self.f32_weights_bytes),
            human_bytes(self.weights_bytes),
            human_bytes(self.peak_f32_bytes),
            human_bytes(self.peak_bytes),
            human_bytes(self.f32_io_bytes),
            human_bytes(self.saves_bytes),
            human_bytes(self.total_after_bytes),
            verdict(self.total_after_bytes, budget)
        )
    }
}

impl super::diagnosis::FreezeEstimate {
    fn text(&self, budget: u64, rerun: &Rerun) -> String {
        let stored = if self.parameter_bytes_saved > 0 {
            format!(
                " and stores them as frozen weights in the low type ({})",
                human_bytes(self.parameter_bytes_saved)
            )
        } else {
            String::new()
        };
        format!(
            "freezing {} (`{}`: {}, {} elements) drops their gradients and optimizer state ({}){stored}: \
             saves about {} (total about {}: {})",
            self.what,
            rerun.with("--freeze", &self.regex),
            plural(self.parameters.len(), "parameter", "parameters"),
            self.elements,
            human_bytes(self.optimizer_state_bytes),
            human_bytes(self.saves_bytes),
            human_bytes(self.total_after_bytes),
            verdict(self.total_after_bytes, budget)
        )
    }
}

impl QuantEstimate {
    fn text(&self, budget: u64, rerun: &Rerun) -> String {
        format!(
            "int{b} weights (`{}`, weight-only, round to nearest): the {} the GEMMs read ({}) would take \
             about {}{}, saving {} (total about {}: {})",
            rerun.with("--weights", &format!("int{}", self.bits)),
            plural(self.matrices, "weight matrix", "weight matrices"),
            human_bytes(self.matrix_bytes),
            human_bytes(self.matrix_after_bytes),
            if self.workspace_bytes > 0 {
                format!(
                    " and the GEMMs need no cuBLASLt workspace ({})",
                    human_bytes(self.workspace_bytes)
                )
            } else {
                String::new()
            },
            human_bytes(self.saves_bytes),
            human_bytes(self.total_after_bytes),
            verdict(self.total_after_bytes, budget),
            b = self.bits,
        )
    }
}

impl RecomputeEstimate {
    fn text(&self, budget: u64) -> String {
        let named: Vec<String> = self.tensors.iter().take(5).map(Remat::text).collect();
        format!(
            "recomputation (rematerialization): {} produced by cheap kernels and idle across the peak; \
             recomputing each just before its next read frees about {} at the peak (total about {}: {}): \
             {}{}",
            plural(self.tensors.len(), "tensor", "tensors"),
            human_bytes(self.frees_bytes),
            human_bytes(self.total_after_bytes),
            verdict(self.total_after_bytes, budget),
            named.join("; "),
            if self.tensors.len() > 5 {
                format!("; and {} more", self.tensors.len() - 5)
            } else {
                String::new()
            }
        )
    }
}

impl Remat {
    /// `name (b3, 2.00 KiB by k9_ew (elementwise) at step 9, next read at step 25)`: its
    /// bytes as in the peak table, and what it frees when operands must stay live.
    fn text(&self) -> String {
        let kept = if self.kept_bytes > 0 {
            format!(
                "; its operands ({}) would stay live instead: frees {}",
                human_bytes(self.kept_bytes),
                human_bytes(self.frees_bytes)
            )
        } else {
            String::new()
        };
        format!(
            "{} (b{}, {} by {} ({}) at step {}, next read at step {}{kept})",
            display_name(&self.name),
            self.buffer.0,
            human_bytes(self.bytes),
            self.kernel,
            self.kind,
            self.produced,
            self.next_read
        )
    }
}

impl fmt::Display for Diagnosis {
    /// [`Diagnosis::text`] for a library caller ([`Rerun::default`]: `MODEL` in the
    /// commands).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text(&Rerun::default()))
    }
}

impl Diagnosis {
    /// The diagnosis as text: by how much, the breakdown, the peak and its tensors,
    /// then what would help, each remedy with its command (written from `rerun`).
    pub fn text(&self, rerun: &Rerun) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "the model needs {} ({} B) but the budget is {} ({} B): over by {} ({} B)",
            human_bytes(self.total_bytes),
            self.total_bytes,
            human_bytes(self.budget_bytes),
            self.budget_bytes,
            human_bytes(self.over_by),
            self.over_by
        );
        self.breakdown.render(&mut s);
        match &self.peak {
            Some(peak) => peak.render(&mut s),
            None => {
                let _ = writeln!(s, "peak: the arena is empty (nothing to shrink there)");
            }
        }
        let _ = writeln!(s, "what would help:");
        for r in &self.remedies {
            let _ = writeln!(s, "  - {}", r.text(self.budget_bytes, self.low_precision, rerun));
        }
        s
    }
}
