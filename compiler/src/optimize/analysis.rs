//! The e-class analysis: every class's type, and its value when it is known at compile
//! time. Known values are computed by the reference interpreter's `eval_op`, so folded
//! constants are bit-identical to what the interpreter would compute at run time.
//!
//! Weights count as known: a chain computed only from weights and constants (a
//! transposed, reshaped, cast or scaled weight) folds into a new weight, a parameter
//! named after its source (`fc0.weight:transpose`).
//!
//! Size rule: broadcasts are never materialized (their operand is folded instead; a
//! broadcast of a single value is a *splat*, one element and a shape); other constant values are materialized only up to
//! [`MAX_FOLDED_BYTES`], or up to the size of their largest known operand; values that
//! depend on weights only up to the size of their largest operand (folding never makes
//! the weights grow: a bias broadcast to the activations' shape stays a broadcast).
//! Transposes, reshapes and slices of weights over [`MAX_FOLDED_VIEW_BYTES`] stay views.
//! The work is bounded before it is done, whatever the dimensions: a fold whose splat
//! operands would materialize past [`MAX_FOLDED_BYTES`], or a matmul past
//! [`MAX_FOLDED_MATMUL_WORK`] multiply-adds, is not done.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use egg::{Analysis, DidMerge, EGraph, Id};
use graphc_ir::interp::eval_op;
use graphc_ir::{infer_type, Op, Shape, Tensor, TensorData, TensorType};

use super::lang::TNode;

/// Materialized folded values are kept up to this size (or their largest operand's).
pub const MAX_FOLDED_BYTES: usize = 64 << 10;

/// A transpose, reshape or slice of weights larger than this stays a view: fusion reads
/// it through strides (a GEMM through its transpose flag, as PyTorch's `x @ W^T` runs),
/// and folding would copy it at every compile.
pub const MAX_FOLDED_VIEW_BYTES: usize = 1 << 20;

/// A matmul of known operands folds only if it takes at most this many multiply-adds.
pub const MAX_FOLDED_MATMUL_WORK: usize = 1 << 26;

pub type TEGraph = EGraph<TNode, TensorAnalysis>;

/// A value known at compile time.
#[derive(Clone, Debug)]
pub enum Known {
    /// Every element; the tensor has the class's type.
    Full(Arc<Tensor>),
    /// Every element equal to this rank-0 tensor (of the class's dtype).
    Splat(Arc<Tensor>),
}

impl Known {
    /// The single element value, if every element is equal (bitwise).
    pub fn splat(&self) -> Option<f64> {
        match self {
            Known::Splat(t) => t.to_f64_vec().first().copied(),
            Known::Full(t) => {
                // From the bytes (borrowed from a mapped weight's file: nothing decoded).
                let size = t.dtype().size_bytes();
                let bytes = t.le_bytes();
                let first = bytes.get(..size)?;
                if !bytes.chunks_exact(size).all(|c| c == first) {
                    return None;
                }
                TensorData::decode_le(t.dtype(), first, 1)
                    .ok()?
                    .to_f64_vec()
                    .first()
                    .copied()
            }
        }
    }

    /// The single element as a rank-0 tensor, if every element is equal (bitwise).
    pub fn as_scalar(&self) -> Option<Tensor> {
        match self {
            Known::Splat(s) => Some((**s).clone()),
            Known::Full(t) => {
                self.splat()?;
                let size = t.dtype().size_bytes();
                let first = TensorData::decode_le(t.dtype(), t.le_bytes().get(..size)?, 1).ok()?;
                Tensor::new(Shape::scalar(), first).ok()
            }
        }
    }

    /// The value as a dense tensor of type `ty`.
    pub fn materialize(&self, ty: &TensorType) -> Tensor {
        match self {
            Known::Full(t) => (**t).clone(),
            Known::Splat(s) => {
                let one = s.data().clone();
                let idx = vec![0usize; ty.numel()];
                Tensor::new(ty.shape.clone(), one.take(&idx)).expect("splat fills its type")
            }
        }
    }

    fn bytes(&self, ty: &TensorType) -> usize {
        match self {
            Known::Full(_) => ty.size_bytes(),
            Known::Splat(_) => ty.dtype.size_bytes(),
        }
    }
}

/// Per-class facts.
#[derive(Clone, Debug)]
pub struct Data {
    pub ty: TensorType,
    pub known: Option<Known>,
    /// The known value depends on weights: it folds into a new weight (a parameter),
    /// not an inline constant, and only where it does not grow.
    pub from_weights: bool,
}

#[derive(Default)]
pub struct TensorAnalysis {
    /// Weight data by parameter name; weight-only chains fold when this is set.
    pub weights: HashMap<String, Arc<Tensor>>,
    /// Weights made by folding weight-only chains, by their new parameter name.
    pub folded_weights: BTreeMap<String, Arc<Tensor>>,
    /// Number of values folded to constants or weights (classes that gained a known value).
    pub folded: usize,
    /// The next number to try for each derived weight name (`x0:add` -> 2 once
    /// `x0:add` is taken), so naming the n-th fold of a chain is not a scan of n names.
    next_suffix: HashMap<String, usize>,
    /// Per folded weight, the weight its name starts from and how many ops its name
    /// chains after it (`fc0.weight:transpose:cast`: 2).
    derived: HashMap<String, (String, usize)>,
    /// Whether a mask class (by canonical id) is the causal pattern, once evaluated by
    /// the attention rule (`rules/attention.rs`): its value is too large to fold, so
    /// it is evaluated on demand, once per class.
    pub causal_masks: std::sync::Mutex<HashMap<(Id, u8), bool>>,
}

/// A folded weight's name chains at most this many ops after the weight it starts
/// from; a longer chain (a sum of 100k weights) starts over from that weight, so names
/// stay short instead of growing with the chain (quadratic bytes in all).
const MAX_NAME_OPS: usize = 4;

impl Analysis<TNode> for TensorAnalysis {
    type Data = Data;

    fn make(egraph: &mut TEGraph, enode: &TNode, _id: Id) -> Data {
        graphc_ir::work::add_len(graphc_ir::work::Stage::Optimize, 1 + enode.children.len());
        let child = |i: Id| &egraph[i].data;
        let tys: Vec<&TensorType> = enode.children.iter().map(|&c| &child(c).ty).collect();
        let ty = infer_type(enode.op(), &tys)
            .unwrap_or_else(|e| panic!("optimizer built an ill-typed {} node: {e}", enode.op().name()));
        if let Op::Parameter { name, .. } = enode.op() {
            let known = egraph.analysis.weights.get(name).map(|w| Known::Full(w.clone()));
            return Data {
                ty,
                known,
                from_weights: true,
            };
        }
        let from_weights = enode.children.iter().any(|&c| child(c).from_weights);
        let knowns: Option<Vec<&Known>> = enode.children.iter().map(|&c| child(c).known.as_ref()).collect();
        let known = knowns.and_then(|ks| fold(enode.op(), &ks, &tys, &ty, from_weights));
        Data {
            ty,
            known,
            from_weights,
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        assert_eq!(
            a.ty, b.ty,
            "unsound rewrite: merged classes of types {} and {}",
            a.ty, b.ty
        );
        match (&a.known, b.known) {
            (None, Some(k)) => {
                a.known = Some(k);
                a.from_weights = b.from_weights;
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            _ => DidMerge(false, false),
        }
    }

    fn modify(egraph: &mut TEGraph, id: Id) {
        let Some(known) = egraph[id].data.known.clone() else {
            return;
        };
        let has_constant = egraph[id].nodes.iter().any(|n| match n.op() {
            Op::Constant { .. } | Op::Parameter { .. } => true,
            Op::Broadcast { .. } => {
                matches!(egraph[n.children[0]].data.known, Some(Known::Splat(_)))
                    || egraph[n.children[0]].data.ty.numel() == 1
                        && egraph[n.children[0]]
                            .nodes
                            .iter()
                            .any(|c| matches!(c.op(), Op::Constant { .. }))
            }
            _ => false,
        });
        if has_constant {
            return;
        }
        let ty = egraph[id].data.ty.clone();
        let new = match &known {
            Known::Full(t) if egraph[id].data.from_weights => {
                let name = derived_weight_name(egraph, id);
                egraph.analysis.folded_weights.insert(name.clone(), t.clone());
                egraph.add(TNode::new(Op::Parameter { name, ty: ty.clone() }, vec![]))
            }
            Known::Full(t) => egraph.add(TNode::new(Op::Constant { value: (**t).clone() }, vec![])),
            Known::Splat(s) => {
                let scalar = egraph.add(TNode::new(Op::Constant { value: (**s).clone() }, vec![]));
                if ty.shape.rank() == 0 {
                    scalar
                } else {
                    egraph.add(TNode::new(
                        Op::Broadcast {
                            shape: ty.shape.clone(),
                        },
                        vec![scalar],
                    ))
                }
            }
        };
        egraph.analysis.folded += 1;
        egraph.union(id, new);
    }
}

/// A name for a weight folded into class `id`: the first weight it derives from, the
/// op that made it, and a number that keeps names unique (at most [`MAX_NAME_OPS`] ops
/// chained).
fn derived_weight_name(egraph: &mut TEGraph, id: Id) -> String {
    let node = egraph[id].nodes.iter().find(|n| !n.children.is_empty());
    let (op, base) = match node {
        Some(n) => {
            let base = n
                .children
                .iter()
                .find_map(|&c| {
                    egraph[c].nodes.iter().find_map(|m| match m.op() {
                        Op::Parameter { name, .. } => Some(name.clone()),
                        _ => None,
                    })
                })
                .unwrap_or_else(|| "weight".to_string());
            (n.op().name(), base)
        }
        None => ("folded", "weight".to_string()),
    };
    let analysis = &mut egraph.analysis;
    let (root, depth) = analysis
        .derived
        .get(&base)
        .cloned()
        .unwrap_or_else(|| (base.clone(), 0));
    let (stem, depth) = if depth >= MAX_NAME_OPS {
        (format!("{root}:{op}"), 1)
    } else {
        (format!("{base}:{op}"), depth + 1)
    };
    let mut k = analysis.next_suffix.get(&stem).copied().unwrap_or(1);
    let mut name = if k == 1 { stem.clone() } else { format!("{stem}{k}") };
    while analysis.folded_weights.contains_key(&name) || analysis.weights.contains_key(&name) {
        k += 1;
        name = format!("{stem}{k}");
    }
    analysis.next_suffix.insert(stem, k + 1);
    analysis.derived.insert(name.clone(), (root, depth));
    name
}

/// The value of `op` on known operands, within the size rule.
fn fold(op: &Op, args: &[&Known], arg_tys: &[&TensorType], ty: &TensorType, from_weights: bool) -> Option<Known> {
    match op {
        Op::Constant { value } => return Some(Known::Full(Arc::new(value.clone()))),
        Op::Input { .. } | Op::Parameter { .. } => return None,
        _ => {}
    }
    // Elementwise ops and broadcasts of single values stay single values.
    let splats: Option<Vec<Tensor>> = args.iter().map(|k| k.as_scalar()).collect();
    if let Some(scalars) = splats {
        if op.is_elementwise() || matches!(op, Op::Broadcast { .. } | Op::Reshape { .. }) {
            let scalar_ty = TensorType::new(ty.dtype, Shape::scalar());
            let scalar_op = match op {
                Op::Broadcast { .. } | Op::Reshape { .. } => None,
                _ => Some(op),
            };
            let value = match scalar_op {
                None => scalars.into_iter().next()?,
                Some(op) => {
                    let refs: Vec<&Tensor> = scalars.iter().collect();
                    eval_op(op, &refs, &scalar_ty).ok()?
                }
            };
            return Some(if ty.numel() == 1 {
                Known::Full(Arc::new(value.reshape(ty.shape.clone()).ok()?))
            } else {
                Known::Splat(Arc::new(value))
            });
        }
    }
    if matches!(op, Op::Broadcast { .. }) {
        return None; // a view: its operand is what gets folded
    }
    if matches!(op, Op::AttentionLse { .. } | Op::AttentionGrad { .. }) {
        return None; // attention's backward reads the forward pass: never all constant
    }
    if from_weights
        && matches!(op, Op::Transpose { .. } | Op::Reshape { .. } | Op::Slice { .. })
        && ty.size_bytes() > MAX_FOLDED_VIEW_BYTES
    {
        return None;
    }
    let largest_arg = args.iter().zip(arg_tys).map(|(k, t)| k.bytes(t)).max().unwrap_or(0);
    let allowance = if from_weights { 0 } else { MAX_FOLDED_BYTES };
    if ty.size_bytes() > allowance.max(largest_arg) {
        return None;
    }
    // Work is bounded before any is done: a splat operand is materialized to its full
    // type (a broadcast of one value to a batch-sized shape must not be allocated to
    // be reduced), and a matmul costs `m * n * k`.
    let splat_bytes: usize = args
        .iter()
        .zip(arg_tys)
        .filter(|(k, _)| matches!(k, Known::Splat(_)))
        .map(|(_, t)| t.size_bytes())
        .fold(0, usize::saturating_add);
    if splat_bytes > MAX_FOLDED_BYTES {
        return None;
    }
    if let (Op::MatMul, Some(a)) = (op, arg_tys.first()) {
        let k = a.shape.dims().last().copied().unwrap_or(1);
        if ty.numel().saturating_mul(k) > MAX_FOLDED_MATMUL_WORK {
            return None;
        }
    }
    if let Op::Attention { .. } = op {
        let dims = graphc_ir::AttentionDims::of(arg_tys).ok()?;
        let scores: usize = dims.score_dims().iter().product();
        if scores.saturating_mul(dims.d + dims.dv) > MAX_FOLDED_MATMUL_WORK {
            return None;
        }
    }
    // The elements a fold reads and writes (a matmul's products: `m * n * k`).
    let elements: usize = arg_tys
        .iter()
        .map(|t| t.numel())
        .fold(ty.numel(), usize::saturating_add);
    let products = match (op, arg_tys.first()) {
        (Op::MatMul, Some(a)) => ty.numel().saturating_mul(a.shape.dims().last().copied().unwrap_or(1)),
        _ => 0,
    };
    graphc_ir::work::add_len(graphc_ir::work::Stage::Optimize, elements.saturating_add(products));
    let dense: Vec<Tensor> = args.iter().zip(arg_tys).map(|(k, t)| k.materialize(t)).collect();
    // A fold of one mapped weight (a cast, a transpose) reads it through a transient
    // decoded copy, and is remembered for that weight's bytes: the weight stays a view
    // into its file, and a fit's probes (each importing the model again) fold it once.
    if let [w] = &dense[..] {
        if w.is_mapped() {
            let key = serde_json::to_string(op).ok()?;
            // A result of another type (a fold cache entry that is not what its key
            // says) is not taken: the fold is computed instead.
            return w
                .memoized_fold(&key, |w| eval_op(op, &[&w.detached()], ty).ok())
                .filter(|t| t.ty() == *ty)
                .or_else(|| eval_op(op, &[&w.detached()], ty).ok())
                .map(|t| Known::Full(Arc::new(t)));
        }
    }
    let dense: Vec<Tensor> = dense.iter().map(Tensor::detached).collect();
    let refs: Vec<&Tensor> = dense.iter().collect();
    eval_op(op, &refs, ty).ok().map(|t| Known::Full(Arc::new(t)))
}
