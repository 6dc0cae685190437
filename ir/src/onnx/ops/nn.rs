//! Ops outside tiers a–d that exported models use: `Conv` (an [`crate::Op::Conv`]; a
//! patchifying one — ViT's patch embedding — as a reshape and one matmul) and
//! `GatherND` (BERT's attention-mask construction).

use super::{Lowering, Node};
use crate::onnx::import::Importer;
use crate::shape::MAX_ELEMENTS;

use crate::{DType, Shape, SliceRange, Value, Window};

pub const OPS: &[(&str, Lowering)] = &[("Conv", conv), ("GatherND", gather_nd)];

type Out<'b> = Result<Vec<Value<'b>>, String>;

/// One spatial axis of a convolution: the input and kernel extents, the attributes and
/// the output extent.
#[derive(Clone, Copy)]
pub(super) struct ConvAxis {
    pub(super) len: usize,
    pub(super) kernel: usize,
    pub(super) stride: i64,
    pub(super) dilation: i64,
    pub(super) pads: (i64, i64),
    pub(super) out: usize,
}

/// A shape that must fit graphc's element limit, or an error naming `what` it is.
fn conv_shape(dims: Vec<usize>, what: &str) -> Result<Shape, String> {
    let s = Shape::new(dims);
    if s.checked_numel().is_none() {
        return Err(format!(
            "Conv {what} {s} is too large (more than {MAX_ELEMENTS} elements)"
        ));
    }
    Ok(s)
}

/// The `len` values of a Conv list attribute (`default` each when absent).
fn conv_ints(n: &Node<'_, '_>, name: &str, default: i64, len: usize) -> Result<Vec<i64>, String> {
    let v = n.attrs.ints(name)?.unwrap_or_else(|| vec![default; len]);
    if v.len() != len {
        return Err(format!("Conv `{name}` has {} values, expected {len}", v.len()));
    }
    Ok(v)
}

/// The pads `auto_pad` SAME_UPPER / SAME_LOWER gives an axis: the output extent is
/// `ceil(len / stride)`, the total pad split evenly, the odd one at the end (upper) or
/// start (lower). In i128, as the attributes are any i64.
fn same_pads(len: usize, kernel: usize, stride: i64, dilation: i64, upper: bool) -> Option<(i64, i64)> {
    let (s, d, kk, len) = (i128::from(stride), i128::from(dilation), kernel as i128, len as i128);
    let out = (len + s - 1) / s;
    let total = ((out - 1) * s + (kk - 1) * d + 1 - len).max(0);
    let small = total / 2;
    let (lo, hi) = if upper {
        (small, total - small)
    } else {
        (total - small, small)
    };
    Some((i64::try_from(lo).ok()?, i64::try_from(hi).ok()?))
}

/// The spatial axes of a convolution of `spatial` by `kernel`, from the node's strides,
/// dilations, pads and auto_pad, each checked: lists of one value per axis (pads: two),
/// strides and dilations >= 1, a kernel that fits the padded input, and a padded input
/// and output graphc can hold (`lead` are the batch and channel extents).
pub(super) fn conv_axes(
    n: &Node<'_, '_>,
    spatial: &[usize],
    kernel: &[usize],
    lead: [usize; 2],
) -> Result<Vec<ConvAxis>, String> {
    let k = kernel.len();
    let strides = conv_ints(n, "strides", 1, k)?;
    let dilations = conv_ints(n, "dilations", 1, k)?;
    if strides.iter().chain(&dilations).any(|&s| s < 1) {
        return Err("Conv strides and dilations must be >= 1".into());
    }
    let auto_pad = n.attrs.string("auto_pad", "NOTSET")?;
    let mut axes: Vec<ConvAxis> = spatial
        .iter()
        .zip(kernel)
        .zip(strides.iter().zip(&dilations))
        .map(|((&len, &kernel), (&stride, &dilation))| ConvAxis {
            len,
            kernel,
            stride,
            dilation,
            pads: (0, 0),
            out: 0,
        })
        .collect();
    match auto_pad.as_str() {
        "NOTSET" => {
            let p = conv_ints(n, "pads", 0, 2 * k)?;
            let (lo, hi) = p.split_at(k.min(p.len()));
            for (a, (&lo, &hi)) in axes.iter_mut().zip(lo.iter().zip(hi)) {
                a.pads = (lo, hi);
            }
        }
        "VALID" => {}
        "SAME_UPPER" | "SAME_LOWER" => {
            for (i, a) in axes.iter_mut().enumerate() {
                a.pads = same_pads(a.len, a.kernel, a.stride, a.dilation, auto_pad == "SAME_UPPER")
                    .ok_or_else(|| format!("Conv auto_pad {auto_pad} pads of axis {} overflow", i + 2))?;
            }
        }
        other => return Err(format!("Conv auto_pad `{other}` is not supported")),
    }
    let mut padded_dims = lead.to_vec();
    for (i, a) in axes.iter_mut().enumerate() {
        // In i128: extents, dilations and pads are any i64.
        let span = i128::from(a.dilation) * (a.kernel as i128 - 1) + 1;
        let padded = a.len as i128 + i128::from(a.pads.0) + i128::from(a.pads.1);
        if padded < span {
            return Err(format!(
                "Conv kernel (extent {span}) is larger than the padded input ({padded}) on axis {}",
                i + 2
            ));
        }
        let too_large = || format!("Conv padded input extent {padded} of axis {} is too large", i + 2);
        padded_dims.push(usize::try_from(padded).map_err(|_| too_large())?);
        a.out = usize::try_from((padded - span) / i128::from(a.stride) + 1).map_err(|_| too_large())?;
    }
    conv_shape(padded_dims, "padded input")?;
    Ok(axes)
}

/// N-d convolution with groups, strides, dilations and pads: each kernel offset takes a
/// strided slice of the padded input; the slices, stacked, form the columns that one
/// matmul per group contracts with the flattened weights.
fn conv<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (x, w) = (n.input(0)?, n.input(1)?);
    let (xs, ws) = (x.shape().0, w.shape().0);
    let bad_ranks = || {
        format!(
            "Conv needs input [N, C, spatial...] and weights of the same rank, got {} and {}",
            x.ty(),
            w.ty()
        )
    };
    let (&[batch, channels, ref spatial @ ..], &[out_channels, w_channels, ref kernel @ ..]) =
        (xs.as_slice(), ws.as_slice())
    else {
        return Err(bad_ranks());
    };
    if spatial.is_empty() || kernel.len() != spatial.len() {
        return Err(bad_ranks());
    }
    let k = spatial.len();
    let group = usize::try_from(n.attrs.int("group", 1)?).map_err(|_| "group must be positive")?;
    if group == 0
        || channels % group != 0
        || out_channels % group != 0
        || w_channels.checked_mul(group) != Some(channels)
    {
        return Err(format!(
            "Conv group {group} does not divide input channels {channels} / output channels {out_channels} consistently with weights {}",
            w.ty()
        ));
    }
    if let Some(ks) = n.attrs.ints("kernel_shape")? {
        if ks.iter().map(|&d| d as usize).ne(kernel.iter().copied()) {
            return Err(format!("Conv kernel_shape {ks:?} differs from the weights {}", w.ty()));
        }
    }
    if kernel.contains(&0) {
        return Err(format!("Conv weights {} have an empty kernel", w.ty()));
    }
    let axes = conv_axes(n, spatial, kernel, [batch, channels])?;
    let mut out_shape = vec![batch, out_channels];
    out_shape.extend(axes.iter().map(|a| a.out));
    let out_shape = conv_shape(out_shape, "output")?;
    let out_total: usize = axes.iter().map(|a| a.out).product();
    if k > 3 {
        return Err(format!("Conv over {k} spatial axes: graphc convolves over 1 to 3"));
    }
    let patchify = axes
        .iter()
        .all(|a| a.pads == (0, 0) && a.dilation == 1 && a.stride as usize == a.kernel);
    let bias = n.opt_input(2);
    if patchify {
        let mut y = patches(x, w, &axes, group, out_total);
        if let Some(bias) = bias {
            y = y + bias.reshape([out_channels, 1]);
        }
        return Ok(vec![y.reshape(out_shape)]);
    }
    {
        // A negative pad crops: the input is sliced, the window pads by 0 there.
        let crop = axes.iter().any(|a| a.pads.0 < 0 || a.pads.1 < 0);
        let xc = if crop {
            let mut ranges = vec![SliceRange::full(); 2];
            ranges.extend(axes.iter().map(|a| SliceRange {
                start: (-a.pads.0).max(0),
                end: a.len as i64 + a.pads.1.min(0),
                step: 1,
            }));
            x.slice_ranges(ranges)
        } else {
            x
        };
        let window = Window {
            strides: axes.iter().map(|a| a.stride as usize).collect(),
            pads: axes
                .iter()
                .map(|a| (a.pads.0.max(0) as usize, a.pads.1.max(0) as usize))
                .collect(),
            dilations: axes.iter().map(|a| a.dilation as usize).collect(),
        };
        let mut y = xc.conv(w, window, group);
        if let Some(bias) = bias {
            let mut along_channels = vec![out_channels];
            along_channels.extend(std::iter::repeat_n(1, k));
            y = y + bias.reshape(along_channels);
        }
        Ok(vec![y])
    }
}

/// A convolution whose windows tile the input (stride = kernel, no pad or dilation;
/// ViT's patch embedding): the patches by one reshape-transpose-reshape, then one
/// matmul per group, as `[batch, out_channels, out_total]`.
fn patches<'b>(x: Value<'b>, w: Value<'b>, axes: &[ConvAxis], group: usize, out_total: usize) -> Value<'b> {
    let (xs, ws) = (x.shape().0, w.shape().0);
    let (&[batch, channels, ..], &[out_channels, ..]) = (xs.as_slice(), ws.as_slice()) else {
        return x;
    };
    let k = axes.len();
    let positions: usize = axes.iter().map(|a| a.kernel).product();
    let rows = channels * positions;
    // Trailing rows no patch covers are cut.
    let mut ranges = vec![SliceRange::full(); 2];
    ranges.extend(axes.iter().map(|a| SliceRange {
        start: 0,
        end: (a.out * a.kernel) as i64,
        step: 1,
    }));
    let trimmed = if axes.iter().any(|a| a.out * a.kernel != a.len) {
        x.slice_ranges(ranges)
    } else {
        x
    };
    let mut split = vec![batch, channels];
    split.extend(axes.iter().flat_map(|a| [a.out, a.kernel]));
    let mut perm = vec![0, 1];
    perm.extend((0..k).map(|i| 3 + 2 * i));
    perm.extend((0..k).map(|i| 2 + 2 * i));
    let cols = trimmed
        .reshape(split)
        .transpose(&perm)
        .reshape([batch, rows, out_total]);
    let (cg, mg) = (channels / group, out_channels / group);
    let ys: Vec<Value<'b>> = (0..group)
        .map(|g| {
            let cols_g = cols.slice(1, (g * cg * positions) as i64, ((g + 1) * cg * positions) as i64, 1);
            let w_g = w
                .slice(0, (g * mg) as i64, ((g + 1) * mg) as i64, 1)
                .reshape([mg, cg * positions]);
            w_g.matmul(cols_g)
        })
        .collect();
    match ys.as_slice() {
        [y] => *y,
        _ => x.builder().concat(&ys, 1),
    }
}

/// `GatherND` with `batch_dims`: the last axis of `indices` addresses the data's next
/// axes; lowered to one flat gather.
fn gather_nd<'b>(_: &mut Importer<'b>, n: &Node<'_, 'b>) -> Out<'b> {
    let (data, idx) = (n.input(0)?, n.input(1)?);
    let (ds, is) = (data.shape().0, idx.shape().0);
    let bd = usize::try_from(n.attrs.int("batch_dims", 0)?).map_err(|_| "batch_dims must be >= 0")?;
    let misfit = || {
        format!(
            "GatherND batch_dims {bd} does not fit data {} and indices {}",
            data.ty(),
            idx.ty()
        )
    };
    // `lead`: the indices' axes but the last; its first `bd` are the batch axes.
    let (&kk, lead) = is.split_last().ok_or_else(misfit)?;
    let (batch, rest) = ds.split_at_checked(bd).ok_or_else(misfit)?;
    if lead.get(..bd) != Some(batch) {
        return Err(misfit());
    }
    let (inner, tail) = rest.split_at_checked(kk).ok_or_else(|| {
        format!(
            "GatherND indices address {kk} axes past the batch, data {} has fewer",
            data.ty()
        )
    })?;
    let b = data.builder();
    let idx = idx.cast(DType::I64);
    // Flat index over data axes [0, bd + kk): batch position, then the addressed axes.
    // Products of part of a shape are within graphc's element limit.
    let inner_total: usize = inner.iter().product();
    let mut flat = b
        .constant(crate::Tensor::scalar(DType::I64, 0.0))
        .broadcast_to(&Shape::new(lead.to_vec()));
    let mut stride = 1usize;
    for (j, &dim) in inner.iter().enumerate().rev() {
        let comp = idx.slice(-1, j as i64, j as i64 + 1, 1).reshape(lead.to_vec());
        let comp = b.select(comp.lt(0.0), comp + dim as f64, comp);
        flat = flat + comp * stride as f64;
        stride *= dim;
    }
    if bd > 0 {
        let mut batch_flat = b
            .constant(crate::Tensor::scalar(DType::I64, 0.0))
            .broadcast_to(&Shape::new(lead.to_vec()));
        let mut s = 1usize;
        for (j, &dim) in batch.iter().enumerate().rev() {
            batch_flat = batch_flat + b.iota(DType::I64, lead.to_vec(), j as i64) * s as f64;
            s *= dim;
        }
        flat = flat + batch_flat * inner_total as f64;
    }
    let batch_total: usize = batch.iter().product();
    let mut flat_shape = vec![batch_total * inner_total];
    flat_shape.extend_from_slice(tail);
    let gathered = data.reshape(flat_shape).gather(flat, 0);
    Ok(vec![gathered])
}
