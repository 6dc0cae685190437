//! Training: a forward graph turned into one training-step graph.
//!
//! Two stages of [`crate::compile`] (with [`TrainOptions`]):
//!
//! 1. [`make_state`] — every trainable parameter (a float weight not matched by
//!    `freeze`) becomes **state**: an input of the step, bound by the parameter's own
//!    name, whose initial value the [`State`] holds. The optimizer then never folds
//!    through it (it is a variable now) but still folds frozen weights and constants.
//! 2. [`build_step`] — after the forward graph is optimized (so the backward is built
//!    from the forms the fuser knows: attention, GELU), append the loss ([`loss`]), its
//!    gradient with respect to every parameter ([`graphc_ir::autodiff`]) and the
//!    optimizer's update ([`optim`]). The step graph's outputs are `loss` and, for each
//!    state slot, the slot's next value under the slot's own name: a step reads state
//!    `s` and writes `s` (the runtime writes it over the old value: a donated buffer,
//!    as XLA's input/output aliasing).
//!
//! Optimizer moments and the step counter are state too, of their own classes
//! ([`StateClass`]), zero at the start as PyTorch's optimizers create them.

pub mod accumulate;
pub mod donate;
pub mod loss;
pub mod multi;
pub mod optim;
pub mod remat;
pub mod scale;

use std::collections::{BTreeMap, HashSet};

use graphc_ir::autodiff::gradients;
use graphc_ir::{DType, Graph, GraphBuilder, GraphError, Node, NodeId, Op, Tensor, TensorType};
use serde::{Deserialize, Serialize};

pub use loss::{Loss, LossKind};
pub use optim::{AdamW, Optimizer, Sgd};
pub use scale::LossScaling;

/// What a training step computes.
#[derive(Clone, Debug)]
pub struct TrainOptions {
    pub loss: Loss,
    pub optimizer: Optimizer,
    /// Parameters whose name this regular expression matches stay frozen weights.
    pub freeze: Option<String>,
    /// The target's (or labels') type: the input `loss.target` of the step.
    pub target: TensorType,
    /// Which forward output the loss reads (default: the first).
    pub output: Option<String>,
    /// Dynamic loss scaling (`torch.amp.GradScaler`), for fp16 training.
    pub loss_scale: Option<LossScaling>,
    /// What the backward computes again instead of keeping ([`Remat`]).
    pub remat: Remat,
    /// Microbatches whose gradients are summed before one optimizer update
    /// ([`accumulate`]; 0 or 1: every call updates).
    pub accumulate: usize,
}

/// Recomputation in the backward pass (`--remat`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Remat {
    /// Keep what the backward reads (cheap elementwise values and low-precision weight
    /// copies are still made again: [`remat`]).
    Off,
    /// As `Off` when the step fits the budget; else the fewest layers made again (the
    /// first ones, as `Full` does each) for it to fit, or all of them when even that
    /// does not (`pipeline::auto_remat`).
    #[default]
    Auto,
    /// Keep only each layer's input and compute the layer's forward again in its
    /// backward, as `gradient_checkpointing_enable()` does
    /// ([`remat::recompute_layers`]).
    Full,
    /// As `Full`, without also planning the step as it is (what `Full` reports the
    /// memory saved against): the probes of `graphc fit --train`, which search the
    /// step as it is separately.
    FullProbe,
}

/// What a slot of state holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateClass {
    /// A trainable parameter.
    Parameter,
    /// An optimizer moment (SGD's momentum buffer, AdamW's two averages).
    OptimizerState,
    /// The optimizer's step counter.
    Step,
    /// Dynamic loss scaling's scale and growth tracker.
    LossScale,
    /// Gradient accumulation's sums and microbatch counter ([`accumulate`]).
    Accumulator,
    /// Batch normalization's running mean and variance, updated by the forward pass
    /// (`crate::passes::batch_norm`).
    Statistics,
}

impl StateClass {
    pub fn name(self) -> &'static str {
        match self {
            StateClass::Parameter => "parameters",
            StateClass::OptimizerState => "optimizer state",
            StateClass::Step => "step counter",
            StateClass::LossScale => "loss scale",
            StateClass::Accumulator => "accumulated gradients",
            StateClass::Statistics => "running statistics",
        }
    }
}

/// One slot of state: an input of the step and the output of the same name that
/// replaces it.
#[derive(Clone, Debug, PartialEq)]
pub struct StateSlot {
    pub name: String,
    pub class: StateClass,
    /// The value before the first step.
    pub init: Init,
}

/// A state slot's value before the first step: a model's weight (a handle, mapped
/// from its file), or zeros, made only when a session loads the state (planning a
/// step never allocates its optimizer's moments).
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    Value(Tensor),
    Zeros(TensorType),
}

impl Init {
    pub fn ty(&self) -> TensorType {
        match self {
            Init::Value(t) => t.ty(),
            Init::Zeros(ty) => ty.clone(),
        }
    }

    /// The value (zeros allocated now, fallibly: an error names the bytes).
    pub fn tensor(&self) -> Result<Tensor, String> {
        match self {
            Init::Value(t) => Ok(t.clone()),
            Init::Zeros(ty) => Tensor::try_zeros(ty),
        }
    }
}

/// The state of a training step, in a fixed order: parameters (in graph order), then
/// the optimizer's slots.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct State {
    pub slots: Vec<StateSlot>,
}

impl State {
    pub fn parameters(&self) -> impl Iterator<Item = &StateSlot> {
        self.slots.iter().filter(|s| s.class == StateClass::Parameter)
    }

    pub fn get(&self, name: &str) -> Option<&StateSlot> {
        self.slots.iter().find(|s| s.name == name)
    }

    /// Bytes by class.
    pub fn bytes_by_class(&self) -> BTreeMap<StateClass, u64> {
        let mut m = BTreeMap::new();
        for s in &self.slots {
            *m.entry(s.class).or_default() += s.init.ty().size_bytes() as u64;
        }
        m
    }
}

/// What the training stages did, for reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainReport {
    /// Trainable parameters (names, in state order) and their element count.
    pub trainable: Vec<String>,
    pub trainable_elements: u64,
    /// Float weights left frozen by `freeze`.
    pub frozen: Vec<String>,
    /// Float initializers that are a module's buffers, never trained ([`is_buffer`]).
    pub buffers: Vec<String>,
    /// Forward values the backward pass reads (names where known), before optimization.
    pub saved: Vec<String>,
    /// Nodes of the forward graph, and of the whole step, before optimization.
    pub forward_nodes: usize,
    pub step_nodes: usize,
    /// Low-precision parameter copies made again for the backward pass instead of
    /// held across the step ([`remat::recompute_parameter_casts`]).
    pub recomputed_casts: usize,
    /// Saved elementwise values computed again in the backward pass
    /// ([`remat::recompute_saved_elementwise`]).
    pub recomputed_elementwise: usize,
    /// `--remat full`: the layers' forward values made again
    /// ([`remat::recompute_layers`]).
    pub recomputed_layers: Option<remat::LayerRemat>,
    /// The LM head and cross-entropy computed over this many parts of the tokens
    /// ([`build_loss_in_parts`]; 0: whole), and the parts' logits made again in the
    /// backward ([`remat::recompute_loss_chunks`]).
    pub loss_parts: usize,
    pub recomputed_logits: Option<remat::LossParts>,
    /// MLPs run over parts of their tokens in the forward and the backward
    /// ([`crate::chunk::chunk_mlp_tokens`], with the loss's parts), and into how many.
    pub mlp_parts: crate::chunk::ChunkReport,
    /// The loss reads an LM head (`logits = h @ w`) that it can compute in parts.
    pub lm_head: bool,
    /// Cross-entropy: the class count (the logits' last dim), which every label must be
    /// under ([`Loss::check_labels`]).
    pub classes: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("--freeze: {0}")]
    Freeze(String),
    #[error("{0}")]
    Graph(#[from] GraphError),
    #[error("{0}")]
    Invalid(String),
}

/// Whether an initializer is one of PyTorch's well-known module *buffers* (state that
/// is not a parameter: BatchNorm's running statistics, rotary embeddings' inverse
/// frequencies, position ids), by the last part of its name. An ONNX file does not
/// tell parameters from buffers; these are never trained (`--freeze` excludes more).
pub fn is_buffer(name: &str) -> bool {
    let last = name.rsplit(['.', '/', ':']).next().unwrap_or(name);
    matches!(
        last,
        "running_mean"
            | "running_var"
            | "num_batches_tracked"
            | "inv_freq"
            | "original_inv_freq"
            | "position_ids"
            | "token_type_ids"
            | "masked_bias"
    )
}

/// Whether an initializer is a constant the exporter made, not a module's parameter:
/// `torch.onnx`'s default (optimized) export stores the literals of the traced code
/// (GELU's 0.5 and 0.044715, a `1.0`, an `ones` / `zeros` it folded) as initializers
/// named `val_N`, `new_ones`, `zeros`, and lifted tensor constants as
/// `c_lifted_tensor_N` / `_tensor_constantN`, while a parameter carries its module path
/// (`transformer.h.0.mlp.c_fc.weight`). Constants are never trained: trained, the
/// literals of the model's own formulas would move.
pub fn is_export_constant(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let name = name.trim_start_matches('_');
    name.strip_prefix("val_").is_some_and(digits)
        || name.strip_prefix("c_lifted_tensor_").is_some_and(digits)
        || name.strip_prefix("lifted_tensor_").is_some_and(digits)
        || name.strip_prefix("tensor_constant").is_some_and(digits)
        || matches!(
            name,
            "new_ones" | "new_zeros" | "ones" | "zeros" | "full" | "scalar_tensor"
        )
        || ["new_ones_", "new_zeros_", "ones_", "zeros_", "full_", "scalar_tensor_"]
            .iter()
            .any(|p| name.strip_prefix(p).is_some_and(digits))
}

/// Stage 1: trainable parameters become inputs of the graph (state), in table order.
pub fn make_state(graph: &Graph, opts: &TrainOptions) -> Result<(Graph, State, TrainReport), TrainError> {
    let freeze = match &opts.freeze {
        Some(re) => Some(regex_lite::Regex::new(re).map_err(|e| TrainError::Freeze(e.to_string()))?),
        None => None,
    };
    let input_names: HashSet<&str> = graph.inputs().iter().filter_map(|&i| graph.input_name(i)).collect();
    let mut out = Graph::new();
    let mut state = State::default();
    let mut report = TrainReport::default();
    for node in graph.nodes() {
        let mut node = node.clone();
        if let Op::Parameter { name, ty } = &node.op {
            let buffer = is_buffer(name);
            let trainable = ty.dtype.is_float()
                && !buffer
                && !is_export_constant(name)
                && !freeze.as_ref().is_some_and(|re| re.is_match(name));
            if trainable {
                if input_names.contains(name.as_str()) {
                    return Err(TrainError::Invalid(format!(
                        "parameter \"{name}\" has the name of an input of the model"
                    )));
                }
                let init = graph
                    .weight(name)
                    .cloned()
                    .ok_or_else(|| TrainError::Invalid(format!("parameter \"{name}\" has no weight data")))?;
                report.trainable_elements += ty.numel() as u64;
                report.trainable.push(name.clone());
                state.slots.push(StateSlot {
                    name: name.clone(),
                    class: StateClass::Parameter,
                    init: Init::Value(init),
                });
                node = Node {
                    op: Op::Input {
                        name: name.clone(),
                        ty: ty.clone(),
                    },
                    ..node
                };
            } else if buffer {
                report.buffers.push(name.clone());
            } else if ty.dtype.is_float() && !is_export_constant(name) {
                report.frozen.push(name.clone());
            }
        }
        out.push(node);
    }
    for o in graph.outputs() {
        out.add_output(o.name.clone(), o.node);
    }
    for (name, w) in graph.weights() {
        if state.get(name).is_none() {
            out.set_weight(name.clone(), w.clone());
        }
    }
    // The model's inputs first, in their order, then the parameters.
    let mut order: Vec<NodeId> = graph.inputs().to_vec();
    order.extend(out.inputs().iter().filter(|i| !graph.inputs().contains(i)));
    out.set_input_order(order);
    out.verify()?;
    if state.slots.is_empty() {
        return Err(TrainError::Invalid(match &opts.freeze {
            Some(re) => format!("nothing to train: every float weight matches --freeze {re:?}"),
            None => "nothing to train: the model has no float weights".into(),
        }));
    }
    report.forward_nodes = out.len();
    Ok((out, state, report))
}

/// Stage 2: the loss, its gradients and the optimizer's update appended to the
/// (optimized) forward graph whose trainable parameters are `state`'s inputs
/// ([`build_loss`], then [`build_backward`]).
pub fn build_step(
    forward: &Graph,
    state: &mut State,
    opts: &TrainOptions,
    report: &mut TrainReport,
) -> Result<Graph, TrainError> {
    let with_loss = build_loss(forward, state, opts, report)?;
    build_backward(&with_loss, state, opts, report)
}

/// Stage 2a: the loss appended to the forward graph. The result's one output is
/// `loss` (the model's outputs are dropped: the step returns the loss). With mixed
/// precision the pipeline runs the precision pass on this graph, forward and loss
/// together, before [`build_backward`] differentiates it, as `torch.autocast` does:
/// the backward of each op runs in the type its forward ran in, and each cast's
/// backward casts the gradient back (an f32 parameter gets an f32 gradient).
pub fn build_loss(
    forward: &Graph,
    state: &State,
    opts: &TrainOptions,
    report: &mut TrainReport,
) -> Result<Graph, TrainError> {
    build_loss_in_parts(forward, state, opts, report, 1)
}

/// [`build_loss`] with a cross-entropy over an LM head (`logits = h @ w`) computed over
/// `chunks` parts of the tokens (the sequence axis of `[batch, seq, classes]` logits,
/// the rows of `[rows, classes]` ones), each part's logits from its tokens of `h` (the
/// same values; the parts' bounds do not depend on the batch; with [`remat::recompute_loss_chunks`] after autodiff, one part's logits and
/// their gradient live at a time).
pub fn build_loss_in_parts(
    forward: &Graph,
    state: &State,
    opts: &TrainOptions,
    report: &mut TrainReport,
    chunks: usize,
) -> Result<Graph, TrainError> {
    let pred = match &opts.output {
        Some(name) => forward
            .outputs()
            .iter()
            .find(|o| &o.name == name)
            .ok_or_else(|| TrainError::Invalid(format!("the model has no output \"{name}\"")))?,
        None => forward
            .outputs()
            .first()
            .ok_or_else(|| TrainError::Invalid("the model has no output".into()))?,
    }
    .node;
    let names: HashSet<String> = forward
        .inputs()
        .iter()
        .filter_map(|&i| forward.input_name(i).map(str::to_string))
        .collect();
    if names.contains(&opts.loss.target) && state.get(&opts.loss.target).is_none() {
        return Err(TrainError::Invalid(format!(
            "the target \"{}\" has the name of an input of the model",
            opts.loss.target
        )));
    }
    let mut graph = forward.clone();
    graph.set_outputs(statistics_outputs(forward, state));
    let b = GraphBuilder::from_graph(graph);
    let pred = b
        .value(pred)
        .ok_or_else(|| TrainError::Invalid("bad output node".into()))?;
    if opts.loss.kind == LossKind::CrossEntropy {
        report.classes = pred.shape().dims().last().copied();
    }
    let (mut parts, mut lm_head) = (0, false);
    let loss = b.scope("loss", || {
        loss::build(&b, &opts.loss, pred, &opts.target, chunks, &mut parts, &mut lm_head)
    })?;
    report.loss_parts = if parts > 1 { parts } else { 0 };
    report.lm_head = lm_head;
    b.output(LOSS_OUTPUT, loss);
    let (graph, err) = b.into_parts();
    if let Some(e) = err {
        return Err(e.into());
    }
    graph.verify()?;
    Ok(graph)
}

/// Stage 2b: the gradients of the graph's `loss` output with respect to every
/// parameter and the optimizer's update (with `opts.loss_scale`, under dynamic loss
/// scaling: [`scale::build`]). The step's outputs: `loss`, then each state slot's
/// next value under the slot's name (and with loss scaling `grad_scaler`).
pub fn build_backward(
    with_loss: &Graph,
    state: &mut State,
    opts: &TrainOptions,
    report: &mut TrainReport,
) -> Result<Graph, TrainError> {
    let loss = with_loss
        .outputs()
        .iter()
        .find(|o| o.name == LOSS_OUTPUT)
        .ok_or_else(|| TrainError::Invalid("the graph has no loss output".into()))?
        .node;
    let mut graph = with_loss.clone();
    graph.set_outputs(statistics_outputs(with_loss, state));
    let b = GraphBuilder::from_graph(graph);
    // Parameter inputs by name (the optimizer may have dropped one the loss no longer
    // reads: its gradient is then zero).
    let mut params = Vec::new();
    for slot in state.parameters() {
        let id = b.with_graph(|g| {
            g.inputs()
                .iter()
                .copied()
                .find(|&i| g.input_name(i) == Some(slot.name.as_str()))
        });
        let id = match id {
            Some(id) => id,
            None => {
                let ty = slot.init.ty();
                b.input(&slot.name, ty.dtype, ty.shape).id()
            }
        };
        params.push(id);
    }
    let loss = b
        .value(loss)
        .ok_or_else(|| TrainError::Invalid("bad loss node".into()))?;
    let scaler = match &opts.loss_scale {
        Some(s) => Some(b.scope("grad_scaler", || scale::Scaler::new(&b, s, state))?),
        None => None,
    };
    let seed = match &scaler {
        Some(s) => b.scope("grad_scaler", || s.scaled(loss)),
        None => loss,
    };
    let grads = gradients(&b, seed.id(), &params)?;
    report.saved = b.with_graph(|g| {
        grads
            .saved
            .iter()
            .map(|&s| {
                g.node(s)
                    .name
                    .clone()
                    .unwrap_or_else(|| format!("{s} ({})", g.node(s).op.name()))
            })
            .collect()
    });
    b.output(LOSS_OUTPUT, loss);
    let updates = match &scaler {
        None if opts.accumulate > 1 => {
            let names: Vec<String> = state.parameters().map(|s| s.name.clone()).collect();
            let acc = b.scope("accumulate", || {
                accumulate::build(&b, opts.accumulate, state, &names, &grads.grads)
            })?;
            let updates = b.scope("update", || {
                optim::build(&b, &opts.optimizer, state, &params, &acc.grads)
            })?;
            let mut updates = b.scope("accumulate", || accumulate::on_last(&b, acc.last, updates))?;
            updates.extend(acc.outputs);
            updates
        }
        None => b.scope("update", || {
            optim::build(&b, &opts.optimizer, state, &params, &grads.grads)
        })?,
        Some(s) if opts.accumulate > 1 => {
            // The scaled gradients summed; the N-th call checks and unscales the sums.
            let names: Vec<String> = state.parameters().map(|s| s.name.clone()).collect();
            let acc = b.scope("accumulate", || {
                accumulate::build(&b, opts.accumulate, state, &names, &grads.grads)
            })?;
            let (sums, finite) = b.scope("grad_scaler", || s.unscale(&acc.grads))?;
            let updates = b.scope("update", || optim::build(&b, &opts.optimizer, state, &params, &sums))?;
            let mut updates = b.scope("grad_scaler", || s.finish(state, updates, finite, Some(acc.last)))?;
            updates.extend(acc.outputs);
            updates
        }
        Some(s) => {
            let (grads, finite) = b.scope("grad_scaler", || s.unscale(&grads.grads))?;
            let updates = b.scope("update", || optim::build(&b, &opts.optimizer, state, &params, &grads))?;
            b.scope("grad_scaler", || s.finish(state, updates, finite, None))?
        }
    };
    for (name, v) in updates {
        b.output(&name, v);
    }
    let (graph, err) = b.into_parts();
    if let Some(e) = err {
        return Err(e.into());
    }
    graph.verify()?;
    report.step_nodes = graph.len();
    Ok(graph)
}

/// The outputs of `graph` that update running statistics (state the forward pass
/// writes: `crate::passes::batch_norm`), kept through the loss and the backward.
fn statistics_outputs(graph: &Graph, state: &State) -> Vec<graphc_ir::Output> {
    graph
        .outputs()
        .iter()
        .filter(|o| state.get(&o.name).is_some_and(|s| s.class == StateClass::Statistics))
        .cloned()
        .collect()
}

/// The name of the step's loss output.
pub const LOSS_OUTPUT: &str = "loss";

/// Zeros of a type (optimizer moments start at zero), made when a session loads them.
pub(crate) fn zeros(ty: &TensorType) -> Init {
    Init::Zeros(ty.clone())
}

/// The step counter's type.
pub const STEP_DTYPE: DType = DType::I64;

#[cfg(test)]
mod tests {
    use super::is_export_constant;

    /// The exporter's constants by name; parameters (module paths) are not.
    #[test]
    fn export_constants_are_told_from_parameters() {
        for c in [
            "val_9",
            "val_3196",
            "_val_12",
            "new_ones",
            "zeros",
            "c_lifted_tensor_0",
            "_tensor_constant3",
            "ones_2",
        ] {
            assert!(is_export_constant(c), "{c}");
        }
        for p in [
            "m.transformer.h.0.mlp.c_fc.weight",
            "fc1.weight",
            "val",
            "val_x",
            "scale",
            "zeros_like.weight",
            "m.val_9",
        ] {
            assert!(!is_export_constant(p), "{p}");
        }
    }
}
