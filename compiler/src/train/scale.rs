//! Dynamic loss scaling, with `torch.amp.GradScaler`'s semantics, as graph ops: the
//! whole of it runs on the device inside the step, with no host synchronization.
//!
//! - The loss is multiplied by the scale (state, f32, `init_scale` = 2^16 at first)
//!   and the gradients are taken of that product: small fp16 gradients do not flush
//!   to zero.
//! - `inv = f32(1 / f64(scale))` (GradScaler's `_scale.double().reciprocal().float()`);
//!   every gradient is checked for inf/NaN *as computed* (scaled) — one max of `|g|`
//!   per gradient, NaN-propagating, then one flag — and multiplied by `inv` before the
//!   optimizer reads it.
//! - On any inf/NaN the step is skipped: every state slot of the optimizer
//!   (parameters, moments, the step counter) keeps its value (`select(finite, new,
//!   old)`, inside each update kernel), as GradScaler skips `optimizer.step()`.
//! - The scale (`torch._amp_update_scale_`): on inf/NaN `scale *= backoff` (0.5) and
//!   the growth tracker (state, i32) resets; otherwise the tracker counts the step, and
//!   at `growth_interval` (2000) consecutive finite steps `scale *= growth` (2; kept
//!   when that would be inf) and the tracker resets.
//!
//! - With gradient accumulation (`--accumulate N`), the microbatches' gradients of the
//!   scaled loss are summed (each divided by N) and the N-th call checks and unscales
//!   the sums, as GradScaler's `step()` does `.grad` after N `backward()`s; the scale
//!   and the tracker change on that call only.
//!
//! The step's extra output `grad_scaler` is `[scale used, skipped (0 or 1)]`, f32.

use graphc_ir::{DType, GraphBuilder, NodeId, Shape, Tensor, TensorData, Value};

use super::{Init, State, StateClass, StateSlot, TrainError};

/// GradScaler's options (PyTorch's defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaling {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u32,
}

impl Default for LossScaling {
    fn default() -> LossScaling {
        LossScaling {
            init_scale: 65536.0,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
        }
    }
}

impl LossScaling {
    fn check(&self) -> Result<(), TrainError> {
        let bad = |what: &str, v: f64| TrainError::Invalid(format!("loss scaling: {what} {v} is not allowed"));
        let s = self.init_scale;
        if !(s.is_finite() && s > 0.0 && (s as f32).is_finite() && s as f32 > 0.0) {
            return Err(bad("initial scale", s));
        }
        if !(self.growth_factor.is_finite() && self.growth_factor > 1.0) {
            return Err(bad("growth factor (must be > 1)", self.growth_factor));
        }
        if !(self.backoff_factor > 0.0 && self.backoff_factor < 1.0) {
            return Err(bad("backoff factor (must be in (0, 1))", self.backoff_factor));
        }
        if self.growth_interval == 0 || self.growth_interval > i32::MAX as u32 {
            return Err(bad("growth interval", f64::from(self.growth_interval)));
        }
        Ok(())
    }
}

/// The state slot of the scale.
pub const SCALE: &str = "grad_scaler.scale";
/// The state slot of the growth tracker (consecutive finite steps).
pub const GROWTH_TRACKER: &str = "grad_scaler.growth_tracker";
/// The step output `[scale used, skipped]`.
pub const OUTPUT: &str = "grad_scaler";

pub(super) struct Scaler<'b> {
    b: &'b GraphBuilder,
    opts: LossScaling,
    scale: Value<'b>,
    tracker: Value<'b>,
}

impl<'b> Scaler<'b> {
    /// The scale and growth tracker as inputs of the step (their slots are added by
    /// [`Scaler::finish`], after the optimizer's).
    pub(super) fn new(b: &'b GraphBuilder, opts: &LossScaling, state: &State) -> Result<Scaler<'b>, TrainError> {
        opts.check()?;
        for name in [SCALE, GROWTH_TRACKER] {
            if state.get(name).is_some() {
                return Err(TrainError::Invalid(format!(
                    "a parameter is named \"{name}\", the loss scaler's state"
                )));
            }
        }
        Ok(Scaler {
            b,
            opts: opts.clone(),
            scale: b.input(SCALE, DType::F32, Shape::scalar()),
            tracker: b.input(GROWTH_TRACKER, DType::I32, Shape::scalar()),
        })
    }

    /// `loss * scale`, what the gradients are taken of.
    pub(super) fn scaled(&self, loss: Value<'b>) -> Value<'b> {
        loss * self.scale.cast(loss.dtype())
    }

    /// Every gradient multiplied by `1 / scale`, and whether all of them were finite
    /// (bool scalar).
    pub(super) fn unscale(&self, grads: &[NodeId]) -> Result<(Vec<NodeId>, Value<'b>), TrainError> {
        let b = self.b;
        let inv = self
            .scale
            .cast(DType::F64)
            .reciprocal()
            .cast(DType::F32)
            .named("inv_scale");
        let mut finite: Option<Value<'b>> = None;
        let mut out = Vec::with_capacity(grads.len());
        for &g in grads {
            let g = b
                .value(g)
                .ok_or_else(|| TrainError::Invalid(format!("{g} is not a node")))?;
            let dt = g.dtype();
            let max = match dt {
                DType::F16 => half::f16::MAX.to_f64(),
                DType::BF16 => half::bf16::MAX.to_f64(),
                DType::F32 => f64::from(f32::MAX),
                _ => f64::MAX,
            };
            let axes: Vec<i64> = (0..g.rank() as i64).collect();
            // The largest |g|, NaN if any element is: finite iff at most the largest
            // finite value (a NaN compares false).
            let ok = g.abs().reduce_max(&axes, false).le(max).named("finite");
            finite = Some(match finite {
                None => ok,
                Some(f) => f.and(ok),
            });
            out.push((g * inv.cast(dt)).id());
        }
        let finite = finite.ok_or_else(|| TrainError::Invalid("loss scaling: no gradients".into()))?;
        Ok((out, finite.named("all_finite")))
    }

    /// The optimizer's updates kept only when `finite` (a skipped step leaves every
    /// slot as it was), then the scale's and the tracker's, and their slots. With
    /// gradient accumulation, `last` says whether this call is the one that updates:
    /// the other calls keep every slot, the scale and the tracker as they were (the
    /// scale is GradScaler's between `update()`s: one per optimizer step).
    pub(super) fn finish(
        &self,
        state: &mut State,
        updates: Vec<(String, Value<'b>)>,
        finite: Value<'b>,
        last: Option<Value<'b>>,
    ) -> Result<Vec<(String, Value<'b>)>, TrainError> {
        let b = self.b;
        let applies = match last {
            Some(l) => finite.and(l),
            None => finite,
        };
        let mut out = Vec::with_capacity(updates.len() + 2);
        for (name, new) in updates {
            let old = b.with_graph(|g| {
                g.inputs()
                    .iter()
                    .copied()
                    .find(|&i| g.input_name(i) == Some(name.as_str()))
            });
            let old = old
                .and_then(|o| b.value(o))
                .ok_or_else(|| TrainError::Invalid(format!("no state input \"{name}\"")))?;
            let keep = applies.broadcast_to(&new.shape());
            out.push((name, b.select(keep, new, old)));
        }
        let o = &self.opts;
        let (scale, tracker) = (self.scale, self.tracker);
        let next = tracker + 1.0;
        let grow = next.eq(f64::from(o.growth_interval));
        let grown = scale * o.growth_factor;
        let grown_ok = grown.abs().le(f64::from(f32::MAX));
        let finite_scale = b.select(grow.and(grown_ok), grown, scale);
        let mut new_scale = b.select(finite, finite_scale, scale * o.backoff_factor);
        let zero = b.scalar(DType::I32, 0.0);
        let mut new_tracker = b.select(finite, b.select(grow, zero, next), zero);
        let mut skipped = b.select(finite, b.scalar(DType::F32, 0.0), b.scalar(DType::F32, 1.0));
        if let Some(l) = last {
            new_scale = b.select(l, new_scale, scale);
            new_tracker = b.select(l, new_tracker, tracker);
            skipped = b.select(l, skipped, b.scalar(DType::F32, 0.0));
        }
        let report = b.concat(&[scale.reshape(Shape::from([1])), skipped.reshape(Shape::from([1]))], 0);
        out.push((SCALE.to_string(), new_scale));
        out.push((GROWTH_TRACKER.to_string(), new_tracker));
        out.push((OUTPUT.to_string(), report));
        let scale_init = Tensor::new(Shape::scalar(), TensorData::F32(vec![o.init_scale as f32]))
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        state.slots.push(StateSlot {
            name: SCALE.to_string(),
            class: StateClass::LossScale,
            init: Init::Value(scale_init),
        });
        state.slots.push(StateSlot {
            name: GROWTH_TRACKER.to_string(),
            class: StateClass::LossScale,
            init: super::zeros(&graphc_ir::TensorType::new(DType::I32, Shape::scalar())),
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use graphc_ir::{interpret, DType, GraphBuilder, Tensor, TensorData, TensorType};

    use crate::train::{Loss, LossKind, LossScaling, Optimizer, Sgd, TrainOptions};
    use crate::{compile, CompileOptions};

    fn scalar(dtype: DType, v: f64) -> Tensor {
        Tensor::new(graphc_ir::Shape::scalar(), TensorData::from_f64(dtype, &[v])).unwrap()
    }

    /// One step of `y = x * w` (MSE against `t`, SGD) from `scale` and `tracker`: the
    /// step's outputs by name.
    fn step(x: f64, scale: f64, tracker: f64, interval: u32) -> HashMap<String, Tensor> {
        let b = GraphBuilder::new();
        let xin = b.input("x", DType::F32, [2]);
        let w = b.param(
            "w",
            Tensor::new([2], TensorData::from_f64(DType::F32, &[1.0, 2.0])).unwrap(),
        );
        b.output("y", xin * w);
        let g = b.finish().unwrap();
        let opts = CompileOptions {
            train: Some(TrainOptions {
                loss: Loss::new(LossKind::Mse, "t"),
                optimizer: Optimizer::Sgd(Sgd::new(0.5)),
                freeze: None,
                target: TensorType::new(DType::F32, [2]),
                output: None,
                loss_scale: Some(LossScaling {
                    growth_interval: interval,
                    ..LossScaling::default()
                }),
                remat: Default::default(),
                accumulate: 1,
            }),
            ..Default::default()
        };
        let step = compile(&g, &opts).unwrap();
        let vec = |v: &[f64]| Tensor::new([2], TensorData::from_f64(DType::F32, v)).unwrap();
        let inputs: HashMap<String, Tensor> = [
            ("x".to_string(), vec(&[x, x])),
            ("t".to_string(), vec(&[1.0, 1.0])),
            ("w".to_string(), vec(&[1.0, 2.0])),
            ("optimizer.step".to_string(), scalar(DType::I64, 0.0)),
            (super::SCALE.to_string(), scalar(DType::F32, scale)),
            (super::GROWTH_TRACKER.to_string(), scalar(DType::I32, tracker)),
        ]
        .into();
        interpret(&step.graph, &inputs).unwrap().into_iter().collect()
    }

    /// GradScaler's `_amp_update_scale_`: a finite step counts; at the growth interval
    /// the scale doubles (unless that is inf) and the count restarts; an inf/NaN
    /// gradient skips the step (the parameter and the step counter stay), halves the
    /// scale and restarts the count.
    #[test]
    fn the_scale_and_the_skipped_steps_follow_grad_scaler() {
        let f = |t: &Tensor| t.to_f64_vec()[0];
        // Finite, below the interval: counted.
        let o = step(0.5, 1024.0, 0.0, 3);
        assert_eq!((f(&o[super::SCALE]), f(&o[super::GROWTH_TRACKER])), (1024.0, 1.0));
        assert_eq!(o[super::OUTPUT].to_f64_vec(), vec![1024.0, 0.0]);
        assert_ne!(o["w"].to_f64_vec(), vec![1.0, 2.0], "a step taken");
        assert_eq!(f(&o["optimizer.step"]), 1.0);
        // At the interval: doubled, the count restarts.
        let o = step(0.5, 1024.0, 2.0, 3);
        assert_eq!((f(&o[super::SCALE]), f(&o[super::GROWTH_TRACKER])), (2048.0, 0.0));
        // Doubling to inf keeps the scale (x = 0: the gradients are 0, finite).
        let big = f64::from(f32::MAX);
        let o = step(0.0, big, 0.0, 1);
        assert_eq!((f(&o[super::SCALE]), f(&o[super::GROWTH_TRACKER])), (big, 0.0));
        // A NaN gradient: skipped, nothing but the scale and the count changes.
        let o = step(f64::NAN, 1024.0, 2.0, 3);
        assert_eq!((f(&o[super::SCALE]), f(&o[super::GROWTH_TRACKER])), (512.0, 0.0));
        assert_eq!(o[super::OUTPUT].to_f64_vec(), vec![1024.0, 1.0]);
        assert_eq!(o["w"].to_f64_vec(), vec![1.0, 2.0]);
        assert_eq!(f(&o["optimizer.step"]), 0.0);
        // An overflow to inf (a huge scale times a finite loss): skipped too.
        let o = step(3.0, big, 0.0, 3);
        assert_eq!(f(&o[super::SCALE]), (big * 0.5) as f32 as f64);
        assert_eq!(o["w"].to_f64_vec(), vec![1.0, 2.0]);
    }
}
