//! Gradient accumulation (`--accumulate N`): N microbatches, one optimizer update.
//!
//! The step stays one graph, called once per microbatch (as optax's `MultiSteps`
//! does it): each parameter's gradient sum is state (`{name}.grad`, f32 like the
//! parameter, zero at the start), and so is a microbatch counter. A call adds its
//! microbatch's gradient, divided by N (PyTorch's `loss / N` before `backward()`), to
//! the sum; the N-th call (counter N − 1) runs the optimizer on the sum and zeroes it,
//! the others keep every other slot as it was (a select between the update and the old
//! value, so the plan holds the update's work at every call and its peak is the
//! step's). The gradients' sums are one more parameter-sized class of memory, which
//! the report counts apart; the activations are one microbatch's.

use graphc_ir::{DType, GraphBuilder, NodeId, Shape, Value};

use super::optim::unique;
use super::{zeros, State, StateClass, StateSlot, TrainError};

/// The microbatch counter's slot.
pub const COUNTER: &str = "accumulate.microbatch";

/// What [`build`] made: the gradients the optimizer reads (the sums with this call's
/// added), whether this call is the N-th, and the accumulation slots' next values.
pub(super) struct Accumulated<'b> {
    pub grads: Vec<NodeId>,
    pub last: Value<'b>,
    pub outputs: Vec<(String, Value<'b>)>,
}

/// The gradient sums of `n` microbatches of the parameters `names` (with `grads`),
/// adding their slots to `state`.
pub(super) fn build<'b>(
    b: &'b GraphBuilder,
    n: usize,
    state: &mut State,
    names: &[String],
    grads: &[NodeId],
) -> Result<Accumulated<'b>, TrainError> {
    if n < 2 {
        return Err(TrainError::Invalid(format!(
            "accumulate: {n} microbatches (at least 2)"
        )));
    }
    let counter_name = unique(state, &[], COUNTER);
    let counter = b.input(&counter_name, DType::I64, Shape::scalar());
    let last = counter.eq((n - 1) as f64);
    let mut outputs = Vec::new();
    let mut sums = Vec::new();
    let mut slots = Vec::new();
    for (name, &g) in names.iter().zip(grads) {
        let g = b
            .value(g)
            .ok_or_else(|| TrainError::Invalid(format!("{g} is not a node")))?;
        let ty = g.ty();
        let slot = unique(state, &slots, &format!("{name}.grad"));
        let acc = b.input(&slot, ty.dtype, ty.shape.clone());
        let sum = acc + g / n as f64;
        let zero = b.scalar(ty.dtype, 0.0).broadcast_to(&ty.shape);
        let next = b.select(last.broadcast_to(&ty.shape), zero, sum);
        slots.push(StateSlot {
            name: slot.clone(),
            class: StateClass::Accumulator,
            init: zeros(&ty),
        });
        outputs.push((slot, next));
        sums.push(sum.id());
    }
    let next = b.select(last, b.scalar(DType::I64, 0.0), counter + 1.0);
    outputs.push((counter_name.clone(), next));
    state.slots.extend(slots);
    state.slots.push(StateSlot {
        name: counter_name,
        class: StateClass::Accumulator,
        init: zeros(&graphc_ir::TensorType::new(DType::I64, Shape::scalar())),
    });
    Ok(Accumulated {
        grads: sums,
        last,
        outputs,
    })
}

/// `updates` kept on the N-th call only: each slot's next value, or its input.
pub(super) fn on_last<'b>(
    b: &'b GraphBuilder,
    last: Value<'b>,
    updates: Vec<(String, Value<'b>)>,
) -> Result<Vec<(String, Value<'b>)>, TrainError> {
    let mut out = Vec::with_capacity(updates.len());
    for (name, v) in updates {
        let old = b
            .with_graph(|g| {
                g.inputs()
                    .iter()
                    .copied()
                    .find(|&i| g.input_name(i) == Some(name.as_str()))
            })
            .and_then(|id| b.value(id))
            .ok_or_else(|| TrainError::Invalid(format!("accumulate: no input for the slot {name}")))?;
        let ty = v.ty();
        out.push((name, b.select(last.broadcast_to(&ty.shape), v, old)));
    }
    Ok(out)
}
