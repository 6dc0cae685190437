//! Optimizers with PyTorch's semantics and defaults, as elementwise graph updates of
//! each parameter and its moments (the fuser makes one kernel of each parameter's
//! update; every parameter's is independent of the others').
//!
//! - **SGD** (`torch.optim.SGD`): `d = g + wd p`; with momentum, `buf = d` at the first
//!   step, else `buf = momentum buf + (1 - dampening) d`; `d = d + momentum buf`
//!   (nesterov) or `buf`; `p -= lr d`.
//! - **AdamW** (`torch.optim.AdamW`, defaults lr 1e-3, betas (0.9, 0.999), eps 1e-8,
//!   weight decay 1e-2): `t += 1`; `p *= 1 - lr wd` (decoupled);
//!   `m = lerp(m, g, 1 - b1)`; `v = b2 v + (1 - b2) g²`;
//!   `p -= lr / (1 - b1^t) · m / (sqrt(v) / sqrt(1 - b2^t) + eps)` (eps outside the root).
//!
//! The step counter is one i64 state slot, `optimizer.step` (the number of steps
//! taken), shared by every parameter.

use graphc_ir::{DType, GraphBuilder, NodeId, Shape, Value};

use super::{zeros, State, StateClass, StateSlot, TrainError, STEP_DTYPE};

#[derive(Clone, Debug, PartialEq)]
pub struct Sgd {
    pub lr: f64,
    pub momentum: f64,
    pub dampening: f64,
    pub weight_decay: f64,
    pub nesterov: bool,
}

impl Sgd {
    pub fn new(lr: f64) -> Sgd {
        Sgd {
            lr,
            momentum: 0.0,
            dampening: 0.0,
            weight_decay: 0.0,
            nesterov: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub betas: (f64, f64),
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> AdamW {
        AdamW {
            lr: 1e-3,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Optimizer {
    Sgd(Sgd),
    AdamW(AdamW),
}

impl Optimizer {
    pub fn name(&self) -> &'static str {
        match self {
            Optimizer::Sgd(_) => "sgd",
            Optimizer::AdamW(_) => "adamw",
        }
    }

    fn check(&self) -> Result<(), TrainError> {
        let bad = |what: &str, v: f64| TrainError::Invalid(format!("{}: {what} {v} is not allowed", self.name()));
        match self {
            Optimizer::Sgd(s) => {
                for (what, v) in [("lr", s.lr), ("momentum", s.momentum), ("weight decay", s.weight_decay)] {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(bad(what, v));
                    }
                }
                if !s.dampening.is_finite() {
                    return Err(bad("dampening", s.dampening));
                }
                if s.nesterov && (s.momentum <= 0.0 || s.dampening != 0.0) {
                    return Err(TrainError::Invalid(
                        "sgd: nesterov needs a momentum and zero dampening (as PyTorch)".into(),
                    ));
                }
            }
            Optimizer::AdamW(a) => {
                for (what, v) in [("lr", a.lr), ("eps", a.eps), ("weight decay", a.weight_decay)] {
                    if !(v.is_finite() && v >= 0.0) {
                        return Err(bad(what, v));
                    }
                }
                for (what, v) in [("beta1", a.betas.0), ("beta2", a.betas.1)] {
                    if !(0.0..1.0).contains(&v) {
                        return Err(bad(what, v));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The updated value of every state slot (parameters, then moments, then the step
/// counter), named as the slot; adds the optimizer's slots to `state`.
pub(super) fn build<'b>(
    b: &'b GraphBuilder,
    opt: &Optimizer,
    state: &mut State,
    params: &[NodeId],
    grads: &[NodeId],
) -> Result<Vec<(String, Value<'b>)>, TrainError> {
    opt.check()?;
    let value = |id: NodeId| {
        b.value(id)
            .ok_or_else(|| TrainError::Invalid(format!("{id} is not a node")))
    };
    let names: Vec<String> = state.parameters().map(|s| s.name.clone()).collect();
    let mut out = Vec::new();
    let mut moments = Vec::new();
    let step_name = unique(state, &[], "optimizer.step");
    let step = b.input(&step_name, STEP_DTYPE, Shape::scalar());
    let next_step = step + 1.0;
    for ((name, &p), &g) in names.iter().zip(params).zip(grads) {
        let (p, g) = (value(p)?, value(g)?);
        let ty = p.ty();
        let mut slot = |suffix: &str| {
            let n = unique(state, &moments, &format!("{name}.{suffix}"));
            moments.push(StateSlot {
                name: n.clone(),
                class: StateClass::OptimizerState,
                init: zeros(&ty),
            });
            (n.clone(), b.input(&n, ty.dtype, ty.shape.clone()))
        };
        match opt {
            Optimizer::Sgd(s) => {
                let mut d = g;
                if s.weight_decay != 0.0 {
                    d = d + p * s.weight_decay;
                }
                if s.momentum != 0.0 {
                    let (buf_name, buf) = slot("momentum_buffer");
                    let first = step.eq(0.0).broadcast_to(&ty.shape);
                    let next = b.select(first, d, buf * s.momentum + d * (1.0 - s.dampening));
                    out.push((buf_name, next));
                    d = if s.nesterov { d + next * s.momentum } else { next };
                }
                out.push((name.clone(), p - d * s.lr));
            }
            Optimizer::AdamW(a) => {
                let (m_name, m) = slot("exp_avg");
                let (v_name, v) = slot("exp_avg_sq");
                let (b1, b2) = a.betas;
                let t = next_step.cast(ty.dtype);
                let pd = p * (1.0 - a.lr * a.weight_decay);
                let w = 1.0 - b1;
                // torch.lerp: start + w (end - start) for w < 0.5, else end - (end - start)(1 - w)
                let m_next = if w < 0.5 {
                    m + (g - m) * w
                } else {
                    g - (g - m) * (1.0 - w)
                };
                let v_next = v * b2 + g * g * (1.0 - b2);
                let bc1 = 1.0 - b.scalar(ty.dtype, b1).pow(t);
                let bc2 = 1.0 - b.scalar(ty.dtype, b2).pow(t);
                let step_size = b.scalar(ty.dtype, a.lr) / bc1;
                let denom = v_next.sqrt() / bc2.sqrt() + a.eps;
                let p_next = pd - m_next / denom * step_size;
                out.push((name.clone(), p_next));
                out.push((m_name, m_next));
                out.push((v_name, v_next));
            }
        }
    }
    state.slots.extend(moments);
    state.slots.push(StateSlot {
        name: step_name.clone(),
        class: StateClass::Step,
        init: zeros(&graphc_ir::TensorType::new(DType::I64, Shape::scalar())),
    });
    out.push((step_name, next_step));
    Ok(out)
}

/// `name`, or `name.1`, `name.2`, .. when a slot already has it.
pub(super) fn unique(state: &State, more: &[StateSlot], name: &str) -> String {
    let mut n = name.to_string();
    let mut k = 1;
    while state.get(&n).is_some() || more.iter().any(|s| s.name == n) {
        n = format!("{name}.{k}");
        k += 1;
    }
    n
}
