//! Ops outside tiers a–d that exported models use: `Conv` (as im2col + matmul, which
//! covers ViT's patch embedding and ordinary convolutions) and `GatherND` (BERT's
//! attention-mask construction).

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::{DType, SliceRange, Value};

pub const OPS: &[(&str, Lowering)] = &[("Conv", conv), ("GatherND", gather_nd)];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// N-d convolution with groups, strides, dilations and pads: each kernel offset takes a
/// strided slice of the padded input; the slices, stacked, form the columns that one
/// matmul per group contracts with the flattened weights.
fn conv<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (x, w) = (n.input(0)?, n.input(1)?);
    let (xs, ws) = (x.shape().0, w.shape().0);
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(format!(
            "Conv needs input [N, C, spatial...] and weights of the same rank, got {} and {}",
            x.ty(),
            w.ty()
        ));
    }
    let k = xs.len() - 2;
    let (batch, channels, spatial) = (xs[0], xs[1], &xs[2..]);
    let (out_channels, kernel) = (ws[0], &ws[2..]);
    let group = usize::try_from(n.attrs.int("group", 1)?).map_err(|_| "group must be positive")?;
    if group == 0 || channels % group != 0 || out_channels % group != 0 || ws[1] * group != channels {
        return Err(format!(
            "Conv group {group} does not divide input channels {channels} / output channels {out_channels} consistently with weights {}",
            w.ty()
        ));
    }
    let attr_or = |name: &str, default: i64, len: usize| -> Result<Vec<i64>, String> {
        let v = n.attrs.ints(name)?.unwrap_or_else(|| vec![default; len]);
        if v.len() != len {
            return Err(format!("Conv `{name}` has {} values, expected {len}", v.len()));
        }
        Ok(v)
    };
    if let Some(ks) = n.attrs.ints("kernel_shape")? {
        if ks.iter().map(|&d| d as usize).ne(kernel.iter().copied()) {
            return Err(format!("Conv kernel_shape {ks:?} differs from the weights {}", w.ty()));
        }
    }
    let strides = attr_or("strides", 1, k)?;
    let dilations = attr_or("dilations", 1, k)?;
    if strides.iter().chain(&dilations).any(|&s| s < 1) {
        return Err("Conv strides and dilations must be >= 1".into());
    }
    let auto_pad = n.attrs.string("auto_pad", "NOTSET")?;
    let mut pads = vec![(0i64, 0i64); k];
    match auto_pad.as_str() {
        "NOTSET" => {
            let p = attr_or("pads", 0, 2 * k)?;
            for i in 0..k {
                pads[i] = (p[i], p[i + k]);
            }
        }
        "VALID" => {}
        "SAME_UPPER" | "SAME_LOWER" => {
            for i in 0..k {
                let (s, d, kk, len) = (strides[i], dilations[i], kernel[i] as i64, spatial[i] as i64);
                let out = (len + s - 1) / s;
                let total = ((out - 1) * s + (kk - 1) * d + 1 - len).max(0);
                let small = total / 2;
                pads[i] = if auto_pad == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
            }
        }
        other => return Err(format!("Conv auto_pad `{other}` is not supported")),
    }
    let mut out_dims = Vec::with_capacity(k);
    for i in 0..k {
        let span = dilations[i] * (kernel[i] as i64 - 1) + 1;
        let padded = spatial[i] as i64 + pads[i].0 + pads[i].1;
        if padded < span {
            return Err(format!(
                "Conv kernel (extent {span}) is larger than the padded input ({padded}) on axis {}",
                i + 2
            ));
        }
        out_dims.push(((padded - span) / strides[i] + 1) as usize);
    }
    let out_total: usize = out_dims.iter().product();

    let mut all_pads = vec![(0, 0), (0, 0)];
    all_pads.extend(&pads);
    let xp = if pads.iter().any(|&p| p != (0, 0)) {
        x.pad(&all_pads, crate::PadMode::Constant, 0.0)
    } else {
        x
    };

    let positions: usize = kernel.iter().product();
    let b = x.builder();
    let patchify = pads.iter().all(|&p| p == (0, 0))
        && dilations.iter().all(|&d| d == 1)
        && strides.iter().zip(kernel).all(|(&s, &kk)| s as usize == kk);
    let cols = if patchify {
        // Non-overlapping patches (ViT's patch embedding): one reshape-transpose-reshape
        // instead of a slice per kernel offset. Trailing rows no patch covers are cut.
        let mut ranges = vec![SliceRange::full(); 2];
        ranges.extend((0..k).map(|i| SliceRange {
            start: 0,
            end: (out_dims[i] * kernel[i]) as i64,
            step: 1,
        }));
        let trimmed = if (0..k).any(|i| out_dims[i] * kernel[i] != spatial[i]) {
            x.slice_ranges(ranges)
        } else {
            x
        };
        let mut split = vec![batch, channels];
        for i in 0..k {
            split.extend([out_dims[i], kernel[i]]);
        }
        let mut perm = vec![0, 1];
        perm.extend((0..k).map(|i| 3 + 2 * i));
        perm.extend((0..k).map(|i| 2 + 2 * i));
        trimmed
            .reshape(split)
            .transpose(&perm)
            .reshape([batch, channels * positions, out_total])
    } else {
        im2col(
            xp,
            kernel,
            &strides,
            &dilations,
            &out_dims,
            [batch, channels, out_total],
        )
    };

    let (cg, mg) = (channels / group, out_channels / group);
    let mut ys = Vec::with_capacity(group);
    for g in 0..group {
        let cols_g = cols.slice(1, (g * cg * positions) as i64, ((g + 1) * cg * positions) as i64, 1);
        let w_g = w
            .slice(0, (g * mg) as i64, ((g + 1) * mg) as i64, 1)
            .reshape([mg, cg * positions]);
        ys.push(w_g.matmul(cols_g));
    }
    let mut y = if group == 1 { ys[0] } else { b.concat(&ys, 1) };
    if let Some(bias) = n.opt_input(2) {
        y = y + bias.reshape([out_channels, 1]);
    }
    let mut shape = vec![batch, out_channels];
    shape.extend(out_dims);
    Ok(vec![y.reshape(shape)])
}

/// `GatherND` with `batch_dims`: the last axis of `indices` addresses the data's next
/// axes; lowered to one flat gather.
fn gather_nd<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (data, idx) = (n.input(0)?, n.input(1)?);
    let (ds, is) = (data.shape().0, idx.shape().0);
    let bd = usize::try_from(n.attrs.int("batch_dims", 0)?).map_err(|_| "batch_dims must be >= 0")?;
    let r = is.len();
    if r == 0 || bd >= r || bd > ds.len() || ds[..bd] != is[..bd] {
        return Err(format!(
            "GatherND batch_dims {bd} does not fit data {} and indices {}",
            data.ty(),
            idx.ty()
        ));
    }
    let kk = is[r - 1];
    if bd + kk > ds.len() {
        return Err(format!(
            "GatherND indices address {kk} axes past the batch, data {} has fewer",
            data.ty()
        ));
    }
    let b = data.builder();
    let idx = idx.cast(DType::I64);
    // Flat index over data axes [0, bd + kk): batch position, then the addressed axes.
    let inner: Vec<usize> = ds[bd..bd + kk].to_vec();
    let inner_total: usize = inner.iter().product();
    let lead = &is[..r - 1];
    let mut flat = b
        .constant(crate::Tensor::scalar(DType::I64, 0.0))
        .broadcast_to(&crate::Shape::new(lead.to_vec()));
    let mut stride = 1usize;
    for j in (0..kk).rev() {
        let comp = idx.slice(-1, j as i64, j as i64 + 1, 1).reshape(lead.to_vec());
        let dim = inner[j] as f64;
        let comp = b.select(comp.lt(0.0), comp + dim, comp);
        flat = flat + comp * stride as f64;
        stride *= inner[j];
    }
    if bd > 0 {
        let mut batch_flat = b
            .constant(crate::Tensor::scalar(DType::I64, 0.0))
            .broadcast_to(&crate::Shape::new(lead.to_vec()));
        let mut s = 1usize;
        for j in (0..bd).rev() {
            batch_flat = batch_flat + b.iota(DType::I64, lead.to_vec(), j as i64) * s as f64;
            s *= ds[j];
        }
        flat = flat + batch_flat * inner_total as f64;
    }
    let batch_total: usize = ds[..bd].iter().product();
    let mut flat_shape = vec![batch_total * inner_total];
    flat_shape.extend_from_slice(&ds[bd + kk..]);
    let gathered = data.reshape(flat_shape).gather(flat, 0);
    Ok(vec![gathered])
}

/// Columns for a convolution as a matmul: one strided slice of the padded input per
/// kernel offset, in row-major kernel order, as `[batch, channels * positions, out]`.
fn im2col<'b>(
    xp: Value<'b>,
    kernel: &[usize],
    strides: &[i64],
    dilations: &[i64],
    out_dims: &[usize],
    [batch, channels, out_total]: [usize; 3],
) -> Value<'b> {
    let k = kernel.len();
    let positions: usize = kernel.iter().product();
    let mut cols = Vec::with_capacity(positions);
    for p in 0..positions {
        let mut rem = p;
        let mut offset = vec![0usize; k];
        for i in (0..k).rev() {
            offset[i] = rem % kernel[i];
            rem /= kernel[i];
        }
        let mut ranges = vec![SliceRange::full(); 2];
        for i in 0..k {
            let start = offset[i] as i64 * dilations[i];
            ranges.push(SliceRange {
                start,
                end: start + strides[i] * (out_dims[i] as i64 - 1) + 1,
                step: strides[i],
            });
        }
        cols.push(xp.slice_ranges(ranges).reshape([batch, channels, 1, out_total]));
    }
    xp.builder()
        .concat(&cols, 2)
        .reshape([batch, channels * positions, out_total])
}
