//! Composite layers, built from primitives (the decomposed forms front ends produce;
//! the fuser re-forms kernels from them).

use crate::{DType, Value};

/// Which GELU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GeluApprox {
    /// `0.5 x (1 + erf(x / sqrt 2))`.
    Erf,
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Tanh,
}

/// `exp(x - max) / sum(exp(x - max))` along `axis`.
pub fn softmax(x: Value<'_>, axis: i64) -> Value<'_> {
    let m = x.reduce_max(&[axis], true);
    let e = (x - m).exp();
    e / e.sum(&[axis], true)
}

/// `x - max - log(sum(exp(x - max)))` along `axis`.
pub fn log_softmax(x: Value<'_>, axis: i64) -> Value<'_> {
    let shifted = x - x.reduce_max(&[axis], true);
    shifted - shifted.exp().sum(&[axis], true).log()
}

/// Layer normalization over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`,
/// with the biased variance.
pub fn layer_norm<'b>(x: Value<'b>, gamma: Option<Value<'b>>, beta: Option<Value<'b>>, eps: f64) -> Value<'b> {
    let centered = x - x.mean(&[-1], true);
    let var = (centered * centered).mean(&[-1], true);
    let mut y = centered * (var + eps).rsqrt();
    if let Some(g) = gamma {
        y = y * g;
    }
    if let Some(b) = beta {
        y = y + b;
    }
    y
}

/// RMS normalization over the last axis: `x / sqrt(mean(x^2) + eps) * gamma`.
pub fn rms_norm<'b>(x: Value<'b>, gamma: Option<Value<'b>>, eps: f64) -> Value<'b> {
    let y = x * ((x * x).mean(&[-1], true) + eps).rsqrt();
    match gamma {
        Some(g) => y * g,
        None => y,
    }
}

/// GELU written out in primitives.
pub fn gelu(x: Value<'_>, approx: GeluApprox) -> Value<'_> {
    match approx {
        GeluApprox::Erf => x * 0.5 * ((x * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0),
        GeluApprox::Tanh => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let inner = (x + x * x * x * 0.044715) * c;
            x * 0.5 * (inner.tanh() + 1.0)
        }
    }
}

/// `x @ weight^T + bias`, with `weight` of shape `[out, in]` (PyTorch's layout).
pub fn linear<'b>(x: Value<'b>, weight: Value<'b>, bias: Option<Value<'b>>) -> Value<'b> {
    let y = x.matmul(weight.t());
    match bias {
        Some(b) => y + b,
        None => y,
    }
}

/// A `[seq, seq]` bool mask, true where key position <= query position.
pub fn causal_mask(like: Value<'_>, seq: usize) -> Value<'_> {
    let b = like.builder();
    let row = b.iota(DType::I64, [seq, seq], 0);
    let col = b.iota(DType::I64, [seq, seq], 1);
    col.le(row)
}

/// Multi-head causal self-attention on `qkv` of shape `[batch, seq, 3 * d]` (q, k, v
/// concatenated on the last axis); returns `[batch, seq, d]`.
pub fn causal_attention(qkv: Value<'_>, heads: usize) -> Value<'_> {
    let b = qkv.builder();
    let &[batch, seq, d3] = qkv.shape().dims() else {
        return b.fail(qkv, format!("causal attention needs qkv of rank 3, got {}", qkv.ty()));
    };
    let d = d3 / 3;
    let Some(hd) = d.checked_div(heads) else {
        return b.fail(qkv, "causal attention needs at least one head".to_string());
    };
    let split = |i: i64| {
        qkv.slice(-1, i * d as i64, (i + 1) * d as i64, 1)
            .reshape([batch, seq, heads, hd])
            .transpose(&[0, 2, 1, 3])
    };
    let (q, k, v) = (split(0), split(1), split(2));
    let scores = q.matmul(k.t()) * (1.0 / (hd as f64).sqrt());
    let mask = causal_mask(qkv, seq);
    let neg_inf = b.scalar(scores.dtype(), f64::NEG_INFINITY);
    let masked = b.select(mask, scores, neg_inf);
    let probs = softmax(masked, -1);
    probs.matmul(v).transpose(&[0, 2, 1, 3]).reshape([batch, seq, d])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GraphBuilder;

    #[test]
    fn bad_shapes_are_errors_not_panics() {
        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [4, 6]);
        b.output("y", causal_attention(x, 2));
        assert!(b.finish().unwrap_err().to_string().contains("needs qkv of rank 3"));

        let b = GraphBuilder::new();
        let x = b.input("x", DType::F32, [1, 4, 6]);
        b.output("y", causal_attention(x, 0));
        assert!(b.finish().unwrap_err().to_string().contains("at least one head"));

        let b = GraphBuilder::new();
        let s = b.input("s", DType::F32, [0usize; 0]);
        b.output("y", s.slice(0, 0, 1, 1));
        assert!(b
            .finish()
            .unwrap_err()
            .to_string()
            .contains("axis 0 out of range for rank 0"));
    }
}
