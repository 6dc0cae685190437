//! `Attention` (opset 23, 24) and `RotaryEmbedding` (opset 23): ONNX's own attention
//! ops, as the ONNX reference defines them.
//!
//! `Attention` becomes the IR's `attention` op: q, k and v as `[b, heads, seq, head]`
//! (3-D operands `[b, seq, heads * head]` split with `q_num_heads` / `kv_num_heads`),
//! grouped-query heads read from the kv heads, `scale` (default `1/sqrt(head)`),
//! `is_causal` (top-left aligned), and an `attn_mask` that is boolean (true keeps a
//! key; false becomes `-inf`) or float (added), of any rank up to 4, broadcast, and
//! padded with masked keys when shorter than the keys; opset 24's `nonpad_kv_seqlen`
//! masks each batch entry's keys from its length on. The mask stays at its own shape
//! (a padding mask `[b, 1, 1, s]` is never expanded). A row whose keys are all masked
//! (a padding-only sequence) gives 0 (`zero_masked_rows`), as ONNX Runtime and PyTorch's
//! `scaled_dot_product_attention` give it; the spec says nothing of such rows, and the
//! ONNX reference's NumPy softmax makes them NaN. With `softcap` (scores become `softcap *
//! tanh(scores / softcap)` before the mask) the op is spelled out in primitives
//! instead, since the attention kernel has no soft cap; so is the optional
//! `qk_matmul_output` (mode 0: the scaled `q kᵀ`), which is the score matrix itself.
//! A KV cache (`past_key` / `past_value` inputs, `present_key` / `present_value`
//! outputs) and `qk_matmul_output_mode` other than 0 are refused with an error.
//!
//! `RotaryEmbedding` rotates the first `rotary_embedding_dim` (default: all) channels of
//! each head by the cos/sin caches (gathered by `position_ids` when given), in halves
//! or `interleaved` pairs, of a `[b, heads, seq, head]` or `[b, seq, heads * head]`
//! (with `num_heads`) input.

use super::Node;
use crate::onnx::import::Importer;
use crate::{nn, DType, Shape, Value};

type Out<'b> = Result<Vec<Value<'b>>, String>;

pub const OPS: &[(&str, super::Lowering)] = &[("Attention", attention), ("RotaryEmbedding", rotary_embedding)];

/// Whether output `i` of the node is asked for (present and named).
fn wants_output(n: &Node<'_, '_>, i: usize) -> bool {
    n.proto.output.get(i).is_some_and(|o| !o.is_empty())
}

/// A positive integer attribute.
fn positive(n: &Node<'_, '_>, name: &str) -> Result<Option<usize>, String> {
    match n.attrs.int_opt(name)? {
        None => Ok(None),
        Some(x) if x > 0 => usize::try_from(x)
            .map(Some)
            .map_err(|_| format!("{name} {x} is too large")),
        Some(x) => Err(format!("{name} must be positive, got {x}")),
    }
}

/// The dims of a value of rank `N`.
fn dims<const N: usize>(x: Value<'_>, what: &str) -> Result<[usize; N], String> {
    <[usize; N]>::try_from(x.shape().0).map_err(|_| format!("{what} {} is not of rank {N}", x.ty()))
}

/// A 3-D `[b, s, heads * head]` operand as `[b, heads, s, head]`.
fn split_heads<'b>(x: Value<'b>, heads: usize, what: &str) -> Result<Value<'b>, String> {
    let [b, s, hidden] = dims(x, what)?;
    if hidden % heads != 0 {
        return Err(format!(
            "Attention: {what} {} has a hidden size {hidden} that {heads} heads do not divide",
            x.ty()
        ));
    }
    Ok(x.reshape([b, s, heads, hidden / heads]).transpose(&[0, 2, 1, 3]))
}

/// `[b, hkv, s, d]` with each head repeated `group` times, `[b, hkv * group, s, d]`.
fn repeat_heads(x: Value<'_>, group: usize) -> Value<'_> {
    let Ok([b, h, s, d]) = dims::<4>(x, "k/v") else {
        return x;
    };
    if group == 1 {
        return x;
    }
    x.reshape([b, h, 1, s, d])
        .broadcast_to(&Shape::new([b, h, group, s, d]))
        .reshape([b, h * group, s, d])
}

/// The additive mask of a condition: 0 where `keep` holds, `-inf` elsewhere, in
/// `dtype` at `keep`'s shape.
fn additive<'b>(imp: &Importer<'b>, keep: Value<'b>, dtype: DType) -> Value<'b> {
    let s = keep.shape();
    let zero = imp.scalar(dtype, 0.0).broadcast_to(&s);
    let fill = imp.scalar(dtype, f64::NEG_INFINITY).broadcast_to(&s);
    keep.builder().select(keep, zero, fill)
}

/// The additive mask, in the scores' dtype at its own shape (rank 4, each dim 1 or the
/// scores'), of `attn_mask` and `nonpad_kv_seqlen`; `None` when neither is given.
fn additive_mask<'b>(
    imp: &Importer<'b>,
    n: &Node<'_, 'b>,
    dtype: DType,
    scores: [usize; 4],
) -> Result<Option<Value<'b>>, String> {
    let [b, _, _, sk] = scores;
    let mut mask = None;
    if let Some(m) = n.opt_input(3) {
        let boolean = m.dtype() == DType::Bool;
        if !boolean && m.dtype() != dtype {
            return Err(format!(
                "Attention: attn_mask {} must be bool or the dtype of q ({dtype})",
                m.ty()
            ));
        }
        let md = m.shape().0;
        let (Some(&last), true) = (md.last(), md.len() <= 4) else {
            return Err(format!("Attention: attn_mask {} must have rank 1 to 4", m.ty()));
        };
        let m = match last.cmp(&sk) {
            std::cmp::Ordering::Less => {
                // Keys past the mask are masked out.
                let mut pads = vec![(0, 0); md.len() - 1];
                pads.push((0, (sk - last) as i64));
                m.pad(
                    &pads,
                    crate::PadMode::Constant,
                    if boolean { 0.0 } else { f64::NEG_INFINITY },
                )
            }
            std::cmp::Ordering::Equal => m,
            std::cmp::Ordering::Greater => {
                return Err(format!(
                    "Attention: attn_mask {} has more keys ({last}) than k and v ({sk})",
                    m.ty()
                ))
            }
        };
        let mut d4 = vec![1; 4 - md.len()];
        d4.extend_from_slice(&m.shape().0);
        if d4.iter().zip(&scores).any(|(&a, &s)| a != 1 && a != s) {
            return Err(format!(
                "Attention: attn_mask {} does not broadcast to the scores {scores:?}",
                m.ty()
            ));
        }
        let m = m.reshape(d4);
        mask = Some(if boolean { additive(imp, m, dtype) } else { m });
    }
    if let Some(len) = n.opt_input(6) {
        if !len.dtype().is_int() || len.shape().0 != [b] {
            return Err(format!(
                "Attention: nonpad_kv_seqlen {} must be integers [{b}]",
                len.ty()
            ));
        }
        // Keys j >= len[b] of batch entry b are masked out.
        let keys = len.builder().iota(DType::I64, [b, 1, 1, sk], 3);
        let keep = keys.lt(len.cast(DType::I64).reshape([b, 1, 1, 1]));
        let pad = additive(imp, keep, dtype);
        mask = Some(match mask {
            None => pad,
            Some(m) => m + pad,
        });
    }
    Ok(mask)
}

fn attention<'b>(imp: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (q, k, v) = (n.input(0)?, n.input(1)?, n.input(2)?);
    if n.opt_input(4).is_some() || n.opt_input(5).is_some() || wants_output(n, 1) || wants_output(n, 2) {
        return Err(
            "Attention with a KV cache (past_key / past_value inputs, present_key / present_value \
                    outputs) is not supported: graphc compiles attention over whole sequences"
                .into(),
        );
    }
    let mode = n.attrs.int("qk_matmul_output_mode", 0)?;
    if mode != 0 {
        return Err(format!(
            "Attention qk_matmul_output_mode {mode} is not supported (only 0, the scaled q kᵀ)"
        ));
    }
    let dtype = q.dtype();
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype {
        return Err(format!(
            "Attention needs float q, k, v of one dtype, got {}, {}, {}",
            q.ty(),
            k.ty(),
            v.ty()
        ));
    }
    let rank = q.rank();
    if ![3, 4].contains(&rank) || k.rank() != rank || v.rank() != rank {
        return Err(format!(
            "Attention needs q, k, v all 3-D or all 4-D, got {}, {}, {}",
            q.ty(),
            k.ty(),
            v.ty()
        ));
    }
    let (q, k, v) = if rank == 3 {
        let (Some(hq), Some(hkv)) = (positive(n, "q_num_heads")?, positive(n, "kv_num_heads")?) else {
            return Err("Attention with 3-D q, k, v needs the q_num_heads and kv_num_heads attributes".into());
        };
        (
            split_heads(q, hq, "q")?,
            split_heads(k, hkv, "k")?,
            split_heads(v, hkv, "v")?,
        )
    } else {
        (q, k, v)
    };
    let ([b, hq, sq, d], [kb, hkv, sk, kdim], [vb, vh, vs, _]) = (dims(q, "q")?, dims(k, "k")?, dims(v, "v")?);
    if kb != b || vb != b || kdim != d || vh != hkv || vs != sk {
        return Err(format!(
            "Attention needs q [b, hq, sq, d], k [b, hkv, sk, d], v [b, hkv, sk, dv], got {}, {}, {}",
            q.ty(),
            k.ty(),
            v.ty()
        ));
    }
    if hkv == 0 || hq % hkv != 0 {
        return Err(format!(
            "Attention needs the query heads ({hq}) a multiple of the key/value heads ({hkv})"
        ));
    }
    let scale = match n.attrs.float_opt("scale")? {
        Some(s) => f64::from(s),
        None if d > 0 => 1.0 / (d as f64).sqrt(),
        None => 1.0,
    };
    let causal = n.attrs.int("is_causal", 0)? != 0;
    let softcap = f64::from(n.attrs.float("softcap", 0.0)?);
    let scores = [b, hq, sq, sk];
    let mask = additive_mask(imp, n, dtype, scores)?;
    let bld = q.builder();
    let spelled_scores = || {
        // The reference's order: q and kᵀ each times √scale, then the product.
        let root = scale.sqrt();
        let kr = repeat_heads(k, hq / hkv);
        (q * root).matmul(kr.t() * root)
    };
    let y = if softcap > 0.0 {
        let s = spelled_scores();
        let mut s = (s / softcap).tanh() * softcap;
        if causal {
            let full = Shape::new(scores);
            let i = bld.iota(DType::I64, [1, 1, sq, sk], 2);
            let j = bld.iota(DType::I64, [1, 1, sq, sk], 3);
            s = s + additive(imp, j.le(i), dtype).broadcast_to(&full);
        }
        if let Some(m) = mask {
            s = s + m;
        }
        let p = nn::softmax(s, -1);
        let zero = imp.scalar(dtype, 0.0).broadcast_to(&p.shape());
        bld.select(p.isnan(), zero, p).matmul(repeat_heads(v, hq / hkv))
    } else {
        let flags = crate::interp::attention::Flags {
            scale,
            causal,
            zero_masked_rows: true,
        };
        let mask = mask.map(|m| m.broadcast_to(&Shape::new(scores)));
        bld.attention_flags((q, k, v), mask, flags)
    };
    let y = if rank == 3 {
        let [_, _, _, dv] = dims(y, "the output")?;
        y.transpose(&[0, 2, 1, 3]).reshape([b, sq, hq * dv])
    } else {
        y
    };
    let mut out = vec![y];
    if n.num_outputs() > 1 {
        // present_key and present_value are refused above when asked for; unnamed
        // ones get a placeholder that nothing reads.
        out.push(y);
        out.push(y);
    }
    if wants_output(n, 3) {
        out.push(spelled_scores());
    } else if n.num_outputs() > 3 {
        out.push(y);
    }
    out.truncate(n.num_outputs().max(1));
    Ok(out)
}

fn rotary_embedding<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (x, cos, sin) = (n.input(0)?, n.input(1)?, n.input(2)?);
    let dtype = x.dtype();
    if !dtype.is_float() || cos.dtype() != dtype || sin.dtype() != dtype {
        return Err(format!(
            "RotaryEmbedding needs a float input and caches of its dtype, got {}, {}, {}",
            x.ty(),
            cos.ty(),
            sin.ty()
        ));
    }
    // As [b, s, heads, head].
    let xd = x.shape().0;
    let x4 = match *xd.as_slice() {
        [_, _, _, _] => x.transpose(&[0, 2, 1, 3]),
        [b, s, hidden] => {
            let heads =
                positive(n, "num_heads")?.ok_or("RotaryEmbedding with a 3-D input needs the num_heads attribute")?;
            if hidden % heads != 0 {
                return Err(format!(
                    "RotaryEmbedding: {heads} heads do not divide the hidden size of {}",
                    x.ty()
                ));
            }
            x.reshape([b, s, heads, hidden / heads])
        }
        _ => return Err(format!("RotaryEmbedding needs a 3-D or 4-D input, got {}", x.ty())),
    };
    let [b, s, h, head] = dims(x4, "RotaryEmbedding input")?;
    let rd = match n.attrs.int("rotary_embedding_dim", 0)? {
        0 => head,
        r if r > 0 && r as u64 <= head as u64 && r % 2 == 0 => r as usize,
        r => {
            return Err(format!(
                "RotaryEmbedding rotary_embedding_dim {r} must be even and at most the head size {head}"
            ))
        }
    };
    if head % 2 != 0 && rd == head {
        return Err(format!("RotaryEmbedding needs an even head size, got {head}"));
    }
    let half = rd / 2;
    // The caches as [b, s, 1, rd / 2].
    let (cos, sin) = match n.opt_input(3) {
        Some(pos) => {
            if !pos.dtype().is_int() || pos.shape().0 != [b, s] {
                return Err(format!(
                    "RotaryEmbedding position_ids {} must be integers [{b}, {s}]",
                    pos.ty()
                ));
            }
            if cos.rank() != 2 || sin.shape() != cos.shape() {
                return Err(format!(
                    "RotaryEmbedding with position_ids needs caches [max_position, {half}], got {} and {}",
                    cos.ty(),
                    sin.ty()
                ));
            }
            (cos.gather(pos, 0), sin.gather(pos, 0))
        }
        None => (cos, sin),
    };
    if cos.shape().0 != [b, s, half] || sin.shape() != cos.shape() {
        return Err(format!(
            "RotaryEmbedding caches must be [{b}, {s}, {half}] (or [max_position, {half}] with position_ids), got {} and {}",
            cos.ty(),
            sin.ty()
        ));
    }
    let (cos, sin) = (cos.reshape([b, s, 1, half]), sin.reshape([b, s, 1, half]));
    let interleaved = n.attrs.int("interleaved", 0)? != 0;
    let rot = x4.slice(3, 0, rd as i64, 1);
    let (x1, x2) = if interleaved {
        (rot.slice(3, 0, rd as i64, 2), rot.slice(3, 1, rd as i64, 2))
    } else {
        (rot.slice(3, 0, half as i64, 1), rot.slice(3, half as i64, rd as i64, 1))
    };
    let real = cos * x1 - sin * x2;
    let imag = sin * x1 + cos * x2;
    let bld = x.builder();
    let rotated = if interleaved {
        let pair = [b, s, h, half, 1];
        bld.concat(&[real.reshape(pair), imag.reshape(pair)], 4)
            .reshape([b, s, h, rd])
    } else {
        bld.concat(&[real, imag], 3)
    };
    let y = if rd < head {
        bld.concat(&[rotated, x4.slice(3, rd as i64, head as i64, 1)], 3)
    } else {
        rotated
    };
    Ok(vec![match xd.len() {
        4 => y.transpose(&[0, 2, 1, 3]),
        _ => y.reshape(xd),
    }])
}
