//! Losses, in primitives, as PyTorch defines them.
//!
//! - `mse`: `mean((pred - target)^2)` over every element (`nn.MSELoss()`).
//! - `cross-entropy`: over the last axis of the logits with integer labels of the
//!   leading shape, the mean over the tokens whose label is not `ignore_index`
//!   (`nn.CrossEntropyLoss(ignore_index=-100)`); with `shift_labels`, as Hugging Face's
//!   causal-LM loss, `logits[:, :-1]` against `labels[:, 1:]` (computed as the whole
//!   logits against the labels moved left, the last position ignored: the same loss). The label's log-probability
//!   is picked with a one-hot compare inside the row reduction (no gather, no
//!   probability tensor): `loss = -sum_valid (x[label] - max - log sum exp(x - max)) / n_valid`.

use graphc_ir::nn::log_softmax;
use graphc_ir::{DType, GraphBuilder, Shape, Tensor, TensorData, TensorType, Value};

use super::TrainError;

/// `chunks` of [`build`] that lets it choose the count: one part's logits about as
/// wide as an MLP's hidden.
pub const AUTO_PARTS: usize = usize::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossKind {
    Mse,
    CrossEntropy,
}

#[derive(Clone, Debug)]
pub struct Loss {
    pub kind: LossKind,
    /// The step input holding the targets (mse) or labels (cross-entropy).
    pub target: String,
    /// Cross-entropy: labels equal to this are not counted (PyTorch's default -100).
    pub ignore_index: i64,
    /// Cross-entropy: predict token t+1 from position t (Hugging Face causal LM).
    pub shift_labels: bool,
}

impl LossKind {
    pub fn name(self) -> &'static str {
        match self {
            LossKind::Mse => "mse",
            LossKind::CrossEntropy => "cross-entropy",
        }
    }
}

impl Loss {
    pub fn new(kind: LossKind, target: impl Into<String>) -> Loss {
        Loss {
            kind,
            target: target.into(),
            ignore_index: -100,
            shift_labels: false,
        }
    }

    /// Cross-entropy: every label the loss reads is a class (`0..classes`) or the
    /// ignore index, as PyTorch requires (its device assert); with shifted labels the
    /// first position's are not read. The error names the first label that is not and
    /// where it is. Other losses: nothing to check.
    pub fn check_labels(&self, labels: &Tensor, classes: usize) -> Result<(), String> {
        if self.kind != LossKind::CrossEntropy {
            return Ok(());
        }
        let values: Vec<i64> = match labels.data() {
            TensorData::I64(v) => v.clone(),
            TensorData::I32(v) => v.iter().map(|&x| i64::from(x)).collect(),
            other => {
                return Err(format!(
                    "the labels \"{}\" are {}, not integers",
                    self.target,
                    other.dtype()
                ))
            }
        };
        let dims = labels.shape().dims();
        // Elements per step of axis 1 (the sequence of shifted labels).
        let inner: usize = dims.get(2..).map_or(1, |d| d.iter().product());
        let seq = dims.get(1).copied().unwrap_or(1);
        for (i, &v) in values.iter().enumerate() {
            let unread = self.shift_labels && (i / inner.max(1)).is_multiple_of(seq.max(1));
            if unread || v == self.ignore_index || (0..classes as i64).contains(&v) {
                continue;
            }
            let mut at = Vec::with_capacity(dims.len());
            let mut rest = i;
            for &d in dims.iter().rev() {
                at.push(rest % d.max(1));
                rest /= d.max(1);
            }
            at.reverse();
            return Err(format!(
                "cross-entropy: label {v} at {at:?} of \"{}\" is not a class of the logits (0..{classes}) nor the ignore index {}",
                self.target, self.ignore_index
            ));
        }
        Ok(())
    }
}

pub(super) fn build<'b>(
    b: &'b GraphBuilder,
    loss: &Loss,
    pred: Value<'b>,
    target_ty: &TensorType,
    chunks: usize,
    parts_made: &mut usize,
    lm_head_seen: &mut bool,
) -> Result<Value<'b>, TrainError> {
    let pt = pred.ty();
    if !pt.dtype.is_float() {
        return Err(TrainError::Invalid(format!(
            "the loss reads a {pt} output; it must be float"
        )));
    }
    let all = |v: Value<'b>| (0..v.rank() as i64).collect::<Vec<_>>();
    match loss.kind {
        LossKind::Mse => {
            if target_ty.shape != pt.shape || !target_ty.dtype.is_float() {
                return Err(TrainError::Invalid(format!(
                    "mse: the target \"{}\" is {target_ty} but the prediction is {pt}",
                    loss.target
                )));
            }
            let t = b
                .input(&loss.target, target_ty.dtype, target_ty.shape.clone())
                .cast(pt.dtype);
            let d = pred - t;
            let sq = d * d;
            // The mean as the sum over the element count, the count computed from the
            // target (`t == t`; a NaN target makes the loss NaN either way) instead of
            // a constant `1 / numel` in the gradient: the step's graph is then the same
            // at every batch but for its sizes (a shape family, `graphc fit --train`).
            let count = t.eq(t).cast(pt.dtype);
            Ok(sq.sum(&all(sq), false) / count.sum(&all(count), false))
        }
        LossKind::CrossEntropy => {
            let pd = pt.shape.dims().to_vec();
            if pd.len() < 2
                || !matches!(target_ty.dtype, DType::I64 | DType::I32)
                || target_ty.shape.dims() != &pd[..pd.len() - 1]
            {
                return Err(TrainError::Invalid(format!(
                    "cross-entropy: the labels \"{}\" are {target_ty}; the logits {pt} need integer labels of shape {}",
                    loss.target,
                    Shape::from(pd[..pd.len().saturating_sub(1)].to_vec())
                )));
            }
            let labels = b
                .input(&loss.target, target_ty.dtype, target_ty.shape.clone())
                .cast(DType::I64);
            // Shifted labels: position t predicts token t+1. The logits stay whole and
            // the labels move instead (the last position gets `ignore_index`), which
            // is the same loss without a sliced copy of the logits or a padded copy of
            // their gradient.
            let (logits, labels) = if loss.shift_labels {
                if pd.len() < 3 || pd[1] < 2 {
                    return Err(TrainError::Invalid(format!(
                        "cross-entropy with shifted labels needs logits [batch, seq >= 2, classes], got {pt}"
                    )));
                }
                let s = pd[1] as i64;
                let mut tail = labels.shape().dims().to_vec();
                tail[1] = 1;
                let ignored = b
                    .scalar(DType::I64, loss.ignore_index as f64)
                    .broadcast_to(&Shape::from(tail));
                (pred, b.concat(&[labels.slice(1, 1, s, 1), ignored], 1))
            } else {
                (pred, labels)
            };
            // The summed log-probabilities of the labels of `logits` (valid ones).
            let picked_sum = |logits: Value<'b>, labels: Value<'b>| {
                let ld = logits.shape();
                let logp = log_softmax(logits, -1);
                let lab = labels.reshape(Shape::from([labels.shape().dims(), &[1]].concat()));
                // The class index along the last axis (one row of it, broadcast: parts of
                // a loss share it without sharing a tensor of their shape).
                let classes = Shape::from([*ld.dims().last().unwrap_or(&1)]);
                let hit = b
                    .iota(DType::I64, classes, 0)
                    .broadcast_to(&ld)
                    .eq(lab.broadcast_to(&ld));
                let zero = b.scalar(pt.dtype, 0.0).broadcast_to(&ld);
                let picked = b.select(hit, logp, zero).sum(&[-1], false);
                let vf = labels.ne(b.scalar(DType::I64, loss.ignore_index as f64)).cast(pt.dtype);
                (picked * vf).sum(&all(vf), false)
            };
            let valid = labels.ne(b.scalar(DType::I64, loss.ignore_index as f64));
            let vf = valid.cast(pt.dtype);
            let count = vf.sum(&all(vf), false);
            let head = lm_head(b, logits);
            *lm_head_seen = head.is_some();
            let total = match head.filter(|_| chunks > 1) {
                // The LM head and the loss over parts of the tokens: the logits'
                // rows (every axis but the classes, flattened: a part is a range of
                // tokens in order, a view of the hidden states), each part's logits
                // from its rows of `h` (the same sums: a GEMM row is the same whichever
                // rows go with it). The auto count divides the sequence, so a part's
                // bounds are a multiple of the batch: a step in parts is then the same
                // graph at every batch but for its sizes (a shape family).
                Some((h, w, bias)) => {
                    let classes = pd[pd.len() - 1];
                    let rows: usize = pd[..pd.len() - 1].iter().product();
                    let per_sequence = if pd.len() >= 3 { pd[pd.len() - 2] } else { rows };
                    let chunks = if chunks == AUTO_PARTS {
                        // One part's logits about as wide as an MLP's hidden (4 d).
                        let d = h.shape().dims().last().copied().unwrap_or(1).max(1);
                        let n = classes.div_ceil(4 * d).max(2);
                        (n..=2 * n).find(|k| per_sequence % k == 0).unwrap_or(n)
                    } else {
                        chunks
                    };
                    let parts = chunks.min(rows);
                    // The bias by rows (the logits' shape), or one row for all.
                    let bias = match bias {
                        Some(v) if v.shape() == pt.shape => Some(Some(v.reshape(Shape::from([rows, classes])))),
                        Some(v) if v.shape().dims().iter().rev().skip(1).all(|&d| d == 1) => {
                            Some(Some(v.reshape(Shape::from([classes]))))
                        }
                        Some(_) => None,
                        None => Some(None),
                    };
                    match bias {
                        Some(bias) => {
                            let d = h.shape().dims().last().copied().unwrap_or(1);
                            let h = h.reshape(Shape::from([rows, d]));
                            let labels = labels.reshape(Shape::from([rows]));
                            *parts_made = parts;
                            let mut total: Option<Value<'b>> = None;
                            for c in 0..parts {
                                let (s, e) = ((rows * c / parts) as i64, (rows * (c + 1) / parts) as i64);
                                let mut logits = h.slice(0, s, e, 1).matmul(w);
                                if let Some(bias) = bias {
                                    logits = logits + if bias.rank() == 2 { bias.slice(0, s, e, 1) } else { bias };
                                }
                                let part = picked_sum(logits, labels.slice(0, s, e, 1));
                                total = Some(match total {
                                    Some(t) => t + part,
                                    None => part,
                                });
                            }
                            total.unwrap_or_else(|| picked_sum(logits, labels))
                        }
                        // A bias that varies along some rows but not all: whole.
                        None => picked_sum(logits, labels),
                    }
                }
                None => picked_sum(logits, labels),
            };
            Ok(-(total / count))
        }
    }
}

/// The hidden states, weight and bias of an LM head `logits = h @ w (+ bias)` (`h`
/// `[batch, ..]`, `w` a matrix, the bias a value that does not depend on `h`, as
/// BERT's decoder has), when `logits` is one.
fn lm_head<'b>(b: &'b GraphBuilder, logits: Value<'b>) -> Option<(Value<'b>, Value<'b>, Option<Value<'b>>)> {
    let node = |v: graphc_ir::NodeId| {
        b.with_graph(|g| {
            let n = g.node(v);
            (n.op.clone(), n.inputs.clone())
        })
    };
    let matmul = |v: graphc_ir::NodeId| match node(v) {
        (graphc_ir::Op::MatMul, inputs) => match inputs.as_slice() {
            [h, w] => {
                let (h, w) = (b.value(*h)?, b.value(*w)?);
                (h.rank() >= 2 && w.rank() == 2).then_some((h, w))
            }
            _ => None,
        },
        _ => None,
    };
    if let Some((h, w)) = matmul(logits.id()) {
        return Some((h, w, None));
    }
    // `matmul + bias`, the bias not computed from the hidden states.
    let (graphc_ir::Op::Binary(graphc_ir::BinaryOp::Add), inputs) = node(logits.id()) else {
        return None;
    };
    let [x, y] = inputs.as_slice() else { return None };
    for (m, bias) in [(*x, *y), (*y, *x)] {
        if let Some((h, w)) = matmul(m) {
            let depends = b.with_graph(|g| depends_on(g, bias, h.id()));
            if !depends {
                return Some((h, w, Some(b.value(bias)?)));
            }
        }
    }
    None
}

/// Whether `v` is computed from `of`.
fn depends_on(g: &graphc_ir::Graph, v: graphc_ir::NodeId, of: graphc_ir::NodeId) -> bool {
    let mut stack = vec![v];
    let mut seen = std::collections::HashSet::new();
    while let Some(x) = stack.pop() {
        if x == of {
            return true;
        }
        if seen.insert(x) {
            stack.extend(g.node(x).inputs.iter().copied());
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(v: &[i64]) -> Tensor {
        Tensor::new([2, 3], TensorData::I64(v.to_vec())).unwrap()
    }

    #[test]
    fn labels_must_be_classes_or_ignored_where_the_loss_reads_them() {
        let mut loss = Loss::new(LossKind::CrossEntropy, "labels");
        assert!(loss.check_labels(&labels(&[0, 4, -100, 1, 2, 3]), 5).is_ok());
        let err = loss.check_labels(&labels(&[0, 4, -100, 1, 5, 3]), 5).unwrap_err();
        assert!(err.contains("label 5 at [1, 1] of \"labels\""), "{err}");
        assert!(loss.check_labels(&labels(&[-1, 0, 0, 0, 0, 0]), 5).is_err());
        // Shifted: the first position of each row is never read.
        loss.shift_labels = true;
        assert!(loss.check_labels(&labels(&[7, 0, 1, 9, 2, 3]), 5).is_ok());
        let err = loss.check_labels(&labels(&[7, 0, 1, 9, 2, 8]), 5).unwrap_err();
        assert!(err.contains("label 8 at [1, 2]"), "{err}");
        loss.ignore_index = 9;
        assert!(loss.check_labels(&labels(&[0, 9, 1, 0, 2, 3]), 5).is_ok());
        // MSE targets are not labels.
        assert!(Loss::new(LossKind::Mse, "y").check_labels(&labels(&[9; 6]), 5).is_ok());
    }
}
